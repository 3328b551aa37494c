"""The `policy:` section of the omni_ros configuration: which policy to run, on which backend, and how.

The policy package's own config (as control/config.py is the executor's). It checks itself in
`__post_init__`, without loading anything, so `omni-ros config check` catches what loading would refuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from omni_ros.typed_config import FieldError


@dataclass
class PolicyConfig:
    """Which policy to run and how."""

    # Built-in architecture preset used when no checkpoint is given.
    preset: str = "tiny"
    # Checkpoint directory (config.json + model.safetensors); relative paths
    # are resolved against the config file's directory.
    checkpoint: str | None = None
    backend: Literal["torch", "executorch", "remote"] = "torch"
    # ExecuTorch program (`omni-ros export`) for backend executorch; its sidecar <pte>.json must sit beside it.
    # Relative paths are resolved against the config file's directory.
    pte: str | None = None
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16"] = "float32"
    # Euler steps of the flow-matching sampler; null keeps the model's own (10 for small/pi0).
    num_steps: int | None = None
    # Seed of the sampling noise; null draws fresh noise every call.
    seed: int | None = 0
    # torch intra-op threads; 0 keeps torch's default.
    num_threads: int = 0

    def __post_init__(self) -> None:
        if self.backend == "executorch":
            if not self.pte:
                raise FieldError("backend", "'executorch' needs policy.pte (a .pte written by `omni-ros export`)")
            if self.dtype != "float32":
                raise FieldError("dtype", "is fixed by the exported program for backend 'executorch'; use float32")
        if self.num_steps is not None and self.num_steps < 1:
            raise FieldError("num_steps", f"must be >= 1 (or null for the model's own), got {self.num_steps}")
        if self.num_threads < 0:
            raise FieldError("num_threads", f"must be >= 0 (0 keeps torch's default), got {self.num_threads}")
