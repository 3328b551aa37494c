"""Faster ExecuTorch lowering: torch's list of composite ops collected once per lowering, not once per method.

`to_edge_transform_and_lower` decomposes every method several times, and each decomposition asks torch for
every CompositeImplicitAutograd op it may keep (`torch._export.utils._collect_all_valid_cia_ops`): a walk over
the whole dispatcher, about 0.25 s a call, which torch does not cache because a custom-op library loaded later
could add to it. Nothing loads one in the middle of a lowering, so inside `cia_ops_collected_once()` the walk is
done once: a program of many methods (the per-linear int8 XNNPACK kernels, an export's staged methods) lowers
in less time, and the programs are the same (the export tests compare them with eager).

Where torch's private names move, the context does nothing: lowering is then only slower, never different.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

NAME = "_collect_all_valid_cia_ops"


def _importers() -> tuple[ModuleType, list[ModuleType]]:
    import torch._export.utils as utils
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    original = getattr(utils, NAME, None)
    users = [m for m in (exported_program, decomp_utils) if original is not None and getattr(m, NAME, None) is original]
    return utils, users


@contextmanager
def cia_ops_collected_once() -> Iterator[None]:
    utils, users = _importers()
    if not users:
        yield
        return
    original = getattr(utils, NAME)
    cached = functools.lru_cache(maxsize=1)(original)
    for module in users:
        setattr(module, NAME, cached)
    try:
        yield
    finally:
        for module in users:
            setattr(module, NAME, original)
