"""The PyTorch backend of `Policy` (CPU and CUDA, float32 and bfloat16)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omni_ros.errors import OmniRosError
from omni_ros.observation import make_observation
from omni_ros.policy.base import BasePolicy
from omni_ros.policy.checkpoint import load_checkpoint
from omni_ros.policy.inputs import model_inputs, robot_actions
from omni_ros.policy.model import Pi0Model
from omni_ros.policy.model_config import ModelConfig, preset
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.rtc import METHODS, RtcRequest, model_target, rtc_sample
from omni_ros.policy.sampler import euler_sample
from omni_ros.policy.tokenizer import Tokenizer, make_tokenizer


class DeviceError(OmniRosError, RuntimeError):
    """The configured device cannot be used here."""


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    """`cpu` or `cuda[:N]`; CUDA that is absent is an error, never a silent CPU fallback."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"policy.device is '{device}' but CUDA is not available to this PyTorch "
                f"(torch {torch.__version__}, built with CUDA: {torch.version.cuda or 'no'}); "
                "install a CUDA build of torch or set policy.device: cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceError(f"policy.device is '{device}' but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif dev.type != "cpu":
        raise DeviceError(f"unsupported policy.device '{device}'; use cpu or cuda[:N]")
    return dev


class TorchPolicy(BasePolicy):
    """Observation dict -> action chunk, with the prefix KV cache reused by every Euler step."""

    # Real-time chunking: `infer(obs, rtc=RtcRequest(...))` (omni_ros.policy.rtc).
    rtc_methods = METHODS

    def __init__(
        self,
        model: Pi0Model,
        norm_stats: NormStats,
        tokenizer: Tokenizer | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int | None = 0,
        num_steps: int | None = None,
        name: str | None = None,
    ) -> None:
        cfg: ModelConfig = model.cfg
        if dtype not in DTYPES:
            raise ValueError(f"unsupported dtype '{dtype}'; use one of {sorted(DTYPES)}")
        norm_stats.check(cfg.state_dim, cfg.action_dim)
        self.device = resolve_device(device)
        self.dtype = DTYPES[dtype]
        self.model = model.to(self.device, self.dtype).eval()
        self.cfg = cfg
        self.norm_stats = norm_stats
        self.tokenizer = tokenizer or make_tokenizer(cfg.tokenizer)
        self.seed = seed
        self.num_steps = num_steps or cfg.num_steps
        self.spec = cfg.observation_spec()
        backend = f"torch-{self.device.type}" + ("-bf16" if self.dtype == torch.bfloat16 else "")
        self.metadata = cfg.policy_metadata(name or cfg.name, backend)

    @classmethod
    def from_preset(
        cls,
        name: str,
        *,
        camera_names: Sequence[str] | None = None,
        state_dim: int | None = None,
        action_dim: int | None = None,
        action_horizon: int | None = None,
        weights_seed: int = 0,
        **kwargs: Any,
    ) -> TorchPolicy:
        """A randomly initialised model of a built-in architecture (weights seeded, so reproducible)."""
        cfg = preset(
            name, camera_names=camera_names, state_dim=state_dim, action_dim=action_dim, action_horizon=action_horizon
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(weights_seed)
            model = Pi0Model(cfg)
        return cls(model, NormStats.identity(cfg.state_dim, cfg.action_dim), name=f"{name} (random weights)", **kwargs)

    @classmethod
    def from_checkpoint(cls, path: str | Path, **kwargs: Any) -> TorchPolicy:
        model, stats, _ = load_checkpoint(path)
        tokenizer = make_tokenizer(model.cfg.tokenizer, base_dir=Path(path))
        return cls(model, stats, tokenizer=tokenizer, name=kwargs.pop("name", Path(path).name), **kwargs)

    def _noise(self, batch: int) -> torch.Tensor:
        """Per-request noise: with a seed, every request draws the same noise, batched or not."""
        shape = (self.cfg.action_horizon, self.cfg.action_dim)
        if self.seed is None:
            return torch.randn((batch, *shape)).to(self.device, self.dtype)
        generator = torch.Generator().manual_seed(self.seed)
        one = torch.randn(shape, generator=generator)
        return one.expand(batch, *shape).contiguous().to(self.device, self.dtype)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- Policy --------------------------------------------------------------------------------------------------

    def infer(self, obs: dict[str, Any], *, rtc: RtcRequest | None = None) -> dict[str, Any]:
        """One chunk; with `rtc`, one that continues the plan in `rtc` (real-time chunking)."""
        return self._infer([obs], rtc)[0]

    def infer_batch(self, observations: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return self._infer(observations, None)

    def _infer(self, observations: Sequence[dict[str, Any]], rtc: RtcRequest | None) -> list[dict[str, Any]]:
        start = time.perf_counter()
        parsed = [make_observation(self.spec, obs) for obs in observations]
        inputs = model_inputs(self.cfg, self.tokenizer, self.norm_stats, parsed, self.device, self.dtype)
        noise = self._noise(len(parsed))
        target = None
        if rtc is not None:
            target = torch.from_numpy(model_target(self.cfg, self.norm_stats, rtc, parsed[0].state))
            target = target.to(self.device, self.dtype)
        stamps = [time.perf_counter()]
        # Guided RTC differentiates through the denoise step: no_grad (not inference_mode) for the prefix, so
        # its KV cache can enter the autograd graph as a constant.
        guided = rtc is not None and rtc.method == "guided"
        with torch.no_grad() if guided else torch.inference_mode():
            model = self.model
            prefix, prefix_mask = model.embed_prefix(
                inputs["images"], inputs["image_masks"], inputs["tokens"], inputs["token_mask"]
            )
            self._sync()
            stamps.append(time.perf_counter())
            cache = model.prefill(prefix, prefix_mask)
            self._sync()
            stamps.append(time.perf_counter())
            state = inputs["state"]

            def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
                return model.denoise_step(cache, prefix_mask, state, x, t)

            if rtc is None:
                actions = euler_sample(velocity, noise, self.num_steps)
            else:
                clean = self.cfg.rtc_max_delay > 0
                actions = rtc_sample(velocity, noise, self.num_steps, target, rtc, clean_prefix=clean)
            actions = actions.float().cpu().numpy()
            stamps.append(time.perf_counter())
        timing = {
            "preprocess_ms": (stamps[0] - start) * 1e3,
            "embed_prefix_ms": (stamps[1] - stamps[0]) * 1e3,
            "prefill_ms": (stamps[2] - stamps[1]) * 1e3,
            "denoise_ms": (stamps[3] - stamps[2]) * 1e3,
            "infer_ms": (stamps[3] - start) * 1e3,
            "batch_size": len(parsed),
        }
        results = []
        for i in range(len(parsed)):
            chunk = robot_actions(self.cfg, self.norm_stats, actions[i], parsed[i].state)
            if not np.all(np.isfinite(chunk)):
                # Never hand a non-finite command to a robot.
                raise FloatingPointError("policy produced non-finite actions")
            results.append({"actions": chunk, "policy_timing": dict(timing)})
        return results
