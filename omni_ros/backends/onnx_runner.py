"""The ONNX Runtime runner: a folder written by `omni-ros export --target onnx | qnn-onnx` behind the one
inference path.

    policy = load_onnx("policy_htp/", providers=["qnn-htp"])     # observation dict -> action chunk
    out = policy.infer({"images": {...}, "state": ..., "prompt": "..."})

The runner is the backend: model inputs in, normalized actions out, either through the staged graphs
(`encode_images`, `prefill` once, its KV cache read by every `denoise_step` of the Euler loop) or one call of the
fused `sample` graph. Sessions are created in the constructor (for the HTP: loaded from the export's compiled cache,
or compiled once and cached), never per request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch

from omni_ros.backends.exported import exported_policy
from omni_ros.export.methods import STAGED, prefix_mask_of
from omni_ros.export.ort_session import (
    HtpCache,
    HtpTarget,
    check_providers,
    import_onnxruntime,
    open_session,
    qnn_ep_devices,
)
from omni_ros.export.sidecar import OnnxModelError, check_compatible, read_onnx_sidecar
from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.pipeline import InferencePipeline, Sampled
from omni_ros.policy.sampler import euler_sample

MODES = ("auto", "staged", "fused")


class OnnxRunner:
    """Model inputs (batch 1) + noise -> normalized action chunk, on ONNX Runtime."""

    # Graphs are exported for batch 1 (static shapes): the pipeline runs a batch request by request.
    max_batch = 1
    draws_noise = False
    device = torch.device("cpu")
    dtype = torch.float32

    def __init__(
        self,
        folder: str | Path,
        *,
        providers: Sequence[str] = ("cpu",),
        camera_names: Sequence[str] | None = None,
        state_dim: int | None = None,
        action_dim: int | None = None,
        num_threads: int = 0,
        mode: str = "auto",
    ) -> None:
        """Sessions for `folder` on `providers`; the sidecar must agree with the robot's cameras and dims."""
        providers = check_providers(providers)
        if mode not in MODES:
            raise ValueError(f"unknown mode '{mode}'; choose one of {', '.join(MODES)}")
        self.folder = folder = Path(folder)
        if providers[0] == "qnn-htp":
            qnn_ep_devices(import_onnxruntime())  # a missing qnn extra is the first thing to hear about
        sidecar = read_onnx_sidecar(folder)
        check_compatible(sidecar, str(folder), camera_names, state_dim, action_dim, error=OnnxModelError)
        staged = all(m in sidecar.methods for m in STAGED)
        if mode == "auto":
            mode = "staged" if staged else "fused"
        needed = STAGED if mode == "staged" else ("sample",)
        missing = [m for m in needed if m not in sidecar.methods]
        if missing:
            raise OnnxModelError(f"{folder}: {mode} mode needs methods {list(needed)}, it has {list(sidecar.methods)}")
        htp = None
        if providers[0] == "qnn-htp":
            if sidecar.target != "qnn-onnx":
                raise OnnxModelError(
                    f"{folder}: exported for target {sidecar.target}; providers qnn-htp runs a --target qnn-onnx export"
                )
            options = sidecar.target_options
            htp = HtpTarget(options["soc"], options["precision"])
        self.sidecar, self.cfg, self.mode, self.providers = sidecar, sidecar.model, mode, providers
        self.cache_status: dict[str, str] = {}
        self._sessions = {}
        for method in needed:
            path = folder / f"{method}.onnx"
            if htp is not None:
                digest = sidecar.files[path.name]["sha256"]
                cache = HtpCache(folder, htp)
                session, status = cache.session(method, path, digest, allow_cpu="cpu" in providers)
                self.cache_status[method] = status
            else:
                session = open_session(path, providers, num_threads=num_threads)
            self._sessions[method] = session
        self._inputs = {m: [i.name for i in s.get_inputs()] for m, s in self._sessions.items()}
        self._kv_names = [o.name for o in self._sessions["prefill"].get_outputs()] if mode == "staged" else []
        self._lock = threading.Lock()
        quant = "" if sidecar.quantize == "none" else f"-{sidecar.quantize}"
        self.backend = f"onnxruntime-{providers[0]}{quant}"

    def _run(self, method: str, feeds: dict[str, torch.Tensor | np.ndarray]) -> list[np.ndarray]:
        """Run `method` on the named inputs it takes (graphs drop inputs they do not use)."""
        arrays = {n: np.ascontiguousarray(_numpy(feeds[n])) for n in self._inputs[method]}
        return self._sessions[method].run(None, arrays)

    def sample(self, model_inputs: ModelInputs, noise: torch.Tensor | None, num_steps: int | None) -> Sampled:
        """Normalized actions (1, H, D) and the milliseconds of each stage (embed_prefix, prefill, denoise)."""
        if noise is None or num_steps is None:
            raise ValueError("the ONNX runner needs the sampling noise and the step count")
        inputs = {f.name: getattr(model_inputs, f.name) for f in fields(model_inputs)}
        with self._lock:  # one session run at a time: callers may share a policy across threads
            if self.mode == "fused":
                if num_steps != self.sidecar.num_steps:
                    raise OnnxModelError(
                        f"{self.folder}: its fused 'sample' runs {self.sidecar.num_steps} Euler steps, asked for "
                        f"{num_steps}; export with --num-steps {num_steps} or use the staged graphs"
                    )
                begin = time.perf_counter()
                actions = self._run("sample", {**inputs, "noise": noise})[0]
                # One call runs encoder, prefill and the loop: the time is reported as denoise_ms.
                return Sampled(actions, {"denoise_ms": (time.perf_counter() - begin) * 1e3})
            stamps = [time.perf_counter()]
            image_tokens = self._run("encode_images", inputs)[0]
            stamps.append(time.perf_counter())
            # The prefix KV cache: computed once, read by every denoising step below.
            cache = self._run("prefill", {**inputs, "image_tokens": image_tokens})
            kv = dict(zip(self._kv_names, cache, strict=True))
            stamps.append(time.perf_counter())
            feeds = {
                **kv,
                "prefix_mask": prefix_mask_of(inputs["image_masks"], inputs["token_mask"], self.cfg.vision.num_tokens),
                "state": inputs["state"],
            }

            def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
                return torch.from_numpy(self._run("denoise_step", {**feeds, "x_t": x, "t": t})[0])

            actions = euler_sample(velocity, noise, num_steps)
            stamps.append(time.perf_counter())
        stage_ms = {
            "embed_prefix_ms": (stamps[1] - stamps[0]) * 1e3,
            "prefill_ms": (stamps[2] - stamps[1]) * 1e3,
            "denoise_ms": (stamps[3] - stamps[2]) * 1e3,
        }
        return Sampled(actions.numpy(), stage_ms)

    def close(self) -> None:
        with self._lock:
            self._sessions = {}


def _numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x


def load_onnx(
    folder: str | Path,
    *,
    providers: Sequence[str] = ("cpu",),
    seed: int | None = 0,
    num_steps: int | None = None,
    mode: str = "auto",
    num_threads: int = 0,
    name: str | None = None,
    camera_names: Sequence[str] | None = None,
    state_dim: int | None = None,
    action_dim: int | None = None,
) -> InferencePipeline:
    """The policy of an ONNX export folder on `providers`, checked against its sidecar and the robot."""
    runner = OnnxRunner(
        folder,
        providers=providers,
        mode=mode,
        num_threads=num_threads,
        camera_names=camera_names,
        state_dim=state_dim,
        action_dim=action_dim,
    )
    sidecar, fused = runner.sidecar, runner.mode == "fused"
    if fused and num_steps is not None and num_steps != sidecar.num_steps:
        raise OnnxModelError(
            f"{folder}: its fused 'sample' runs {sidecar.num_steps} Euler steps, configured num_steps is "
            f"{num_steps}; export with --num-steps {num_steps} or use the staged graphs"
        )
    return exported_policy(sidecar, runner, Path(folder), fused=fused, seed=seed, num_steps=num_steps, name=name)
