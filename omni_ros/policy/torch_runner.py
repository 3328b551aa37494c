"""The PyTorch runner (CPU and CUDA, float32 and bfloat16): eager stages with the prefix KV cache.

Any family's model works here if it has the three inference stages

    embed_prefix(inputs)                            -> prefix, prefix_mask
    prefill(prefix, prefix_mask)                    -> KV cache   (once per inference)
    denoise_step(cache, prefix_mask, state, x, t)   -> velocity   (num_steps times)

Real-time chunking (`sample(..., rtc=)`) works for every such model: guided RTC differentiates through
`denoise_step` (a backward pass per step, so the prefix runs under no_grad, not inference_mode, and its KV
cache enters the graph as a constant); hard inpainting needs no gradient. A model whose config records
training-time RTC (`rtc_max_delay` > 0) takes per-token times and gets its frozen prefix clean.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol, cast

import torch
from torch import nn

from omni_ros import cpu_threads
from omni_ros.cpu_threads import StepThreads
from omni_ros.errors import OmniRosError
from omni_ros.policy.compiled_stages import CompiledStage, CompileError, check_compilable
from omni_ros.policy.image_threads import use_image_threads
from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.pipeline import Sampled, StageClock
from omni_ros.policy.precision import PrecisionChoice, apply_precision
from omni_ros.policy.rtc import METHODS, RtcPlan, autograd_guided_step, rtc_sample
from omni_ros.policy.sampler import euler_sample


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


def resolve_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype '{dtype}'; use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def compact(inputs: ModelInputs) -> ModelInputs:
    """The same inputs without the camera slots and trailing prompt tokens that every batch item masks.

    Masked tokens are excluded from every attention and from the RoPE positions (cumsum of the mask), so
    leaving them out changes no output, only the work: a declared camera the robot lacks is not encoded, and
    a 15-token prompt padded to 48 (pi0) or 200 (pi0.5) costs 15 tokens. Eager only; exported programs keep
    their static shapes.
    """
    cameras = inputs.image_masks.any(dim=0)
    if not bool(cameras.any()):
        return inputs  # nothing to see: keep the shapes, the model's masks take care of it
    valid = inputs.token_mask.any(dim=0).nonzero()
    length = int(valid.max()) + 1 if valid.numel() else 1
    if bool(cameras.all()) and length == inputs.tokens.shape[1]:
        return inputs
    return replace(
        inputs,
        images=inputs.images[:, cameras],
        image_masks=inputs.image_masks[:, cameras],
        tokens=inputs.tokens[:, :length],
        token_mask=inputs.token_mask[:, :length],
    )


class StagedModel(Protocol):
    """The three inference stages a family's model has (see the module docstring)."""

    def embed_prefix(self, inputs: ModelInputs) -> tuple[torch.Tensor, torch.Tensor]: ...

    def prefill(self, x: torch.Tensor, mask: torch.Tensor) -> Any: ...

    def denoise_step(
        self, cache: Any, prefix_mask: torch.Tensor, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor: ...


class TorchRunner:
    """Runs an eager model; the model is moved to the device and dtype once, here."""

    max_batch = None
    draws_noise = False
    # Whether `sample` runs the model's `prefill` and `denoise_step` (what policy.compile compiles); runners with
    # their own loop (pi0-FAST's decoder, X-VLA's head) say no.
    stages_compilable = True
    rtc_methods: tuple[str, ...] = METHODS

    def __init__(
        self,
        model: nn.Module,
        device: str = "cpu",
        dtype: str = "float32",
        compact: bool = True,
        cpu_linear: str = "dense",
        precision: PrecisionChoice | None = None,
        cache_dir: str | None = None,
        label: str = "model",
        compile: bool = False,
        source: str | None = None,
    ) -> None:
        """`source`: the checkpoint folder the model came from (the kernel cache records it; None: not a folder)."""
        if cpu_linear not in ("packed", "dense"):
            raise ValueError(f"cpu_linear: expected 'packed' or 'dense', got {cpu_linear!r}")
        # Leave out what every batch item masks (see `compact`); families whose model needs fixed slots say no.
        self.compact = compact and getattr(model, "compactable", True)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype)
        self.model = model.to(self.device, self.dtype).eval()
        self.backend = f"torch-{self.device.type}" + ("-bf16" if self.dtype == torch.bfloat16 else "")
        # The GEMM kernels (omni_ros/policy/precision): a transform of the built model's linears, from outside.
        choice = precision or PrecisionChoice("fp32", "policy.precision fp32")
        if compile:
            self._check_compilable(choice)
        self.applied = apply_precision(
            self.model, choice, cpu_linear=cpu_linear, cache_dir=cache_dir, label=label, source=source
        )
        self.precision = choice.describe()
        self.packed_linears = self.applied.linears if choice.precision == "fp32" else 0
        # torch's threads during the denoising steps, on a CPU chosen by timing both ways (cpu_threads.StepThreads):
        # with passive waiting, a step's small products and attention over the cached prefix can cost a second
        # thread more wake-ups than it saves (the edge pi0's ten int8 steps: 265 ms on 2 threads, 114 on 1,
        # bench/results/step_threads.json).
        threads = torch.get_num_threads()
        self.step_threads = StepThreads((1, threads)) if self.device.type == "cpu" and threads > 1 else None
        # A guided RTC step (forward and backward through float products) is timed apart: on the AMD EPYC with
        # VNNI the edge pi0's ten guided int8 steps took 1,100 ms on 2 threads against 559 on one
        # (bench/results/realtime_guided_pi0_edge_vnni.json, per-linear kernels).
        self.guided_step_threads = StepThreads((1, threads)) if self.device.type == "cpu" and threads > 1 else None
        # The vision towers, the prefill and the denoising step compiled by TorchInductor on the first inference
        # (omni_ros/policy/compiled_stages.py); every camera slot and prompt token kept, so that each observation
        # gives the graphs their shapes. A graph keeps the thread count it was compiled for, so the step's is chosen
        # here, not timed: compiled, a step is a few fused loops around the GEMMs, a few hundred parallel regions,
        # each of which wakes a sleeping worker under passive waiting. There it runs on one torch thread (a second
        # made a full-size SmolVLA's ten int8 steps 1.25x as long, the edge pi0's 2.2x); where idle workers spin a
        # while (brief, active, the runtime's default) on all of them (0.70x and 0.79x under brief;
        # bench/results/step_threads_compiled*.json), and where idle cores poll while inferring (omni_ros/
        # cpu_idle.py: a sleeping worker's wake is then cheap, and the full-size SmolVLA's ten int8 steps took 300
        # ms on 2 threads against 370 on one, bench/results/step_threads_compiled_smolvla_idle_poll_on.json).
        self.prefill: CompiledStage | None = None
        self.denoise_step: CompiledStage | None = None
        self.compiled_stages: list[CompiledStage] = []
        self.prompt_length: int | None = None  # compiled: the prompt length every call is padded to
        settings = cpu_threads.current()
        passive = settings.wait_policy == "passive"
        if compile:
            self._compile_stages()
            self.step_threads = StepThreads((1,)) if settings.wakes_are_slow and threads > 1 else None
        # The cameras' images through the vision tower on threads of their own, one torch thread each, where
        # waking sleeping OpenMP workers costs a second torch thread its gain (omni_ros/policy/image_threads.py).
        on_torch = self.device.type == "cpu" and self.applied.cache is None  # no XNNPACK methods in the linears
        self.image_threads = use_image_threads(self.model, threads) if passive and on_torch else []

    def _check_compilable(self, choice: PrecisionChoice) -> None:
        """policy.compile refused at configure, before any kernel is built, with the reason."""
        if not self.stages_compilable:
            raise CompileError(
                f"policy.compile: {type(self).__name__} runs its own loop, not a prefill and denoising steps "
                "(pi0, pi0.5 and SmolVLA checkpoints have them); set policy.compile: false"
            )
        check_compilable(self.device)
        if choice.precision == "int8" and choice.kernel == "xnnpack":
            raise CompileError(
                "policy.compile: the int8 linears would run ExecuTorch's XNNPACK methods (int8_kernel xnnpack, what "
                "auto picks on a CPU without AMX), which a compiled graph cannot hold; set policy.int8_kernel: "
                "onednn, or precision bf16 / fp32"
            )

    def _compile_stages(self) -> None:
        for name in getattr(self.model, "per_image_modules", ()):
            # Before the image threads wrap `forward` (below): each thread's part runs the compiled tower.
            module = getattr(self.model, name)
            module.forward = CompiledStage(module.forward, f"{name} tower")
            self.compiled_stages.append(module.forward)
        model = cast(StagedModel, self.model)
        self.prefill = CompiledStage(model.prefill, "prefill")
        self.denoise_step = CompiledStage(model.denoise_step, "denoising step")
        self.compiled_stages += [self.prefill, self.denoise_step]
        self.compact = False
        # Every prompt padded (masked) to the tokenizer's max_tokens, so that it gives the graphs the shapes they
        # were built for: a family that pads to the longest prompt (SmolVLA, as LeRobot does) gave each prompt of
        # another length its own prefix, and those chunks ran the eager prefill and steps.
        tokenizer = getattr(getattr(model, "cfg", None), "tokenizer", None)
        self.prompt_length = None if tokenizer is None else int(tokenizer.max_tokens)
        self.backend += " (compiled)"

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def sample(
        self, inputs: ModelInputs, noise: torch.Tensor | None, num_steps: int | None, rtc: RtcPlan | None = None
    ) -> Sampled:
        if noise is None or num_steps is None:
            raise ValueError("the torch runner needs the sampling noise and step count")
        if rtc is not None and rtc.target is None:
            raise ValueError("the torch runner needs the RTC plan in model units (RtcPlan.target)")
        # nn.Module types its attributes as Tensor | Module; the model's stages are methods.
        model, dtype = cast(StagedModel, self.model), self.dtype

        guided = rtc is not None and rtc.request.method == "guided"
        # Guided RTC differentiates through the step: the eager one (a compiled graph is frozen for inference).
        denoise_step = model.denoise_step if guided or self.denoise_step is None else self.denoise_step

        def step(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            # The Euler state stays float32 (as the reference keeps it): a bfloat16 model sees bfloat16 inputs,
            # but ten steps of bfloat16 accumulation would cost the chunk its precision.
            return denoise_step(cache, prefix_mask, inputs.state, x.to(dtype), t.to(dtype)).float()

        # A guided step's forward runs inside its backward's timing (guided_step below), not on its own.
        timed = None if guided else self.step_threads

        def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return step(x, t) if timed is None else timed.step(lambda: step(x, t))

        guided_step = None
        if guided and self.guided_step_threads is not None:
            by_autograd, guided_timed = autograd_guided_step(velocity), self.guided_step_threads

            def guided_step(x: torch.Tensor, t: torch.Tensor, *guidance: torch.Tensor) -> torch.Tensor:
                return guided_timed.step(lambda: by_autograd(x, t, *guidance))

        with torch.no_grad() if guided else torch.inference_mode():
            clock = StageClock(self._sync)
            # The prefix embeds in inference mode on every path (guided RTC differentiates through the steps
            # only), so the compiled vision tower and prefill see the same kind of tensors whatever the request:
            # a compiled graph guards on it, and an inference tensor where it was built for a plain one (or the
            # reverse) is a call it cannot serve.
            if self.compact:
                inputs = compact(inputs)
            elif self.prompt_length is not None:
                inputs = inputs.padded_prompt(self.prompt_length)
            with torch.inference_mode():
                prefix, prefix_mask = model.embed_prefix(inputs)
            clock.lap("embed_prefix_ms")
            if self.prefill is not None:
                # Outside inference mode, so that one compiled prefill serves guided RTC too (whose steps
                # differentiate through the eager step with this cache as a constant, which an inference tensor
                # cannot be) and every other chunk.
                with torch.inference_mode(False), torch.no_grad():
                    cache = self.prefill(prefix, prefix_mask)
            else:
                cache = model.prefill(prefix, prefix_mask)
            clock.lap("prefill_ms")
            x = noise.float()
            if torch.is_inference_mode_enabled() and not x.is_inference():
                # Noise the caller gave is a plain tensor, noise drawn here an inference one, and every later
                # Euler state is one: the same kind at every step whoever drew the noise (see above).
                x = x.clone()
            if rtc is None or rtc.target is None:
                chunk = euler_sample(
                    velocity, x, num_steps, getattr(getattr(model, "cfg", None), "euler_time", "exact")
                )
            else:
                clean = getattr(getattr(model, "cfg", None), "rtc_max_delay", 0) > 0
                target = rtc.target.float()
                chunk = rtc_sample(velocity, x, num_steps, target, rtc.request, clean, guided_step)
            actions = chunk.detach().cpu().numpy()
            clock.lap("denoise_ms")
        for stage in self.compiled_stages:
            stage.seal()  # compiled for this first inference's calls; a different call later runs eager
        return Sampled(actions, clock.ms)

    def close(self) -> None:
        """The image threads' pool; the weights go with the object."""
        for split in self.image_threads:
            split.close()
