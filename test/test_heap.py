"""A process that loads a policy keeps its freed heap pages for the next inference (omni_ros/heap.py), unless the
user tuned glibc's allocator or turned it off. What the faults cost is measured in bench/heap_faults.py; here the
mechanism, counted in page faults (getrusage), each case in a fresh process, since the allocator's settings are
the process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "reference" / "pi0_1cam"

# In a worker thread, as the node infers: what an inference's activations do, buffers of a few MB made, used and
# freed call after call. Prints the minor faults of the last 20 rounds (after 5 that may grow the heap).
LOOP = """
import json, resource, threading
import torch
faults = []
def rounds():
    for i in range(25):
        if i == 5:
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
        a = torch.ones(534, 2048)
        b = torch.nn.functional.gelu(a) * a
        c = torch.ones(51, 4096)
        del a, b, c
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
thread = threading.Thread(target=rounds)
thread.start()
thread.join()
print(json.dumps({"faults": faults[1] - faults[0], "kept": KEPT}))
"""

LOAD_POLICY = f"import omni_ros.heap, omni_ros.policy\nomni_ros.policy.load({str(FIXTURE)!r})\n"
KEPT = "omni_ros.heap.keep_freed_heap()"
# 20 rounds touch 20 x 9.6 MB of buffers: ~47,000 fresh pages if each round's were new. The rounds' buffers
# reused, a handful of faults remain (the interpreter's own small allocations); the bound leaves room for them.
FEW_FAULTS = 200


def _run(setup: str, env_update: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "OMNI_ROS_KEEP_FREED_HEAP"}
    env.update(env_update)
    code = setup + LOOP.replace("KEPT", KEPT)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_process_serving_a_policy_keeps_freed_pages_for_the_next_inference():
    kept = _run(LOAD_POLICY, {})
    assert kept["kept"] is True
    assert kept["faults"] < FEW_FAULTS, kept
    # The same process with glibc's defaults faults on those pages again and again: what the setting removes.
    defaults = _run(LOAD_POLICY, {"OMNI_ROS_KEEP_FREED_HEAP": "0"})
    assert defaults["kept"] is False
    assert defaults["faults"] > 5 * FEW_FAULTS, defaults


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_an_allocator_the_user_tuned_is_left_alone():
    tuned = _run("import omni_ros.heap\n", {"MALLOC_TRIM_THRESHOLD_": "131072"})
    assert tuned["kept"] is False
    tunables = _run("import omni_ros.heap\n", {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"})
    assert tunables["kept"] is False
