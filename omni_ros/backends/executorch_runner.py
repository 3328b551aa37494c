"""The ExecuTorch runner: a `.pte` written by `omni-ros export` behind the one inference path.

    policy = load_pte("policy.pte")        # policy.pte.json must sit beside it
    out = policy.infer({"images": {...}, "state": ..., "prompt": "..."})

The processor (preprocessing, normalization, tokenization) and the seeded noise
are the ones the eager policy uses (the sidecar carries the config and norm
stats), so a `.pte` and its eager model see identical inputs. With the staged
methods the runner calls `encode_images`, then `prefill` once, and keeps the
prefix KV cache it returns for every `denoise_step` of the Euler loop; a
program with only the fused `sample` method runs the whole loop in one call.

Programs are loaded (and XNNPACK packs its weights) in the constructor, so a
node pays that once at start-up, never per request.

Real-time chunking (`sample(..., rtc=)`, staged programs only): hard prefix inpainting always (no
gradient: the Euler loop out here freezes the prefix around `denoise_step`); guided RTC when the program
has the `guided_step` method (`omni-ros export --rtc`: the vector-Jacobian product traced into the program).
A fused program serves neither (`rtc_methods` is empty).
"""

from __future__ import annotations

import os
import platform
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from omni_ros.backends.exported import exported_policy, staged_sampler, takes_per_token_times
from omni_ros.export.sidecar import PteError, Sidecar, check_compatible, read_sidecar
from omni_ros.policy.families import stage_plan
from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.methods import GUIDED_STEP
from omni_ros.policy.pipeline import InferencePipeline, Sampled, StageClock
from omni_ros.policy.precision.choice import program_choice
from omni_ros.policy.rtc import RtcError, RtcPlan
from omni_ros.typed_config import ConfigError

MODES = ("auto", "staged", "fused")


def installed_executorch_version() -> str:
    from importlib.metadata import version

    return version("executorch")


def _check_runnable(sidecar: Sidecar, source: str, backends: list[str]) -> None:
    """Refuse programs whose backend this machine cannot run, before handing them to the runtime."""
    if sidecar.target == "xnnpack":
        if "XnnpackBackend" not in backends:
            raise PteError(f"{source}: this ExecuTorch runtime has no XNNPACK backend (registered: {backends})")
    elif sidecar.target == "qnn":
        soc = sidecar.target_options.get("soc", "?")
        if "QnnBackend" not in backends:
            raise PteError(f"{source}: exported for QNN ({soc}) but this ExecuTorch runtime has no QNN backend")
        sdk = os.environ.get("QNN_SDK_ROOT", "")
        if platform.machine() != "aarch64" and not (sdk and Path(sdk).is_dir()):
            raise PteError(
                f"{source}: exported for the Qualcomm HTP ({soc}); run it on that device (Android/Linux aarch64 "
                "with the QNN runtime libraries), or set QNN_SDK_ROOT to use the SDK's x86 simulator"
            )
    elif sidecar.target == "cuda":
        from omni_ros.export.cuda import CudaUnavailableError

        if not torch.cuda.is_available():
            raise CudaUnavailableError(f"{source}: exported for CUDA but no CUDA GPU is visible to this process")
        if "CudaBackend" not in backends:
            raise CudaUnavailableError(
                f"{source}: exported for CUDA but this ExecuTorch runtime was built without the CUDA backend"
            )
    else:
        raise PteError(f"{source}: unknown target '{sidecar.target}' in its sidecar")


class ProgramRunner:
    """What a runner of an exported program is, wherever the program runs (here, or program_process.py's child)."""

    # Programs are exported for batch 1 (static shapes): the pipeline runs a batch request by request.
    max_batch = 1
    draws_noise = False
    dtype = torch.float32

    def __init__(self, pte: Path, sidecar: Sidecar, mode: str) -> None:
        self.pte, self.sidecar, self.cfg, self.mode = pte, sidecar, sidecar.model, mode
        # The model family says which methods exist and how one inference chains them.
        self.plan = stage_plan(sidecar.family)
        self.device = torch.device("cuda" if sidecar.target == "cuda" else "cpu")
        self.backend = f"executorch-{sidecar.target}" + ("" if sidecar.quantize == "none" else f"-{sidecar.quantize}")
        self.precision = program_choice(sidecar.quantize, "auto", str(pte)).describe()
        self.rtc_methods: tuple[str, ...] = ()
        self.rtc_refusal = ""


class ExecuTorchRunner(ProgramRunner):
    """Runs the methods of an exported program; the KV cache stays a list of tensors between them."""

    def __init__(self, pte: Path, sidecar: Sidecar, mode: str, num_threads: int = 0) -> None:
        super().__init__(pte, sidecar, mode)
        from executorch.runtime import Runtime

        runtime = Runtime.get()
        _check_runnable(sidecar, str(pte), list(runtime.backend_registry.registered_backend_names))
        if num_threads > 0:
            from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

            _unsafe_reset_threadpool(num_threads)
        needed = self.plan.staged if mode == "staged" else ("sample",)
        # Real-time chunking needs the Euler loop out here (staged); guided RTC also the traced guided step.
        guided = mode == "staged" and GUIDED_STEP in sidecar.methods
        if guided:
            needed = (*needed, GUIDED_STEP)
        if mode == "staged":
            self.rtc_methods = ("guided", "inpaint") if guided else ("inpaint",)
        self.per_token = mode == "staged" and takes_per_token_times(sidecar)
        # A token decoder (pi0-FAST): its greedy loop and detokenizer out here, over its prefill and decode_step.
        self._decode = self.plan.token_decoder(self.cfg, pte.parent) if self.plan.token_decoder else None
        self._generate = self.plan.token_generator(self.cfg) if self.plan.token_generator else None
        # A family whose steps no RTC sampler fits (a token decoder) says why, and is refused RTC at configure.
        if self._decode is not None or self.plan.rtc_refusal:
            self.rtc_methods = ()
            self.rtc_refusal = self.plan.rtc_refusal
        try:
            program = runtime.load_program(pte)
            self._methods = {m: program.load_method(m) for m in needed}
        except Exception as exc:  # the runtime raises plain RuntimeError/ValueError on a bad program
            raise PteError(f"{pte}: ExecuTorch cannot load it: {exc}") from exc
        self._program = program
        self._lock = threading.Lock()

    def _run(self, method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        # The runtime takes dense tensors only (the pixel tensor is a permuted view).
        return list(self._methods[method].execute([x.contiguous() for x in inputs]))

    def sample(
        self, inputs: ModelInputs, noise: torch.Tensor | None, num_steps: int | None, rtc: RtcPlan | None = None
    ) -> Sampled:
        if self._decode is not None:
            if rtc is not None:
                raise RtcError(f"{self.pte}: real-time chunking does not apply: {self.plan.rtc_refusal}")
            with self._lock:
                return self._decode(self._run, inputs)
        if rtc is not None and self.plan.rtc_refusal:
            raise RtcError(f"{self.pte}: real-time chunking does not apply: {self.plan.rtc_refusal}")
        if noise is None or num_steps is None:
            raise ValueError("the ExecuTorch runner needs the sampling noise and the step count")
        if rtc is not None and (rtc.target is None or rtc.request.method not in self.rtc_methods):
            offer = ", ".join(self.rtc_methods) or "none (a fused program)"
            raise RtcError(f"{self.pte}: rtc method '{rtc.request.method}' is not served here (it serves: {offer})")
        with self._lock:  # an ExecuTorch method is not reentrant; callers may share one policy across threads
            clock = StageClock()
            if self.mode == "fused":
                # One call runs encoder, prefill and the loop: the time is reported as denoise_ms.
                clock.lap("embed_prefix_ms")
                clock.lap("prefill_ms")
                actions = self._run("sample", [*self.plan.fused_inputs(self.cfg, inputs), noise])[0].clone()
                clock.lap("denoise_ms")
                return Sampled(actions.numpy(), clock.ms)
            # The family's chaining: the prefix KV cache is computed once and read by every denoising step.
            guided = "guided" in self.rtc_methods
            sample = staged_sampler(self.plan, self.cfg, noise, num_steps, rtc, per_token=self.per_token, guided=guided)
            actions = self.plan.run_staged(self.cfg, self._run, inputs, noise, num_steps, clock, sample)
        return Sampled(actions.numpy(), clock.ms)

    def generate(self, inputs: ModelInputs) -> Any:
        """A token decoder's (pi0-FAST) generated tokens and timings (its `Generated`), the very loop `sample`
        runs, without the detokenizer: what a benchmark on random weights (no decodable chunk) times."""
        if self._generate is None:
            raise ValueError(f"{self.pte}: a {self.sidecar.family} program decodes no tokens")
        with self._lock:
            return self._generate(self._run, inputs)

    def close(self) -> None:
        """Drop the loaded methods and program (and the weights XNNPACK packed for them)."""
        with self._lock:
            self._methods = {}
            self._program = None


def load_pte(
    pte: str | Path,
    *,
    seed: int | None = 0,
    num_steps: int | None = None,
    mode: str = "auto",
    num_threads: int = 0,
    device: str | None = None,
    name: str | None = None,
    camera_names: Sequence[str] | None = None,
    state_dim: int | None = None,
    action_dim: int | None = None,
    domain_id: int | None = None,
    process: bool = False,
) -> InferencePipeline:
    """The policy of an exported program, checked against its sidecar and the configured robot.

    `process`: run the program in a child process (program_process.py), so that it never holds this process's GIL
    (what the policy node's control loop needs); the processor stays here."""
    if mode not in MODES:
        raise ValueError(f"unknown mode '{mode}'; choose one of {', '.join(MODES)}")
    pte = Path(pte)
    sidecar = read_sidecar(pte)
    check_compatible(sidecar, str(pte), camera_names, state_dim, action_dim, installed_executorch_version())
    target_device = "cuda" if sidecar.target == "cuda" else "cpu"
    if device is not None and device.split(":")[0] != target_device:
        raise ConfigError(f"{pte} runs on {target_device} (target {sidecar.target}), not policy.device '{device}'")
    plan = stage_plan(sidecar.family)
    staged = all(m in sidecar.methods for m in plan.staged)
    if mode == "auto":
        mode = "staged" if staged else "fused"
    if mode == "staged" and not staged:
        raise PteError(f"{pte}: staged mode needs methods {list(plan.staged)}, the program has {list(sidecar.methods)}")
    if mode == "fused":
        if "sample" not in sidecar.methods:
            raise PteError(f"{pte}: fused mode needs the 'sample' method, the program has {list(sidecar.methods)}")
        if num_steps is not None and num_steps != sidecar.num_steps:
            raise PteError(
                f"{pte}: its fused 'sample' runs {sidecar.num_steps} Euler steps, configured num_steps is "
                f"{num_steps}; export with --num-steps {num_steps} or use the staged methods"
            )
    if process:
        from omni_ros.backends.program_process import ProgramProcess

        runner: Any = ProgramProcess(pte, sidecar, mode, num_threads)
    else:
        runner = ExecuTorchRunner(pte, sidecar, mode, num_threads)
    fused = mode == "fused"
    return exported_policy(
        sidecar, runner, pte.parent, fused=fused, seed=seed, num_steps=num_steps, name=name, domain_id=domain_id
    )
