"""Policy -> a folder of ONNX graphs (one per method, static shapes) plus its sidecar, for ONNX Runtime.

    omni-ros export --target onnx --out policy_onnx/       CPU / CUDA / TensorRT: float32 graphs
    omni-ros export --target qnn-onnx --out policy_htp/    Qualcomm HTP: QDQ-quantized graphs, compiled for one SoC

    policy_onnx/
      encode_images.onnx  prefill.onnx  denoise_step.onnx  sample.onnx     the family's StagePlan methods
      omni_ros.json                                                        sidecar (format omni_ros.onnx.v1)
      encode_images.qnn_ctx.onnx ... qnn_cache.json                        qnn-onnx: the compiled HTP graphs

The graphs are the same `nn.Module`s, signatures and export-friendly forms the `.pte` export uses, traced by
`torch.onnx.export` (the torch.export-based exporter), so every family providing those stages exports. For the
HTP the float graph is then rewritten where the HTP needs it (`htp_rewrite`) and quantized with ONNX Runtime's
QDQ static quantization, calibrated on observations (`omni_ros.export.calibration`).
"""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omni_ros.export.qnn import QnnOptions
from omni_ros.export.sidecar import (
    ONNX_FORMAT,
    ONNX_PACKAGES,
    ONNX_SIDECAR,
    OnnxModelError,
    Sidecar,
    file_digest,
    runtime_versions,
    write_atomic,
)
from omni_ros.lowering import provenance_shared
from omni_ros.policy.families import method_module, signatures, stage_plan
from omni_ros.policy.normalize import NormStats

ONNX_TARGETS = ("onnx", "qnn-onnx")
# 21: the first opset with 16-bit QuantizeLinear/DequantizeLinear, which int16 activations for the HTP need.
OPSET = 21
log = logging.getLogger(__name__)


def _quiet():
    """torch.onnx prints its progress and registry notes; the export reports its own."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    for name in ("torch.onnx", "torch.onnx._internal.exporter._registration", "onnxscript", "onnx_ir"):
        logger = logging.getLogger(name)
        stack.callback(logger.setLevel, logger.level)
        logger.setLevel(logging.ERROR)
    return stack


def export_method_graph(model: nn.Module, method: str, path: Path, num_steps: int) -> float:
    """Trace `method` of `model` (any family, already in its export forms) to ONNX at `path`; returns the seconds
    it took."""
    cfg: Any = model.cfg
    sig = signatures(cfg)[method]
    start = time.perf_counter()
    with _quiet(), torch.no_grad(), provenance_shared():
        program = torch.onnx.export(
            method_module(model, method, num_steps),
            stage_plan(cfg).example_inputs(sig, cfg),
            dynamo=True,
            opset_version=OPSET,
            input_names=[s.name for s in sig.inputs],
            output_names=[s.name for s in sig.outputs],
            optimize=True,
            verbose=False,
        )
        # One self-contained file while the weights fit protobuf's 2 GB; beyond that, <name>.data beside it.
        large = sum(p.numel() * p.element_size() for p in model.parameters()) > 1.8e9
        assert program is not None  # dynamo=True always returns an ONNXProgram (None is the legacy exporter's)
        program.save(str(path), external_data=large)
    return time.perf_counter() - start


def graph_files(path: Path) -> list[Path]:
    """`path` and the external-data file it may reference."""
    return [p for p in (path, path.with_name(path.name + ".data")) if p.exists()]


def graph_report(path: Path) -> dict[str, Any]:
    """Operators (by type) of one graph, its size, and its inputs and outputs."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    ops = collections.Counter(n.op_type for n in model.graph.node)
    return {
        "nodes": sum(ops.values()),
        "ops": dict(sorted(ops.items())),
        "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        "bytes": sum(p.stat().st_size for p in graph_files(path)),
        "inputs": [i.name for i in model.graph.input],
        "outputs": [o.name for o in model.graph.output],
    }


def export_onnx(
    model: nn.Module,
    norm_stats: NormStats,
    out: str | Path,
    *,
    target: str,
    methods: tuple[str, ...] | list[str],
    num_steps: int,
    name: str,
    tokenizer_file: str | Path | None = None,
    qnn: QnnOptions | None = None,
    calibration: str = "auto",
    tokenizer=None,
) -> tuple[Sidecar, dict[str, float]]:
    """Write the export folder `out` for `target` (onnx or qnn-onnx); returns its sidecar and the timings.

    `model` is the caller's float model (it is copied); `tokenizer` turns calibration prompts into tokens.
    """
    import copy

    from omni_ros.export.forms import use_export_forms

    if target not in ONNX_TARGETS:
        raise ValueError(f"not an ONNX target: {target}")
    family = getattr(model.cfg, "family", "pi0")
    if target == "qnn-onnx" and stage_plan(family).token_decoder is not None:
        # Its calibration (omni_ros.export.calibration) runs the Euler loop of a flow-matching denoiser.
        raise ValueError(f"--target qnn-onnx calibrates a flow-matching denoiser; export a {family} model to onnx")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OnnxModelError(f"--out {out}: an ONNX export is a folder, and this is a file")
    out.mkdir(parents=True, exist_ok=True)
    # A re-export replaces the whole folder's meaning: without the old sidecar and cache nothing stale is trusted.
    for stale in (out / ONNX_SIDECAR, out / "qnn_cache.json", *out.glob("*.qnn_ctx.onnx")):
        stale.unlink(missing_ok=True)
    cfg: Any = model.cfg
    work = use_export_forms(copy.deepcopy(model).float().eval())
    timings: dict[str, float] = {}
    report: dict[str, Any] = {}
    target_options: dict[str, Any] = {"opset": OPSET}
    htp_ready = target == "qnn-onnx"
    fp_dir = out / ".float" if htp_ready else out
    fp_dir.mkdir(exist_ok=True)
    for method in methods:
        log.info("export %s: tracing %s to ONNX", out, method)
        timings[f"export_{method}_s"] = export_method_graph(work, method, fp_dir / f"{method}.onnx", num_steps)
    if htp_ready:
        from omni_ros.export.qnn_onnx import build_htp_graphs

        qnn = qnn or QnnOptions()
        target_options.update(
            build_htp_graphs(model, fp_dir, out, methods, qnn, calibration, tokenizer, norm_stats, timings, report)
        )
        shutil.rmtree(fp_dir)
    files: dict[str, dict[str, Any]] = {}
    for method in methods:
        path = out / f"{method}.onnx"
        report.setdefault(method, {}).update(graph_report(path))
        files.update({p.name: file_digest(p) for p in graph_files(path)})
    tokenizer_name = None
    if tokenizer_file is not None:
        tokenizer_name = f"tokenizer{Path(tokenizer_file).suffix}"
        shutil.copyfile(tokenizer_file, out / tokenizer_name)
    sidecar = Sidecar(
        name=name,
        target=target,
        quantize=(qnn or QnnOptions()).precision if htp_ready else "none",
        model=cfg,
        norm_stats=norm_stats,
        methods={m: signatures(cfg)[m] for m in methods},
        num_steps=num_steps,
        files=files,
        versions=runtime_versions(ONNX_PACKAGES),
        delegation=report,
        tokenizer_file=tokenizer_name,
        target_options=target_options,
        format=ONNX_FORMAT,
    )
    from omni_ros.export.exporter import bundle_fast_tokenizer

    sidecar.model = bundle_fast_tokenizer(cfg, out, "fast_tokenizer")
    import json

    # Written last: a folder with a sidecar is a complete export.
    write_atomic(out / ONNX_SIDECAR, (json.dumps(sidecar.to_dict(), indent=2) + "\n").encode())
    return sidecar, timings


def format_onnx_report(report: dict[str, dict[str, Any]]) -> str:
    """A short table of an ONNX export: nodes per method, and for the HTP where they run."""
    lines = [f"{'method':<14}{'nodes':>7}{'MB':>8}  {'HTP placement':<26}  operators"]
    for method, r in report.items():
        placement = "-"
        if "placement" in r:
            p = r["placement"]
            cpu = ", ".join(f"{k} x{v}" for k, v in p["cpu_ops"].items())
            placement = f"{p['qnn_partitions']} QNN graph(s)" + (f", CPU: {cpu}" if cpu else ", all on HTP")
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(r["ops"].items(), key=lambda kv: -kv[1])[:6])
        lines.append(f"{method:<14}{r['nodes']:>7}{r['bytes'] / 1e6:>8.2f}  {placement:<26}  {ops}, ...")
    return "\n".join(lines)
