"""Exported tiny policies (`.pte` files, ONNX folders) shared by the export tests of one pytest session.

Lowering, tracing and quantizing are the slow part: each variant is exported once per session, on first use.
"""

from __future__ import annotations

import threading
from pathlib import Path

_lock = threading.Lock()

# tiny shaped for the simulated arm (cameras base + wrist, 3 joints), so one program serves every test.
ARM = {"state_dim": 3, "action_dim": 3}
STAGED = ("encode_images", "prefill", "denoise_step")
# name -> export_preset keyword arguments. Staged methods only where the fused loop is not under test.
VARIANTS = {
    "fp32": {**ARM, "quantize": "none"},
    "int8": {**ARM, "quantize": "int8-dynamic", "methods": STAGED},
    # ONNX folders: float32 for ONNX Runtime; int16-activation QDQ for Qualcomm's HTP (calibrated on the simulator,
    # compiled for the default SoC).
    "onnx": {**ARM, "target": "onnx"},
    "qnn16": {**ARM, "target": "qnn-onnx", "methods": STAGED, "calibration": "sim"},
}


def exported_tiny(base: Path, variant: str) -> Path:
    """Path of the tiny preset (weights seed 0) exported as `variant`, exported once per session."""
    import torch

    from omni_ros.export.exporter import export_preset

    kwargs = dict(VARIANTS[variant])
    onnx = kwargs.get("target") in ("onnx", "qnn-onnx")
    out = base / "pte" / (f"tiny_{variant}" if onnx else f"tiny_{variant}.pte")
    done = out / "omni_ros.json" if onnx else out
    if kwargs.get("target") == "qnn-onnx":
        from omni_ros.export.qnn import QnnOptions

        kwargs["qnn"] = QnnOptions(precision="16a8w", calibration_samples=8)
    with _lock:
        if not done.exists():
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                export_preset("tiny", out, **kwargs)
            finally:
                torch.set_num_threads(threads)
    return out
