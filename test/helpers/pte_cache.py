"""Exported tiny policies (`.pte` files, ONNX folders, the tiny SmolVLA fixture) shared by one session's export tests.

Lowering, tracing and quantizing are the slow part: each variant is exported once per session, on first use.
"""

from __future__ import annotations

import json
import subprocess
import sys
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
# The tiny LeRobot SmolVLA fixture: name -> export_checkpoint keyword arguments. Staged methods only: lowering
# costs about 0.06 s of CPU per graph node whatever the weights, and the fused loop would double the nodes (its
# trace is checked without lowering, test_export_smolvla.py).
SMOLVLA_STAGED = ("encode_image", "prefill", "denoise_step")
SMOLVLA_VARIANTS = {
    "fp32": {"quantize": "none", "methods": SMOLVLA_STAGED},
    # With the guided RTC step: the int8 program `auto` exports for a node under guided RTC.
    "int8": {"quantize": "int8-dynamic", "methods": (*SMOLVLA_STAGED, "guided_step")},
}


def exported_tiny(base: Path, variant: str) -> Path:
    """Path of the tiny preset (weights seed 0) exported as `variant`, exported once per session."""

    from omni_ros.export.exporter import export_preset

    kwargs = dict(VARIANTS[variant])
    onnx = kwargs.get("target") in ("onnx", "qnn-onnx")
    out = base / "pte" / (f"tiny_{variant}" if onnx else f"tiny_{variant}.pte")
    done = out / "omni_ros.json" if onnx else out
    if kwargs.get("target") == "qnn-onnx":
        from omni_ros.export.qnn import QnnOptions

        kwargs["qnn"] = QnnOptions(precision="16a8w", calibration_samples=8)
    _once(done, lambda: export_preset("tiny", out, **kwargs))
    return out


def exported_smolvla(base: Path, checkpoint: Path, variant: str) -> Path:
    """Path of the SmolVLA fixture exported to XNNPACK as `variant`, exported once per session.

    Lowering is single-threaded Python, so the first request also starts the other variants' exports in
    child processes: on two cores the int8 program is lowered while the fp32 one is and its tests run.
    """
    from omni_ros.export.exporter import export_checkpoint

    def path(name: str) -> Path:
        return base / "pte" / f"smolvla_{name}.pte"

    with _lock:
        for other in SMOLVLA_VARIANTS:
            if other != variant and other not in _children and not path(other).exists():
                _children[other] = _spawn_export(checkpoint, path(other), SMOLVLA_VARIANTS[other])
    out = path(variant)
    child = _children.get(variant)
    if child is not None:
        _, stderr = child.communicate()
        if child.returncode != 0 or not out.exists():
            raise RuntimeError(f"exporting {out.name} failed (exit {child.returncode}):\n{stderr[-4000:]}")
        return out
    _once(out, lambda: export_checkpoint(checkpoint, out, **SMOLVLA_VARIANTS[variant]))
    return out


_children: dict[str, subprocess.Popen] = {}


def _spawn_export(checkpoint: Path, out: Path, kwargs: dict) -> subprocess.Popen:
    """`export_checkpoint(checkpoint, out, **kwargs)` in a child process on one torch thread."""
    out.parent.mkdir(parents=True, exist_ok=True)
    code = (
        "import json, sys, torch; torch.set_num_threads(1)\n"
        "from omni_ros.export.exporter import export_checkpoint\n"
        "export_checkpoint(sys.argv[1], sys.argv[2], **json.loads(sys.argv[3]))\n"
    )
    cmd = [sys.executable, "-c", code, str(checkpoint), str(out), json.dumps(kwargs)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _once(done: Path, export) -> None:
    """Run `export()` (on one torch thread) unless this session already wrote `done`."""
    import torch

    with _lock:
        if not done.exists():
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                export()
            finally:
                torch.set_num_threads(threads)


class CountingMethod:
    """Wraps a loaded program method to record each call's name in `calls` (which stages ran, in order)."""

    def __init__(self, method, calls: list[str], name: str) -> None:
        self.method, self.calls, self.name = method, calls, name

    def execute(self, inputs):
        self.calls.append(self.name)
        return self.method.execute(inputs)
