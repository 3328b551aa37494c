"""The `policy:` section of the omni_ros configuration: which policy to run, on which backend, and how.

The policy package's own config (as control/config.py is the executor's). It checks itself in
`__post_init__`, without loading anything, so `omni-ros config check` catches what loading would refuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from omni_ros.typed_config import FieldError


@dataclass
class RemoteConfig:
    """An OpenPI WebSocket server that runs the policy (`policy.backend: remote`)."""

    # ws://host:port or wss://host:port
    url: str = ""
    # openpi key layout the server expects (droid, libero, aloha, a YAML path); empty: the one the server announces.
    keymap: str = ""
    # Sent as `Authorization: Api-Key ...`; empty: the environment variable named by api_key_env, if set.
    api_key: str = ""
    api_key_env: str = "OMNI_ROS_API_KEY"
    connect_timeout_s: float = 5.0
    # A reply later than this is never used (the connection is dropped instead).
    deadline_s: float = 2.0
    retries: int = 3

    def __post_init__(self) -> None:
        if self.url and not self.url.startswith(("ws://", "wss://")) and "://" in self.url:
            raise FieldError("url", f"must be ws://host:port or wss://host:port, got {self.url!r}")
        for name in ("connect_timeout_s", "deadline_s"):
            if getattr(self, name) <= 0:
                raise FieldError(name, f"must be > 0, got {getattr(self, name)}")
        if self.retries < 0:
            raise FieldError("retries", f"must be >= 0, got {self.retries}")


@dataclass
class PolicyConfig:
    """Which policy to run and how."""

    # Built-in architecture preset used when no checkpoint is given.
    preset: str = "tiny"
    # Checkpoint folder: omni_ros's (config.json + model.safetensors), a LeRobot save_pretrained folder
    # (pi0, pi05) or an openpi PyTorch checkpoint; relative paths are resolved against the config file's folder.
    checkpoint: str | None = None
    backend: Literal["torch", "executorch", "onnxruntime", "remote"] = "torch"
    # ExecuTorch program (`omni-ros export`) for backend executorch; its sidecar <pte>.json must sit beside it.
    # Relative paths are resolved against the config file's directory.
    pte: str | None = None
    # ONNX export folder (`omni-ros export --target onnx | qnn-onnx`) for backend onnxruntime; same path rules.
    onnx: str | None = None
    # ONNX Runtime execution providers, in order: cpu, qnn-htp (alone: the whole graph on the HTP; then cpu: CPU
    # fallback allowed), cuda, tensorrt.
    providers: list[str] = field(default_factory=lambda: ["cpu"])
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16"] = "float32"
    # Euler steps of the flow-matching sampler; null keeps the model's own (10 for small/pi0).
    num_steps: int | None = None
    # Seed of the sampling noise; null draws fresh noise every call.
    seed: int | None = 0
    # torch intra-op threads; 0 keeps torch's default.
    num_threads: int = 0
    # A tokenizer.json / tokenizer.model (or its folder) for a LeRobot or openpi checkpoint that ships none;
    # null: the checkpoint folder, then the local Hugging Face cache. Relative to the config file.
    tokenizer: str | None = None
    # backend remote: the server to ask.
    remote: RemoteConfig = field(default_factory=RemoteConfig)

    def __post_init__(self) -> None:
        if self.backend == "executorch":
            if not self.pte:
                raise FieldError("backend", "'executorch' needs policy.pte (a .pte written by `omni-ros export`)")
            if self.dtype != "float32":
                raise FieldError("dtype", "is fixed by the exported program for backend 'executorch'; use float32")
        if self.backend == "onnxruntime":
            if not self.onnx:
                raise FieldError("backend", "'onnxruntime' needs policy.onnx (a folder written by `omni-ros export`)")
            if self.dtype != "float32" or self.device != "cpu":
                raise FieldError(
                    "backend", "'onnxruntime' takes policy.providers (cpu, qnn-htp, cuda, tensorrt), not dtype/device"
                )
        if self.backend == "remote" and not self.remote.url:
            raise FieldError("remote.url", "is needed by backend 'remote' (e.g. ws://127.0.0.1:8000)")
        if self.num_steps is not None and self.num_steps < 1:
            raise FieldError("num_steps", f"must be >= 1 (or null for the model's own), got {self.num_steps}")
        if self.num_threads < 0:
            raise FieldError("num_threads", f"must be >= 0 (0 keeps torch's default), got {self.num_threads}")
