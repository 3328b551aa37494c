"""XNNPACK's int8 GEMMs from eager: every int8 linear of a model as one method of an ExecuTorch program.

Where XNNPACK's int8-dynamic kernels beat oneDNN (CPUs with VNNI but no AMX, Arm: see choice.py), the eager
model keeps its attention, norms and glue in torch and hands each linear's rows to an XNNPACK method (int8
weights per output channel, int8 activations per token, the same recipe `omni-ros export --quantize
int8-dynamic` uses), so nobody has to run `omni-ros export` to get the speed. The methods live in one `.pte`
built on the first load for this checkpoint and CPU and cached (kernel_cache.py); later loads only read it.

Each method takes up to `ROWS` rows (its memory is planned for that bound: a method per linear, each planned
for a vision tower's 1024 rows, would hold gigabytes); longer inputs go through it in slices.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omni_ros.cpu_features import CpuFeatures
from omni_ros.policy.precision.int8_linear import Int8Linear
from omni_ros.policy.precision.kernel_cache import CacheEntry, tensors_hash

logger = logging.getLogger("omni_ros.policy")
ROWS = 128
PROGRAM = "linears.pte"


class _One(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("torch", "executorch", "torchao"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "unknown"
    return out


def _write_program(linears: dict[str, nn.Linear], folder: Path) -> dict[str, Any]:
    """Quantize, export and lower every linear as method `linear_<i>` of one program in `folder`."""
    import copy

    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from omni_ros.lowering import cia_ops_collected_once
    from omni_ros.policy.quantize import quantize_model

    start = time.perf_counter()
    programs = {}
    rows = torch.export.Dim("rows", min=1, max=ROWS)
    for i, linear in enumerate(linears.values()):
        one = quantize_model(_One(copy.deepcopy(linear).float()).eval(), "int8-dynamic")
        example = (torch.randn(min(8, ROWS), linear.in_features),)
        with torch.no_grad():
            programs[f"linear_{i}"] = torch.export.export(one, example, dynamic_shapes=({0: rows},))
        if (i + 1) % 50 == 0:
            logger.info("int8 xnnpack kernels: traced %d / %d linears", i + 1, len(linears))
    logger.info("int8 xnnpack kernels: lowering %d methods to XNNPACK (once per checkpoint and CPU)", len(programs))
    with cia_ops_collected_once():
        edge = to_edge_transform_and_lower(programs, partitioner=[XnnpackPartitioner()])
    (folder / PROGRAM).write_bytes(edge.to_executorch().buffer)
    return {
        "methods": {f"linear_{i}": name for i, name in enumerate(linears)},
        "rows": ROWS,
        "versions": _versions(),
        "build_seconds": round(time.perf_counter() - start, 1),
    }


def attach_xnnpack(
    layers: dict[str, tuple[nn.Linear, Int8Linear]],
    *,
    cache_root: Path,
    label: str,
    cpu: CpuFeatures,
    num_threads: int = 0,
) -> Path:
    """Give every `Int8Linear` its XNNPACK method (built and cached on first use); returns the cache folder.

    `layers`: module name -> (the float linear it came from, its int8 replacement).
    """
    from executorch.runtime import Runtime

    linears = {name: float_linear for name, (float_linear, _) in layers.items()}
    tensors = ((f"{n}.{p}", t) for n, m in linears.items() for p, t in m.named_parameters())
    weights = tensors_hash(tensors, {"rows": ROWS, "recipe": "int8-dynamic", "versions": _versions()})
    entry = CacheEntry(cache_root, label, weights, cpu)
    manifest = entry.load()
    if manifest is None:
        logger.info("int8 xnnpack kernels: building %s (%d linears)", entry.folder, len(linears))
        manifest = entry.build(lambda tmp: _write_program(linears, tmp))
        logger.info("int8 xnnpack kernels: built in %.0f s", manifest["build_seconds"])
    if num_threads > 0:
        from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

        _unsafe_reset_threadpool(num_threads)
    program = Runtime.get().load_program(entry.folder / PROGRAM)
    by_name = {name: method for method, name in manifest["methods"].items()}
    lock = threading.Lock()
    for name, (_, layer) in layers.items():
        layer.program = program.load_method(by_name[name])
        layer.program_rows, layer.program_owner, layer.program_lock = int(manifest["rows"]), program, lock
        layer.kernel = "xnnpack"
    return entry.folder
