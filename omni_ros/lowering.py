"""Faster ExecuTorch lowering, the same programs: two of torch's costs that grow with what is lowered.

The export paths (`omni-ros export`, the int8 program and the per-linear kernels built on first load) use both.

Composite ops, collected once per lowering, not once per method (`cia_ops_collected_once`):
`to_edge_transform_and_lower` decomposes every method several times, and each decomposition asks torch for
every CompositeImplicitAutograd op it may keep (`torch._export.utils._collect_all_valid_cia_ops`): a walk over
the whole dispatcher, about 0.25 s a call, which torch does not cache because a custom-op library loaded later
could add to it. Nothing loads one in the middle of a lowering, so inside `cia_ops_collected_once()` the walk is
done once: a program of many methods (the per-linear int8 XNNPACK kernels, an export's staged methods) lowers
in less time, and the programs are the same (the export tests compare them with eager). Only around the lowering:
around torch.export of a torchao-quantized model too, the cached list missed what tracing it adds, and
XNNPACK's ConvertToLinearPass failed on the program.

Provenance shared, not copied (`provenance_shared`): torch.fx records where each node came from (`NodeSource`,
`node.meta["from_node"]`), and every node a pass creates deep-copies its source's whole record, which holds the
records of every pass before: the copies grow with the passes run so far (ExecuTorch runs dozens: its edge passes,
then about twenty per XNNPACK partition). A record is never changed after it is built (torch, ExecuTorch and
torchao only read them), so inside the context a deep copy of one returns the record itself: the same `.pte`, byte
for byte, in 0.86x the time for the tiny preset in float32 and 0.94-0.97x for int8 programs (`bench/lowering.py`,
bench/results/lowering.json).

Where torch's private names move, the contexts do nothing: lowering is then only slower, never different.

The tanh GELU written out (`write_out_tanh_gelu`): XNNPACK's GELU is the exact one, and its partitioner takes
`aten.gelu(approximate="tanh")` all the same. The models' export forms avoid that op (layers.gelu), but a graph
traced with autograd on (a guided RTC step, export/rtc_step.py) holds it: X-VLA's head, whose MLPs use the tanh
GELU, computed its guided step 9.6e-5 away from the traced graph (portable kernels: 2.7e-7). Every program is
lowered with that op written out in elementary ops, which XNNPACK delegates as they are.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

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


@contextmanager
def provenance_shared() -> Iterator[None]:
    import torch.fx.traceback as fx_traceback

    source = getattr(fx_traceback, "NodeSource", None)
    if source is None or "__deepcopy__" in vars(source):
        yield
        return
    source.__deepcopy__ = _itself
    try:
        yield
    finally:
        del source.__deepcopy__


def _itself(record: object, memo: dict[int, object]) -> object:
    return record


def lower_to_xnnpack(programs: dict[str, Any]) -> Any:
    """`programs` (method -> torch.export program) lowered to XNNPACK, the composite-op walk done once, the tanh
    GELU written out: the EdgeProgramManager (`.to_executorch()` serializes it). Call inside `provenance_shared()`
    with the tracing."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    for program in programs.values():
        write_out_tanh_gelu(program)
    with cia_ops_collected_once():
        return to_edge_transform_and_lower(programs, partitioner=[XnnpackPartitioner()])


def write_out_tanh_gelu(program: Any) -> int:
    """Replace each `aten.gelu(x, approximate="tanh")` of a torch.export program by
    0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), in place; returns how many (module docstring: why)."""
    import torch

    aten = torch.ops.aten
    graph = program.graph_module.graph
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != aten.gelu.default:
            continue
        approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
        if approximate != "tanh":
            continue
        x = node.args[0]

        def op(target: Any, *args: Any, like: Any = node) -> Any:
            new = graph.call_function(target, args)
            new.meta = dict(like.meta)  # elementwise: the GELU's shape and dtype
            return new

        with graph.inserting_before(node):
            cube = op(aten.mul.Tensor, op(aten.mul.Tensor, x, x), x)
            inner = op(aten.add.Tensor, x, op(aten.mul.Tensor, cube, 0.044715))
            tanh = op(aten.tanh.default, op(aten.mul.Tensor, inner, math.sqrt(2.0 / math.pi)))
            out = op(aten.mul.Tensor, op(aten.mul.Tensor, x, 0.5), op(aten.add.Tensor, tanh, 1.0))
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        count += 1
    if count:
        program.graph_module.recompile()
    return count
