"""The HTP half of `--target qnn-onnx`: rewrite, QDQ-quantize, calibrate and compile each float ONNX graph.

    8a8w    uint8 activations, uint8 weights: the smallest and fastest on the HTP, coarse for attention
    16a8w   uint16 activations, uint8 weights (default): what Qualcomm recommends for transformers
    fp16    no quantization: the float graph runs in fp16 on the HTP (V73 and later)

Activation ranges come from running the eager model's stages on calibration observations (each stage on what the
stage before it produced, `omni_ros.export.qnn.calibration_inputs`), fed to ONNX Runtime's static quantizer with
the QNN EP's QDQ configuration. Each graph is then compiled for the target SoC into the export's HTP cache, with CPU
fallback disabled: an export that succeeds runs wholly on the HTP.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from omni_ros.export.calibration import calibration_observations, observation_inputs, resolve_source
from omni_ros.export.htp_rewrite import HTP_MASK_VALUE, prepare_for_htp
from omni_ros.export.ort_session import HtpCache, HtpTarget, context_file, qnn_version
from omni_ros.export.qnn import PRECISIONS, SOC_HTP_ARCH, SOC_MODEL, QnnOptions, calibration_inputs
from omni_ros.export.sidecar import file_sha256
from omni_ros.policy.families import signatures

log = logging.getLogger(__name__)


class _Rows:
    """ONNX Runtime's CalibrationDataReader over a list of feed dicts."""

    def __init__(self, rows: list[dict[str, np.ndarray]]) -> None:
        self.rows, self.i = rows, 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.i >= len(self.rows):
            return None
        self.i += 1
        return self.rows[self.i - 1]

    def rewind(self) -> None:
        self.i = 0


@contextlib.contextmanager
def _quiet_quantizer():
    # The quantizer logs advice on the root logger ("consider pre-processing", opset notes) that we follow already.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def quantize_qdq(source: Path, out: Path, rows: list[dict[str, np.ndarray]], precision: str) -> float:
    """QDQ-quantize `source` into `out` for the HTP, calibrated on `rows`; returns the seconds it took."""
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model

    activation = {"8a8w": QuantType.QUInt8, "16a8w": QuantType.QUInt16}[precision]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, _quiet_quantizer():
        # Fuses what the QNN EP runs as one op (e.g. the erf form of GELU, MatMul + Add) before ranges are measured.
        pre = Path(tmp) / "preprocessed.onnx"
        model = pre if qnn_preprocess_model(str(source), str(pre)) else source
        config = get_qnn_qdq_config(str(model), _Rows(rows), activation_type=activation, weight_type=QuantType.QUInt8)
        quantize(str(model), str(out), config)
    return time.perf_counter() - start


def _feeds(method: str, cfg, graph: Path, batches) -> list[dict[str, np.ndarray]]:
    names = {i.name for i in onnx.load(graph, load_external_data=False).graph.input}
    specs = signatures(cfg)[method].inputs
    return [{s.name: x.numpy() for s, x in zip(specs, batch, strict=True) if s.name in names} for batch in batches]


def build_htp_graphs(
    model,
    fp_dir: Path,
    out: Path,
    methods,
    qnn: QnnOptions,
    calibration: str,
    tokenizer,
    norm_stats,
    timings: dict[str, float],
    report: dict[str, Any],
) -> dict[str, Any]:
    """Float graphs in `fp_dir` -> HTP graphs `out/<method>.onnx`, compiled into `out`'s HTP cache.

    Fills `timings` and `report` per method; returns the target options the sidecar records.
    """
    htp = HtpTarget.from_options(qnn)
    quantized = PRECISIONS[qnn.precision] is not None
    cfg = model.cfg
    batches: dict[str, Any] = {}  # per method, when quantized
    if quantized:
        start = time.perf_counter()
        calibration, why = resolve_source(calibration, cfg)
        if why:
            log.warning("export %s: %s (--calibration DATASET_DIR for recorded data)", out, why)
        log.info("export %s: calibrating on %d observations (%s)", out, qnn.calibration_samples, calibration)
        observations = calibration_observations(calibration, cfg, qnn.calibration_samples, norm_stats=norm_stats)
        if tokenizer is None:
            from omni_ros.policy.tokenizer import make_tokenizer

            tokenizer = make_tokenizer(cfg.tokenizer)
        inputs = observation_inputs(cfg, tokenizer, norm_stats, observations)
        batches = calibration_inputs(model.float().eval(), methods, qnn.calibration_samples, inputs=inputs)
        timings["calibration_s"] = time.perf_counter() - start
    cache = HtpCache(out, htp)
    rewrites: dict[str, int] = {}
    for method in methods:
        source, final = fp_dir / f"{method}.onnx", out / f"{method}.onnx"
        # The fp16 graph is the rewritten float graph itself; a quantized one is made from it.
        prepared = source if quantized else final
        counts = prepare_for_htp(source, prepared)
        for key, n in counts.items():
            rewrites[key] = rewrites.get(key, 0) + n
        if quantized:
            log.info("export %s: quantizing %s (%s)", out, method, qnn.precision)
            rows = _feeds(method, cfg, prepared, batches[method])
            timings[f"quantize_{method}_s"] = quantize_qdq(prepared, final, rows, qnn.precision)
        log.info("export %s: compiling %s for the HTP of %s", out, method, qnn.soc)
        entry = cache.compile(method, final, file_sha256(final))
        timings[f"compile_{method}_s"] = entry["compile_s"]
        report[method] = {"placement": placement_of(out / context_file(method)), "rewrites": counts}
    return {
        "soc": qnn.soc,
        "soc_model": SOC_MODEL[qnn.soc],
        "htp_arch": SOC_HTP_ARCH[qnn.soc],
        "backend": "HTP",
        "precision": qnn.precision,
        "quantization": "none (fp16 HTP)" if not quantized else f"QDQ {qnn.precision} (onnxruntime.quantization)",
        "calibration": calibration if quantized else None,
        "calibration_samples": qnn.calibration_samples if quantized else 0,
        "mask_value": HTP_MASK_VALUE,
        "rewrites": rewrites,
        "compiled_with": {"onnxruntime-qnn": qnn_version()},
    }


def placement_of(compiled: Path) -> dict[str, Any]:
    """QNN partitions (EPContext nodes) and the operators left outside them in a compiled graph."""
    graph = onnx.load(compiled, load_external_data=False).graph
    ops: dict[str, int] = {}
    for node in graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return {"qnn_partitions": ops.pop("EPContext", 0), "cpu_ops": ops}
