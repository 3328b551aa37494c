"""The tiny preset shaped for the simulated arm, as the export tests compare against it: the eager model with the
weights `export_preset` builds, the torch policy around it, and raw observations."""

from __future__ import annotations

import numpy as np

from helpers.pte_cache import ARM
from omni_ros.policy.loading import from_preset
from omni_ros.policy.pi0.modeling import Pi0Model
from omni_ros.policy.pi0.presets import build_preset
from omni_ros.policy.pipeline import InferencePipeline


def eager_tiny() -> Pi0Model:
    return build_preset("tiny", 0, **ARM).eval()


def reference(**kwargs) -> InferencePipeline:
    """The same seeded weights `export_preset` builds, as a torch policy."""
    return from_preset("tiny", **ARM, **kwargs)


def raw_obs(seed: int, wrist: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    images = {"base": rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)}
    if wrist:
        images["wrist"] = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    return {"images": images, "state": rng.normal(size=3), "prompt": f"pick up block {seed}"}
