"""Dataset exports in a fresh process, for the tests that encode video.

The SVT-AV1 encoder has broken mid-export and then hung a long-lived pytest worker (two of four CI runs; closing
note of 2026-12-05), and an export stuck inside a C call is out of reach of any timeout in that process: under
pytest-xdist it held the whole run until CI's cap. So an export that encodes runs in a spawned child, as
`omni-ros dataset export` runs in its own process, and a child that overruns is killed and fails its test.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from omni_ros.dataset.export import export_dataset

# Below pytest.ini's per-test timeout (300 s), so an overrun fails the test that started it with this message.
TIMEOUT_S = 240


def export_in_child(*args: Any, timeout_s: float = TIMEOUT_S, **kwargs: Any) -> Any:
    """`export_dataset(*args, **kwargs)` in a spawned process: its summary, or its exception raised here."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # leaving the block terminates the child
        job = pool.apply_async(export_dataset, args, kwargs)
        try:
            return job.get(timeout_s)
        except multiprocessing.TimeoutError:
            message = f"the dataset export did not finish in {timeout_s:g} s; its process was killed"
            raise AssertionError(message) from None
