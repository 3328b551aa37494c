"""XNNPACK's int8 GEMMs from eager: every int8 linear of a model as one method of an ExecuTorch program.

Where XNNPACK's int8-dynamic kernels beat oneDNN (CPUs with VNNI but no AMX, Arm: see choice.py), the eager
model keeps its attention, norms and glue in torch and hands each linear's rows to an XNNPACK method (int8
weights per output channel, int8 activations per token, the same recipe `omni-ros export --quantize
int8-dynamic` uses), so nobody has to run `omni-ros export` to get the speed. The methods live in one `.pte`
built on the first load for this checkpoint and CPU and cached (kernel_cache.py); later loads only read it.

Linears that read the same tensor (q / k / v, gate / up: the modules declare them in `shared_input_linears`)
are one method over their stacked weights: one lowering instead of three (about 3 s each on a Xeon, whatever the
linear's size: the build is per method), one activation quantization and one call per input instead of one per
projection. Per output channel weights and per token activations make the stacked product the members' own
numbers. Each member slices its columns from the group's output, which is kept for the very input tensor that
produced it (as SharedInput does), so a member called with another tensor runs the method again: never wrong.

A module's whole MLP (first, up, down and the activation between them) is one method too, where the module
declares its linears (xnnpack_mlp.py): the hidden activation never leaves XNNPACK.

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
from omni_ros.package_versions import package_versions
from omni_ros.policy.precision.int8_linear import Int8Linear
from omni_ros.policy.precision.kernel_cache import CacheEntry, tensors_hash
from omni_ros.policy.precision.xnnpack_mlp import MlpSpec, float_mlp

logger = logging.getLogger("omni_ros.policy")
ROWS = 128
PROGRAM = "linears.pte"


class _One(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def stacked(linears: list[nn.Linear]) -> nn.Linear:
    """One linear whose output is the members' outputs side by side (float32 copies of their weights)."""
    if len(linears) == 1:
        return linears[0]
    bias = any(lin.bias is not None for lin in linears)
    out = nn.Linear(linears[0].in_features, sum(lin.out_features for lin in linears), bias=bias)
    with torch.no_grad():
        out.weight.copy_(torch.cat([lin.weight.detach().float() for lin in linears]))
        if bias:
            out.bias.copy_(torch.cat([
                lin.bias.detach().float() if lin.bias is not None else torch.zeros(lin.out_features)
                for lin in linears
            ]))  # fmt: skip
    return out


def groups(model: nn.Module, names: list[str], widths: dict[str, int]) -> list[list[str]]:
    """`names` (linears of `model`) partitioned into the groups that read one input: the siblings a module lists
    together in its `shared_input_linears` (with the same input width), every other linear alone, in order."""
    wanted, grouped = set(names), {}
    for parent_name, module in model.named_modules():
        for members in getattr(module, "shared_input_linears", ()):
            full = [f"{parent_name}.{m}" if parent_name else m for m in members]
            present = [n for n in full if n in wanted]
            if len(present) > 1 and len({widths[n] for n in present}) == 1:
                for n in present:
                    grouped[n] = present
    out, seen = [], set()
    for name in names:
        group = grouped.get(name, [name])
        if group[0] not in seen:
            seen.add(group[0])
            out.append(group)
    return out


class XnnpackSlice:
    """One member's columns of a group method's output."""

    def __init__(self, group: XnnpackGroup, start: int, stop: int) -> None:
        self.group, self.start, self.stop = group, start, stop

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.output(x)[:, self.start : self.stop]


class XnnpackGroup:
    """An ExecuTorch method computing the stacked linears of one group, for up to `rows` rows a call.

    The last output of a model's groups is kept (one per thread for the whole model, in `recent`: a group's
    members are called one after another, and one slot per group would hold an activation per group), for the
    input tensor that produced it: the tensor itself, unmodified (its `_version` where it has one)."""

    def __init__(self, method: Any, owner: Any, lock: threading.Lock, rows: int, recent: threading.local) -> None:
        self.method, self.owner, self.lock, self.rows, self.recent = method, owner, lock, rows, recent

    def output(self, x: torch.Tensor) -> torch.Tensor:
        last = getattr(self.recent, "last", None)
        version = -1 if x.is_inference() else x._version
        if last is not None and last[0] is self and last[1] is x and last[2] == version:
            return last[3]
        rows = x.reshape(-1, x.shape[-1]).float()
        with self.lock:  # an ExecuTorch method is not reentrant
            out = self.method.execute([rows.contiguous()])[0] if rows.shape[0] <= self.rows else self._sliced(rows)
        self.recent.last = (self, x, version, out)
        return out

    def _sliced(self, rows: torch.Tensor) -> torch.Tensor:
        """More rows than the method takes, a slice at a time. Each slice's output is read where the method left
        it (its planned memory, valid until its next call) and copied once into the whole output: cloning each
        and concatenating copied every vision tower activation twice (about 50 ms of a full-size SmolVLA's
        chunk on the AMD EPYC, scratch)."""
        out: torch.Tensor | None = None
        for i in range(0, rows.shape[0], self.rows):
            part = self.method._method([rows[i : i + self.rows].contiguous()], clone_outputs=False)[0]
            if out is None:
                out = torch.empty((rows.shape[0], part.shape[1]), dtype=part.dtype)
            out[i : i + part.shape[0]].copy_(part)
        assert out is not None  # rows.shape[0] > self.rows >= 1
        return out


def _versions() -> dict[str, str]:
    return package_versions(("torch", "executorch", "torchao"))


def _write_program(
    linears: dict[str, nn.Linear], folder: Path, grouping: list[list[str]], mlps: list[MlpSpec] | None = None
) -> dict[str, Any]:
    """The program of `lower_program`, lowered in a process of its own (xnnpack_build.py says why)."""
    from omni_ros.policy.precision.xnnpack_build import build_in_subprocess

    return build_in_subprocess(linears, folder, grouping, mlps or [])


def lower_program(
    linears: dict[str, nn.Linear], folder: Path, grouping: list[list[str]], mlps: list[MlpSpec] | None = None
) -> dict[str, Any]:
    """Quantize, export and lower every group of linears as method `linear_<i>`, and every MLP as method
    `mlp_<j>`, of one program in `folder`."""
    import copy

    from omni_ros.lowering import lower_to_xnnpack, provenance_shared
    from omni_ros.policy.quantize import quantize_model

    start = time.perf_counter()
    mlps = mlps or []
    modules: dict[str, tuple[nn.Module, int]] = {}
    for i, members in enumerate(grouping):
        linear = stacked([copy.deepcopy(linears[name]).float() for name in members])
        modules[f"linear_{i}"] = (_One(linear), linear.in_features)
    for j, spec in enumerate(mlps):
        copies = {name: copy.deepcopy(linears[name]).float() for name in spec.linears}
        modules[f"mlp_{j}"] = (float_mlp(spec, copies), copies[spec.first].in_features)
    programs = {}
    rows = torch.export.Dim("rows", min=1, max=ROWS)
    with provenance_shared():
        for i, (method, (module, width)) in enumerate(modules.items()):
            one = quantize_model(module.eval(), "int8-dynamic")
            example = (torch.randn(min(8, ROWS), width),)
            with torch.no_grad():
                programs[method] = torch.export.export(one, example, dynamic_shapes=({0: rows},))
            if (i + 1) % 50 == 0:
                logger.info("int8 xnnpack kernels: traced %d / %d methods", i + 1, len(modules))
        logger.info("int8 xnnpack kernels: lowering %d methods to XNNPACK (once per checkpoint and CPU)", len(programs))
        (folder / PROGRAM).write_bytes(lower_to_xnnpack(programs).to_executorch().buffer)
    return {
        "methods": {f"linear_{i}": members for i, members in enumerate(grouping)},
        "mlps": {f"mlp_{j}": spec.owner for j, spec in enumerate(mlps)},
        "rows": ROWS,
        "versions": _versions(),
        "build_seconds": round(time.perf_counter() - start, 1),
    }


def attach_xnnpack(
    layers: dict[str, tuple[nn.Linear, Int8Linear]],
    *,
    grouping: list[list[str]] | None = None,
    mlps: list[MlpSpec] | None = None,
    cache_root: Path,
    label: str,
    cpu: CpuFeatures,
    num_threads: int = 0,
    source: str | None = None,
) -> Path:
    """Give every `Int8Linear` its XNNPACK method (built and cached on first use); returns the cache folder.

    `layers`: module name -> (the float linear it came from, its int8 replacement); `grouping`: the names in
    groups that read one input (groups(); default: each alone) of the linears outside `mlps`, whose MLPs are one
    method each (the first linear's `xnnpack_mlp`, which the MLP kernel runs: xnnpack_mlp.py).
    """
    from executorch.runtime import Runtime

    linears = {name: float_linear for name, (float_linear, _) in layers.items()}
    mlps = mlps or []
    in_mlps = {name for spec in mlps for name in spec.linears}
    grouping = grouping or [[name] for name in linears if name not in in_mlps]
    tensors = ((f"{n}.{p}", t) for n, m in linears.items() for p, t in m.named_parameters())
    meta = {
        "rows": ROWS,
        "recipe": "int8-dynamic",
        "versions": _versions(),
        "groups": grouping,
        "mlps": [[spec.owner, *spec.linears, spec.activation] for spec in mlps],
    }
    weights = tensors_hash(tensors, meta)
    entry = CacheEntry(cache_root, label, weights, cpu, source=source, variant="int8-dynamic linears")
    manifest = entry.load()
    if manifest is None:
        # A warning, so that it shows at every log level: a first load pauses for minutes (163 s for the edge pi0).
        logger.warning(
            "int8 xnnpack kernels: building %s (%d linears in %d methods) on the first load on this CPU (a minute or "
            "more; progress with -v); later loads read them",
            entry.folder,
            len(linears),
            len(grouping) + len(mlps),
        )
        manifest = entry.build(lambda tmp: _write_program(linears, tmp, grouping, mlps))
        logger.info("int8 xnnpack kernels: built in %.0f s", manifest["build_seconds"])
    if num_threads > 0:
        from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

        _unsafe_reset_threadpool(num_threads)
    program = Runtime.get().load_program(entry.folder / PROGRAM)
    lock, recent = threading.Lock(), threading.local()
    rows = int(manifest["rows"])
    for method, members in manifest["methods"].items():
        group = XnnpackGroup(program.load_method(method), program, lock, rows, recent)
        start = 0
        for name in members:
            layer = layers[name][1]
            layer.xnnpack = XnnpackSlice(group, start, start + layer.out_features)
            layer.kernel = "xnnpack"
            start += layer.out_features
    owners = {spec.owner: spec for spec in mlps}
    for method, owner in manifest.get("mlps", {}).items():
        spec = owners[owner]
        group = XnnpackGroup(program.load_method(method), program, lock, rows, recent)
        layers[spec.first][1].xnnpack_mlp = group.output
        for name in spec.linears:
            layers[name][1].kernel = "xnnpack (mlp)"
    return entry.folder
