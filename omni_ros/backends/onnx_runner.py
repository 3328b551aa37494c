"""The ONNX Runtime runner: a folder written by `omni-ros export --target onnx | qnn-onnx` behind the one
inference path.

    policy = load_onnx("policy_htp/", providers=["qnn-htp"])     # observation dict -> action chunk
    out = policy.infer({"images": {...}, "state": ..., "prompt": "..."})

The runner is the backend: model inputs in, normalized actions out, either through the staged graphs, chained as
the model family's `StagePlan` says (pi0: `encode_images`, `prefill` once, its KV cache read by every
`denoise_step` of the Euler loop; SmolVLA: `encode_image` per camera present, then the same), or one call of the
fused `sample` graph. Sessions are created in the constructor (for the HTP: loaded from the export's compiled cache,
or compiled once and cached), never per request.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omni_ros.backends.exported import exported_policy, staged_sampler, takes_per_token_times
from omni_ros.export.ort_session import (
    HtpCache,
    HtpTarget,
    check_providers,
    import_onnxruntime,
    open_session,
    qnn_ep_devices,
)
from omni_ros.export.sidecar import OnnxModelError, check_compatible, read_onnx_sidecar
from omni_ros.policy.families import stage_plan
from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.pipeline import InferencePipeline, Sampled, StageClock
from omni_ros.policy.precision.choice import program_choice
from omni_ros.policy.rtc import RtcError, RtcPlan

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
        # The model family says which graphs exist and how one inference chains them.
        self.plan = plan = stage_plan(sidecar.family)
        staged = all(m in sidecar.methods for m in plan.staged)
        if mode == "auto":
            mode = "staged" if staged else "fused"
        needed = plan.staged if mode == "staged" else ("sample",)
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
        self._lock = threading.Lock()
        # Real-time chunking: hard prefix inpainting around the staged denoise_step (no gradient in a graph).
        self.rtc_methods: tuple[str, ...] = ("inpaint",) if mode == "staged" else ()
        self.per_token = mode == "staged" and takes_per_token_times(sidecar)
        # A token decoder (pi0-FAST): its greedy loop and detokenizer out here, over its prefill and decode_step.
        self._decode = plan.token_decoder(self.cfg, folder) if plan.token_decoder else None
        self._generate = plan.token_generator(self.cfg) if plan.token_generator else None
        # A family whose steps no RTC sampler fits (a token decoder) says why, and is refused RTC at configure.
        if self._decode is not None or plan.rtc_refusal:
            self.rtc_methods = ()
            self.rtc_refusal = plan.rtc_refusal
        quant = "" if sidecar.quantize == "none" else f"-{sidecar.quantize}"
        self.backend = f"onnxruntime-{providers[0]}{quant}"
        self.precision = program_choice(sidecar.quantize, "auto", str(folder)).describe()

    def _run(self, method: str, feeds: dict[str, torch.Tensor | np.ndarray]) -> list[np.ndarray]:
        """Run `method` on the named inputs it takes (graphs drop inputs they do not use)."""
        arrays = {n: np.ascontiguousarray(_numpy(feeds[n])) for n in self._inputs[method]}
        return self._sessions[method].run(None, arrays)

    def _call(self, method: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The family's `run(method, tensors)`: positional inputs, in the order of the method's signature."""
        names = [spec.name for spec in self.sidecar.methods[method].inputs]
        outputs = self._run(method, dict(zip(names, tensors, strict=True)))
        return [torch.from_numpy(x) for x in outputs]

    def sample(
        self, model_inputs: ModelInputs, noise: torch.Tensor | None, num_steps: int | None, rtc: RtcPlan | None = None
    ) -> Sampled:
        """Normalized actions (1, H, D) and the milliseconds of each stage (embed_prefix, prefill, denoise)."""
        if self._decode is not None:
            if rtc is not None:
                raise RtcError(f"{self.folder}: real-time chunking does not apply: {self.plan.rtc_refusal}")
            with self._lock:
                return self._decode(self._call, model_inputs)
        if rtc is not None and self.plan.rtc_refusal:
            raise RtcError(f"{self.folder}: real-time chunking does not apply: {self.plan.rtc_refusal}")
        if noise is None or num_steps is None:
            raise ValueError("the ONNX runner needs the sampling noise and the step count")
        if rtc is not None and (rtc.target is None or rtc.request.method not in self.rtc_methods):
            offer = ", ".join(self.rtc_methods) or "none (fused graphs)"
            raise RtcError(f"{self.folder}: rtc method '{rtc.request.method}' is not served here (it serves: {offer})")
        with self._lock:  # one session run at a time: callers may share a policy across threads
            clock = StageClock()
            if self.mode == "fused":
                if num_steps != self.sidecar.num_steps:
                    raise OnnxModelError(
                        f"{self.folder}: its fused 'sample' runs {self.sidecar.num_steps} Euler steps, asked for "
                        f"{num_steps}; export with --num-steps {num_steps} or use the staged graphs"
                    )
                # One call runs encoder, prefill and the loop: the time is reported as denoise_ms.
                clock.lap("embed_prefix_ms")
                clock.lap("prefill_ms")
                chunk = self._call("sample", [*self.plan.fused_inputs(self.cfg, model_inputs), noise])[0]
                clock.lap("denoise_ms")
                return Sampled(chunk.numpy(), clock.ms)
            # The family's chaining: the prefix KV cache is computed once and read by every denoising step.
            # No gradient in a graph: RTC is hard inpainting of the prefix around denoise_step.
            sample = staged_sampler(self.plan, self.cfg, noise, num_steps, rtc, per_token=self.per_token, guided=False)
            actions = self.plan.run_staged(self.cfg, self._call, model_inputs, noise, num_steps, clock, sample)
        return Sampled(actions.numpy(), clock.ms)

    def generate(self, model_inputs: ModelInputs) -> Any:
        """A token decoder's (pi0-FAST) generated tokens and timings (its `Generated`), the very loop `sample`
        runs, without the detokenizer: what a benchmark on random weights (no decodable chunk) times."""
        if self._generate is None:
            raise ValueError(f"{self.folder}: a {self.sidecar.family} graph set decodes no tokens")
        with self._lock:
            return self._generate(self._call, model_inputs)

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
    domain_id: int | None = None,
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
    return exported_policy(
        sidecar, runner, Path(folder), fused=fused, seed=seed, num_steps=num_steps, name=name, domain_id=domain_id
    )
