"""The one inference path: raw observation -> model inputs -> `runner.sample` -> robot actions.

    policy = InferencePipeline(processor, runner, num_steps=10, seed=0, name="demo")
    out = policy.infer(obs)                      # {"actions": (H, D) float32, "policy_timing": {...}}
    out = policy.infer(obs, noise=noise)         # explicit noise (action_horizon, model_action_dim), as openpi
    out = policy.infer(obs, rtc=RtcRequest(...)) # real-time chunking: continue the plan being executed

Every backend and every model family goes through this loop. A family supplies the *processor*
(validation and one tile per camera, tokenization, normalization, and the way back to robot units);
a backend supplies the *runner* (how to run the model: eager torch, an ExecuTorch program, an ONNX
session, a remote server). The loop owns what must be the same everywhere: the noise (seeded so
every request of a seed draws the same noise, batched or not), the timing dict, and the refusal to
hand a non-finite command to a robot.

Real-time chunking (omni_ros.policy.rtc): the processor turns the request's old plan into model units
(`rtc_target`, or None where the runner forwards the request in robot units) and the runner's
`sample(..., rtc=RtcPlan)` continues it. A runner says what it can do in `rtc_methods` (() for none), so
a controller configured for RTC is refused at configure time (`check_rtc_support`), not mid-motion.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import torch

from omni_ros import cpu_idle
from omni_ros.observation import Observation, ObservationError, ObservationSpec
from omni_ros.policy.base import BasePolicy, PolicyMetadata
from omni_ros.policy.rtc import RtcError, RtcPlan, RtcRequest

InputsT = TypeVar("InputsT")
# A processor produces inputs (covariant), a runner consumes them (contravariant).
InputsT_co = TypeVar("InputsT_co", covariant=True)
InputsT_contra = TypeVar("InputsT_contra", contravariant=True)
STAGES = ("embed_prefix_ms", "prefill_ms", "denoise_ms")


@dataclass
class Sampled:
    """What a runner returns: normalized actions (B, H, D) and how long its stages took."""

    actions: np.ndarray
    stage_ms: dict[str, float]
    # Per batch item, keys the runner adds to the result (a remote server's own timings, for example).
    extras: list[dict[str, Any]] = field(default_factory=list)


class Processor(Protocol[InputsT_co]):
    """A family's pre/post-processing: raw observation -> model inputs, model output -> robot actions."""

    spec: ObservationSpec

    @property
    def noise_shape(self) -> tuple[int, int] | None:
        """(action_horizon, model_action_dim), or None where the runner draws its own noise."""
        ...

    def metadata(self, name: str, backend: str) -> PolicyMetadata: ...

    def parse(self, raw: Mapping[str, Any]) -> Observation: ...

    def inputs(self, observations: Sequence[Observation], device: torch.device, dtype: torch.dtype) -> InputsT_co: ...

    def actions(self, normalized: np.ndarray, observation: Observation) -> np.ndarray: ...

    def rtc_target(self, request: RtcRequest, observation: Observation) -> np.ndarray | None:
        """An RTC request's old plan in model units (H, D), `actions` inverted; None: the runner takes it as is."""
        ...


class Runner(Protocol[InputsT_contra]):
    """A backend: how to run the model on inputs and noise."""

    backend: str
    device: torch.device
    dtype: torch.dtype

    # Largest batch one `sample` call takes (None: any). Bigger batches are split by the pipeline.
    @property
    def max_batch(self) -> int | None: ...

    # True where the runner draws the noise itself when a request carries none (a remote server does);
    # otherwise the pipeline draws it.
    draws_noise: bool

    # Optional, read with a default of True: False where another machine computes the chunk (a remote server),
    # so this CPU's idle cores need not poll while it waits (`_idle_poll`).
    # computes_locally: bool

    @property
    def rtc_methods(self) -> tuple[str, ...]:
        """Real-time chunking methods `sample(..., rtc=)` serves ("guided", "inpaint"); () or absent: none (then
        `sample` is never called with rtc)."""
        ...

    def sample(
        self, inputs: InputsT_contra, noise: torch.Tensor | None, num_steps: int | None, rtc: RtcPlan | None = None
    ) -> Sampled: ...

    def close(self) -> None: ...


class InferencePipeline(BasePolicy, Generic[InputsT]):
    """`Policy` over any processor and runner."""

    def __init__(
        self,
        processor: Processor[InputsT],
        runner: Runner[InputsT],
        *,
        num_steps: int | None,
        seed: int | None = 0,
        name: str = "policy",
    ) -> None:
        # None: the runner's own (a remote server decides its step count).
        if num_steps is not None and num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        self.processor = processor
        self.runner = runner
        self.num_steps = num_steps
        self.seed = seed
        self.spec = processor.spec
        self.metadata = processor.metadata(name, runner.backend)
        # What the runner's GEMMs compute in, and why ("int8: avx512_vnni"); a remote server says its own.
        precision = getattr(runner, "precision", "") or self.metadata.precision
        if precision != self.metadata.precision:
            self.metadata = replace(self.metadata, precision=precision)

    # -- noise ---------------------------------------------------------------------------------------------------

    def draw_noise(self, batch: int) -> torch.Tensor | None:
        """Per-request noise (batch, H, D): with a seed, every request draws the same noise, batched or not."""
        shape = self.processor.noise_shape
        if shape is None:
            return None
        if self.seed is None:
            noise = torch.randn((batch, *shape))
        else:
            one = torch.randn(shape, generator=torch.Generator().manual_seed(self.seed))
            noise = one.expand(batch, *shape).contiguous()
        # float32 whatever the model's dtype: the sampler integrates in float32 (see TorchRunner.sample).
        return noise.to(self.runner.device)

    def _given_noise(self, noise: Any, batch: int) -> torch.Tensor:
        shape = self.processor.noise_shape
        if shape is None:
            raise ObservationError(f"backend {self.runner.backend} does not take explicit noise")
        try:
            array = np.asarray(noise, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ObservationError(f"noise is not a numeric array: {exc}") from exc
        if array.ndim == 2 and batch == 1:
            array = array[None]
        if array.shape != (batch, *shape):
            expected = shape if batch == 1 else (batch, *shape)
            raise ObservationError(
                f"noise has shape {tuple(np.shape(noise))}, expected {expected} (action_horizon, model action dim)"
            )
        if not np.all(np.isfinite(array)):
            raise ObservationError("noise has non-finite values (NaN/inf)")
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.runner.device)

    def _idle_poll(self) -> AbstractContextManager[None]:
        """Idle cores kept polling while this process computes the chunk on its CPU (omni_ros/cpu_idle.py); a
        remote server's or a GPU's chunk leaves them be."""
        local = getattr(self.runner, "computes_locally", True) and self.runner.device.type == "cpu"
        return cpu_idle.held() if local else nullcontext()

    # -- Policy --------------------------------------------------------------------------------------------------

    @property
    def rtc_methods(self) -> tuple[str, ...]:
        """Real-time chunking methods this policy serves (its runner's)."""
        return tuple(getattr(self.runner, "rtc_methods", ()))

    def infer(self, obs: Mapping[str, Any], *, noise: Any = None, rtc: RtcRequest | None = None) -> dict[str, Any]:
        """One chunk; with `rtc`, one that continues the plan in it (real-time chunking)."""
        if rtc is None:
            return self.infer_batch([obs], noise=noise)[0]
        if rtc.method not in self.rtc_methods:
            offer = ", ".join(self.rtc_methods) or "none"
            raise RtcError(f"backend {self.runner.backend} cannot serve rtc method '{rtc.method}' (it serves: {offer})")
        return self._infer([obs], noise, rtc)[0]

    def infer_batch(self, observations: Sequence[Mapping[str, Any]], *, noise: Any = None) -> list[dict[str, Any]]:
        return self._infer(observations, noise, None)

    def _infer(
        self, observations: Sequence[Mapping[str, Any]], noise: Any, rtc: RtcRequest | None
    ) -> list[dict[str, Any]]:
        limit = self.runner.max_batch
        if limit is not None and len(observations) > limit:
            # A program exported for a fixed batch runs the requests one call at a time, each timed on its own.
            noises = [None] * len(observations) if noise is None else list(np.asarray(noise))
            return [r for obs, n in zip(observations, noises, strict=True) for r in self.infer_batch([obs], noise=n)]
        start = time.perf_counter()
        parsed = [self.processor.parse(obs) for obs in observations]
        inputs = self.processor.inputs(parsed, self.runner.device, self.runner.dtype)
        drawn: torch.Tensor | None
        if noise is not None:
            drawn = self._given_noise(noise, len(parsed))
        else:
            drawn = None if self.runner.draws_noise else self.draw_noise(len(parsed))
        plan = None
        if rtc is not None:
            target = self.processor.rtc_target(rtc, parsed[0])
            plan = RtcPlan(rtc, None if target is None else torch.from_numpy(target)[None].to(self.runner.device))
        begin = time.perf_counter()
        with self._idle_poll():
            if plan is None:  # a runner without RTC is never passed the argument (Runner.rtc_methods)
                sampled = self.runner.sample(inputs, drawn, self.num_steps)
            else:
                sampled = self.runner.sample(inputs, drawn, self.num_steps, rtc=plan)
        end = time.perf_counter()
        timing = {"preprocess_ms": (begin - start) * 1e3}
        timing.update({k: sampled.stage_ms.get(k, 0.0) for k in STAGES})
        # A runner's own measures beyond the common stages (a token decoder's tokens_per_s, for example).
        timing.update({k: v for k, v in sampled.stage_ms.items() if k not in timing})
        timing.update(infer_ms=(end - start) * 1e3, batch_size=len(parsed))
        results = []
        for i, observation in enumerate(parsed):
            chunk = np.asarray(self.processor.actions(sampled.actions[i], observation), dtype=np.float32)
            check_actions(chunk)
            result = {"actions": chunk, "policy_timing": dict(timing)}
            if sampled.extras:
                result.update(sampled.extras[i])
            results.append(result)
        return results

    def close(self) -> None:
        self.runner.close()


def check_actions(actions: np.ndarray) -> None:
    """Never hand a non-finite command to a robot."""
    if not np.all(np.isfinite(actions)):
        raise FloatingPointError("policy produced non-finite actions")


class StageClock:
    """A stopwatch for runners: `lap(name)` records the ms since the previous lap, after `sync()` (CUDA)."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self._sync = sync
        self._last = time.perf_counter()
        self.ms: dict[str, float] = {}

    def lap(self, name: str) -> None:
        if self._sync is not None:
            self._sync()
        now = time.perf_counter()
        self.ms[name] = (now - self._last) * 1e3
        self._last = now
