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
    # wss:// with a self-signed certificate or a private CA: its PEM file (default: the system's CAs).
    # Relative to the config file.
    ca_file: str | None = None
    connect_timeout_s: float = 5.0
    # A reply later than this is never used (the connection is dropped instead).
    deadline_s: float = 2.0
    retries: int = 3

    def __post_init__(self) -> None:
        if self.url and not self.url.startswith(("ws://", "wss://")) and "://" in self.url:
            raise FieldError("url", f"must be ws://host:port or wss://host:port, got {self.url!r}")
        if self.ca_file and not self.url.startswith("wss://"):
            raise FieldError("ca_file", f"needs a wss:// url, got {self.url!r}")
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
    # bfloat16 on a CPU without native bf16 (AVX512_BF16 / AMX_BF16, Arm BF16) runs float32 with a warning;
    # true refuses to start instead (omni_ros/cpu_features.py).
    strict_dtype: bool = False
    # Euler steps of the flow-matching sampler; null keeps the model's own (10 for small/pi0).
    num_steps: int | None = None
    # Seed of the sampling noise; null draws fresh noise every call.
    seed: int | None = 0
    # torch intra-op threads; 0 keeps torch's default (one per core). Set before torch starts its pool.
    num_threads: int = 0
    # How torch's idle OpenMP workers wait: passive (sleep at once; steady beside busy processes), brief (spin
    # ~0.3 ms, then sleep: faster where the policy has the CPU to itself, slower beside a busy process), active
    # (spin), runtime (the OpenMP default: spin ~3 ms); null keeps $OMP_WAIT_POLICY, else passive. See
    # omni_ros/cpu_threads.py and docs/policy.md.
    omp_wait_policy: Literal["passive", "brief", "active", "runtime"] | None = None
    # While an inference runs on this CPU, keep idle cores polling instead of halting (Linux's CPU latency
    # request, /dev/cpu_dma_latency held at 0 us): a sleeping worker then wakes in microseconds, not a VM exit or
    # a C-state's exit, and the denoising steps gain from a second torch thread. auto: where the device is
    # writable (root, or a udev rule), else without it (said once); on: the same, warning where it cannot;
    # off: never. omni_ros/cpu_idle.py, docs/policy.md.
    cpu_idle_poll: Literal["auto", "on", "off"] = "auto"
    # What the GEMMs compute in (omni_ros/policy/precision): auto picks, from the CPU's instructions, the fastest
    # path whose accuracy is verified (bf16 on AMX CPUs, int8 where there is an int8 dot product (VNNI, Arm
    # dotprod), fp32 otherwise); fp32, bf16 (bf16 GEMMs, float32 elsewhere: within 1% of fp32's actions) and int8
    # (int8 weights per channel, activations per token: within 4%) force one. int8 / bf16 on a CPU without the
    # instructions run (the same numbers, slowly) with a warning. For executorch / onnxruntime the program's own
    # precision is used (auto) or checked; a remote server decides its own (auto only).
    precision: Literal["auto", "fp32", "bf16", "int8"] = "auto"
    # The int8 GEMM kernel: auto (oneDNN on AMX CPUs; on x86 CPUs with VNNI and no AMX the program below where
    # it serves the checkpoint, else XNNPACK per linear; XNNPACK per linear on Arm CPUs), onednn (torch's
    # _int_mm), xnnpack (ExecuTorch's XNNPACK delegate per linear, built on first load and cached) or program (a
    # checkpoint folder's stages exported whole to one XNNPACK int8 program on first load and cached: attention
    # and glue inside XNNPACK too; pi0, pi0.5 and SmolVLA; RTC by inpainting, guided with the program's traced guided
    # step where control.rtc.method is guided; omni_ros/backends/stage_program.py).
    int8_kernel: Literal["auto", "onednn", "xnnpack", "program"] = "auto"
    # Where an ExecuTorch program (backend executorch, int8_kernel program) runs: child (a process of its own, so
    # it never holds this process's GIL: ExecuTorch's Python binding keeps it while a method runs, which stalls a
    # control loop beside it), inline (this process), or auto (child in the policy node, whose control loop shares
    # the process; inline for serve, eval and the Python API). omni_ros/backends/program_process.py.
    program_process: Literal["auto", "child", "inline"] = "auto"
    # Where kernels built on first load are kept, per checkpoint and CPU; null: $OMNI_ROS_CACHE_DIR, else
    # ~/.cache/omni_ros. Relative to the config file.
    cache_dir: str | None = None
    # precision fp32 on an x86 CPU: packed runs the linear layers from weights reordered once for oneDNN (3-20%
    # faster per GEMM than torch's default MKL path, measured; omni_ros/policy/cpu_linear.py); dense keeps
    # torch's nn.Linear (what exporting or training the runner's model needs).
    cpu_linear: Literal["packed", "dense"] = "packed"
    # Backend torch on a CPU: the vision tower, prefill and denoising step compiled by TorchInductor on the first
    # inference (tens of seconds to minutes; needs a C++ compiler), their elementwise ops fused around the
    # precision's GEMM kernels: pi0, pi0.5 and SmolVLA (omni_ros/policy/compiled_stages.py, docs/precision.md).
    compile: bool = False
    # A tokenizer.json / tokenizer.model (or its folder) for a LeRobot or openpi checkpoint that ships none;
    # null: the checkpoint folder, then the local Hugging Face cache. Relative to the config file.
    tokenizer: str | None = None
    # Seconds between a chunk's actions: the period the training data was recorded at (a LeRobot dataset at 30 fps:
    # 0.0333). null: what the checkpoint or program records (omni_ros's own); LeRobot and openpi checkpoints record
    # no rate and play at 0.02 s (50 Hz) with a warning, which runs a 30 fps policy's motions 1.67x too fast.
    action_dt: float | None = None
    # A cross-embodiment checkpoint's embodiment (X-VLA's domain: its soft prompts and per-domain layers) when an
    # observation carries no `domain_id`; null: the checkpoint's saved default.
    domain_id: int | None = None
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
        if self.backend == "remote" and self.precision != "auto":
            raise FieldError("precision", f"is the remote server's to choose; use auto, got {self.precision!r}")
        if self.program_process == "child" and self.backend in ("onnxruntime", "remote"):
            raise FieldError(
                "program_process", f"runs ExecuTorch programs (backend executorch or torch), not {self.backend}"
            )
        if self.backend in ("executorch", "onnxruntime") and self.precision == "bf16":
            raise FieldError("precision", f"bf16 has no kernels in an exported program ({self.backend}); use auto")
        on_cuda = self.backend == "torch" and not self.device.startswith("cpu")
        if on_cuda and self.precision in ("bf16", "int8"):
            raise FieldError(
                "precision", f"{self.precision} chooses CPU GEMM kernels; on {self.device} set dtype and precision auto"
            )
        if self.backend == "torch" and self.dtype == "bfloat16" and self.precision in ("fp32", "int8"):
            raise FieldError("precision", f"{self.precision} needs dtype float32 (bfloat16 casts the whole model)")
        if self.compile and (self.backend != "torch" or on_cuda):
            raise FieldError("compile", f"compiles the torch backend's CPU stages, not {self.backend} on {self.device}")
        if self.num_steps is not None and self.num_steps < 1:
            raise FieldError("num_steps", f"must be >= 1 (or null for the model's own), got {self.num_steps}")
        if self.action_dt is not None and not 0 < self.action_dt <= 1:
            raise FieldError("action_dt", f"must be in (0, 1] seconds (1 / the dataset's fps), got {self.action_dt}")
        if self.num_threads < 0:
            raise FieldError("num_threads", f"must be >= 0 (0 keeps torch's default), got {self.num_threads}")
