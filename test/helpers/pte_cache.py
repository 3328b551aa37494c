"""Exported tiny `.pte` files shared by the export tests of one pytest session (lowering is the slow part)."""

from __future__ import annotations

import threading
from pathlib import Path

_lock = threading.Lock()

# tiny shaped for the simulated arm (cameras base + wrist, 3 joints), so one program serves every test.
ARM = {"state_dim": 3, "action_dim": 3}
# name -> export_preset keyword arguments. Staged methods only where the fused loop is not under test.
VARIANTS = {
    "fp32": {**ARM, "quantize": "none"},
    "int8": {**ARM, "quantize": "int8-dynamic", "methods": ("encode_images", "prefill", "denoise_step")},
}


# The tiny LeRobot SmolVLA fixture: name -> export_checkpoint keyword arguments. The fused loop is exported with
# one Euler step (its graph unrolls them: more would only make lowering slower), compared with one eager step.
SMOLVLA_VARIANTS = {
    "fp32": {"quantize": "none", "num_steps": 1},
    "int8": {"quantize": "int8-dynamic", "methods": ("encode_image", "prefill", "denoise_step")},
}


def exported_smolvla(base: Path, checkpoint: Path, variant: str) -> Path:
    """Path of the SmolVLA fixture exported to XNNPACK as `variant`, exported once per session."""
    from omni_ros.export.exporter import export_checkpoint

    return _once(base / "pte" / f"smolvla_{variant}.pte", export_checkpoint, checkpoint, **SMOLVLA_VARIANTS[variant])


def exported_tiny(base: Path, variant: str) -> Path:
    """Path of the tiny preset (weights seed 0) exported to XNNPACK as `variant`, exported once per session."""
    from omni_ros.export.exporter import export_preset

    return _once(base / "pte" / f"tiny_{variant}.pte", export_preset, "tiny", **VARIANTS[variant])


def _once(pte: Path, export, source, **kwargs) -> Path:
    """`export(source, pte, **kwargs)` unless this session already wrote `pte` (on one torch thread)."""
    import torch

    with _lock:
        if not pte.exists():
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                export(source, pte, **kwargs)
            finally:
                torch.set_num_threads(threads)
    return pte


class CountingMethod:
    """Wraps a loaded program method to record each call's name in `calls` (which stages ran, in order)."""

    def __init__(self, method, calls: list[str], name: str) -> None:
        self.method, self.calls, self.name = method, calls, name

    def execute(self, inputs):
        self.calls.append(self.name)
        return self.method.execute(inputs)
