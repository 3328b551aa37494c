"""Policy -> a folder of ONNX graphs (one per method, static shapes) plus its sidecar, for ONNX Runtime.

    omni-ros export --target onnx --out policy_onnx/       CPU / CUDA / TensorRT: float32 graphs
    omni-ros export --target qnn-onnx --out policy_htp/    Qualcomm HTP: QDQ-quantized graphs, compiled for one SoC

    policy_onnx/
      encode_images.onnx  prefill.onnx  denoise_step.onnx  sample.onnx     the method modules of export/methods.py
      omni_ros.json                                                        sidecar (format omni_ros.onnx.v1)
      encode_images.qnn_ctx.onnx ... qnn_cache.json                        qnn-onnx: the compiled HTP graphs

The graphs are the same `nn.Module`s, signatures and export-friendly forms the `.pte` export uses, traced by
`torch.onnx.export` (the torch.export-based exporter), so every family providing those stages exports. For the
HTP the float graph is then rewritten where the HTP needs it (`prepare_for_htp`) and quantized with ONNX Runtime's
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

import numpy as np
import torch
from torch import nn

from omni_ros.export.methods import method_module, signatures, stage_plan
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
from omni_ros.policy.normalize import NormStats

ONNX_TARGETS = ("onnx", "qnn-onnx")
# 21: the first opset with 16-bit QuantizeLinear/DequantizeLinear, which int16 activations for the HTP need.
OPSET = 21
# Attention masks are additive biases of -1e30 (or -inf) in the float graph. Quantized, such a value stretches the
# range of the scores it is added to until every real score rounds to the same level, and in fp16 it is -inf. A
# bias of -100 still gives exp(-100) ~ 4e-44 to a masked key, and keeps the scores' range a few hundred at most.
HTP_MASK_VALUE = -100.0
MASK_SENTINEL = -1e9
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
    with _quiet(), torch.no_grad():
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


def prepare_for_htp(path: Path, out: Path) -> dict[str, int]:
    """Rewrite a float graph where the HTP needs it; returns how many of each rewrite were made.

    - Reciprocal(x) -> Div(1, x): the HTP's quantized Reciprocal is far less accurate than its Div (measured on the
      emulator: a QDQ ViT block 0.2 away from the CPU EP with Reciprocal, 2.5e-3 with Div).
    - mask sentinels (constants <= -1e9, -inf) -> HTP_MASK_VALUE (see there).
    - Transpose(p) followed by its inverse Transpose -> neither. SmolVLA's prefill splits the heads of a K / V
      projection (a transpose for the backbone's attention) and merges them again for the expert's cross-attention
      re-projection; quantized, the QNN EP's layout pass leaves such a pair as a bare Transpose on quantized data
      that it cannot place, and the graph falls apart into CPU islands.
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(path)
    counts = {"reciprocal_to_div": 0, "mask_constants": 0}
    counts["inverse_transposes"] = _cancel_inverse_transposes(model.graph)
    one = "omni_ros_one"
    nodes = []
    for node in model.graph.node:
        if node.op_type == "Reciprocal":
            nodes.append(helper.make_node("Div", [one, node.input[0]], list(node.output), name=node.name))
            counts["reciprocal_to_div"] += 1
            continue
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value" and _is_mask_sentinel(numpy_helper.to_array(attr.t)):
                    value = numpy_helper.to_array(attr.t)
                    attr.t.CopyFrom(numpy_helper.from_array(np.full_like(value, HTP_MASK_VALUE), attr.t.name))
                    counts["mask_constants"] += 1
        nodes.append(node)
    for init in model.graph.initializer:
        value = numpy_helper.to_array(init)
        if _is_mask_sentinel(value):
            init.CopyFrom(numpy_helper.from_array(np.full_like(value, HTP_MASK_VALUE), init.name))
            counts["mask_constants"] += 1
    if counts["reciprocal_to_div"]:
        model.graph.initializer.append(numpy_helper.from_array(np.array(1.0, dtype=np.float32), one))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    large = model.ByteSize() > 1.8e9
    onnx.save(model, out, save_as_external_data=large, location=f"{out.name}.data" if large else None)
    return counts


def _cancel_inverse_transposes(graph) -> int:
    """Remove every Transpose that undoes the Transpose feeding it (its readers read the first one's input);
    returns how many pairs were cancelled. The first Transpose stays while something else reads it."""
    from onnx import helper

    producer = {out: node for node in graph.node for out in node.output}
    outputs = {o.name for o in graph.output}

    def perm(node) -> list[int] | None:
        return next((list(helper.get_attribute_value(a)) for a in node.attribute if a.name == "perm"), None)

    renamed: dict[str, str] = {}
    dropped = set()
    for node in graph.node:
        first = producer.get(node.input[0]) if node.op_type == "Transpose" else None
        if first is None or first.op_type != "Transpose" or node.output[0] in outputs:
            continue
        p1, p2 = perm(first), perm(node)
        if p1 is None or p2 is None or [p1[i] for i in p2] != list(range(len(p2))):
            continue
        renamed[node.output[0]] = first.input[0]
        dropped.add(id(node))
    if not renamed:
        return 0
    kept = [n for n in graph.node if id(n) not in dropped]
    for node in kept:
        for i, name in enumerate(node.input):
            node.input[i] = renamed.get(name, name)
    read = {name for node in kept for name in node.input} | outputs
    kept = [n for n in kept if n.op_type != "Transpose" or any(o in read for o in n.output)]
    del graph.node[:]
    graph.node.extend(kept)
    return len(renamed)


def _is_mask_sentinel(value: np.ndarray) -> bool:
    return value.dtype.kind == "f" and 0 < value.size <= 16 and bool(np.all(value <= MASK_SENTINEL))


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
    calibration: str = "sim",
    tokenizer=None,
) -> tuple[Sidecar, dict[str, float]]:
    """Write the export folder `out` for `target` (onnx or qnn-onnx); returns its sidecar and the timings.

    `model` is the caller's float model (it is copied); `tokenizer` turns calibration prompts into tokens.
    """
    import copy

    from omni_ros.export.forms import use_export_forms

    if target not in ONNX_TARGETS:
        raise ValueError(f"not an ONNX target: {target}")
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
