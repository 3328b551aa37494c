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


def exported_tiny(base: Path, variant: str) -> Path:
    """Path of the tiny preset (weights seed 0) exported to XNNPACK as `variant`, exported once per session."""
    import torch

    from omni_ros.export.exporter import export_preset

    pte = base / "pte" / f"tiny_{variant}.pte"
    with _lock:
        if not pte.exists():
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                export_preset("tiny", pte, **VARIANTS[variant])
            finally:
                torch.set_num_threads(threads)
    return pte
