"""A policy's inference stages as separate `nn.Module`s with flat tensor signatures: one per program method.

Every exporter (ExecuTorch `.pte` today, ONNX next) and every runtime over such methods works through one
small interface that each model family supplies, its `StagePlan` (`stage_plan(cfg)`):

    methods         the method names it exports, the fused "sample" last
    staged          the subset `run_staged` calls
    signatures(cfg, batch) -> {method: MethodSignature}   static input/output specs (what a sidecar records)
    module(model, method, num_steps) -> nn.Module         the wrapper to trace; its forward takes the inputs
                                                          of its signature, in order, and returns its outputs
    example_inputs(signature, cfg, seed) -> tensors       plausible inputs (tracing, calibration, tests)
    run_staged(cfg, run, inputs, noise, num_steps, clock) -> actions
                    one inference over the staged methods, `run(method, tensors) -> list of tensors` being the
                    runtime's call; it computes the prefix cache once and reuses it for every denoising step,
                    and laps `clock` at embed_prefix_ms, prefill_ms and denoise_ms
    fused_inputs(cfg, inputs) -> tensors                  the inputs of "sample" before the noise

The pi0 family (below):

    encode_images(images [, tokens, token_mask])            -> image_tokens   (the prompt only with vision.film)
    prefill(image_tokens, image_masks, tokens, token_mask)  -> k_0, v_0, k_1, v_1, ...   (the prefix KV cache)
    denoise_step(prefix_mask, state, x_t, t, k_0, v_0, ...) -> velocity
    sample(images, image_masks, tokens, token_mask, state, noise) -> actions   (the whole Euler loop, fused)

SmolVLA: omni_ros.policy.smolvla.stages. Shapes are static (batch 1, the config's cameras, prompt length and
horizon): every backend plans memory for them and QNN requires it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.pi0.configuration import ModelConfig
from omni_ros.policy.pi0.modeling import Pi0Model
from omni_ros.policy.pipeline import StageClock
from omni_ros.policy.sampler import euler_sample

# The pi0 family's methods (each family's are in its StagePlan).
METHODS = ("encode_images", "prefill", "denoise_step", "sample")
STAGED = ("encode_images", "prefill", "denoise_step")
RunMethod = Callable[[str, list[torch.Tensor]], list[torch.Tensor]]
# A runtime's sampler over the staged methods, `sample(velocity, guided) -> actions`: velocity(x_t, t) runs
# denoise_step over the prefix cache, guided(x_t, t, target, weights, weight) the exported guided RTC step
# (where the program has one). None: plain Euler steps.
SampleFn = Callable[[Callable[..., torch.Tensor], Callable[..., torch.Tensor]], torch.Tensor]
# Exported only when asked for (`omni-ros export --rtc`): the guided real-time-chunking step (export/rtc_step.py).
GUIDED_STEP = "guided_step"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32", "int64" or "bool"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["shape"] = list(self.shape)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> TensorSpec:
        return cls(data["name"], tuple(data["shape"]), data["dtype"])


@dataclass(frozen=True)
class MethodSignature:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def to_dict(self) -> dict:
        return {"inputs": [s.to_dict() for s in self.inputs], "outputs": [s.to_dict() for s in self.outputs]}

    @classmethod
    def from_dict(cls, name: str, data: dict) -> MethodSignature:
        specs = (tuple(TensorSpec.from_dict(s) for s in data[k]) for k in ("inputs", "outputs"))
        return cls(name, *specs)


def prefix_mask_of(image_masks: torch.Tensor, token_mask: torch.Tensor, tokens_per_camera: int) -> torch.Tensor:
    """Validity (B, P) of the prefix [image tokens, prompt tokens], as `Pi0Model.embed_prefix` builds it."""
    return torch.cat([image_masks.repeat_interleave(tokens_per_camera, dim=1), token_mask], dim=1)


def kv_names(cfg: ModelConfig) -> list[str]:
    return [f"{kind}_{i}" for i in range(cfg.backbone.depth) for kind in ("k", "v")]


class Stage(nn.Module):
    """One program method: `run(model, *inputs)` as the module torch.export (or torch.onnx) traces."""

    def __init__(self, model: nn.Module, run: Callable[..., Any]) -> None:
        super().__init__()
        self.model, self.run = model, run

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.run(self.model, *inputs)


def flat_cache(cache: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    """A per-layer KV cache as method outputs: k_0, v_0, k_1, v_1, ..."""
    return tuple(t for kv in cache for t in kv)


def paired(kv: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Method inputs k_0, v_0, k_1, v_1, ... back into a per-layer KV cache."""
    return [(kv[i], kv[i + 1]) for i in range(0, len(kv), 2)]


def sample_stage(model: nn.Module, num_steps: int) -> Stage:
    """The fused loop: (images, image_masks, tokens, token_mask, state, noise) -> actions, for any family."""
    return Stage(model, lambda m, *x: m.sample(ModelInputs(*x[:5]), x[5], num_steps=num_steps))


def pi0_signatures(cfg: ModelConfig, batch: int = 1) -> dict[str, MethodSignature]:
    """Input/output specs of every pi0 method for `cfg`."""
    c, s, v = len(cfg.camera_names), cfg.vision.image_size, cfg.vision.num_tokens
    t, p, w = cfg.tokenizer.max_tokens, cfg.prefix_len, cfg.backbone.width
    kv_shape = (batch, cfg.backbone.num_kv_heads, p, cfg.backbone.head_dim)
    kv = tuple(TensorSpec(n, kv_shape, "float32") for n in kv_names(cfg))
    model_inputs = model_input_specs(batch, c, s, t, cfg.model_state_dim)
    images, image_masks, tokens, token_mask, state = model_inputs
    chunk = (batch, cfg.action_horizon, cfg.model_action_dim)
    image_tokens = TensorSpec("image_tokens", (batch, c * v, w), "float32")
    specs = [
        MethodSignature(
            "encode_images", (images, tokens, token_mask) if cfg.vision.film else (images,), (image_tokens,)
        ),
        MethodSignature("prefill", (image_tokens, image_masks, tokens, token_mask), kv),
        MethodSignature(
            "denoise_step",
            (
                TensorSpec("prefix_mask", (batch, p), "bool"),
                state,
                TensorSpec("x_t", chunk, "float32"),
                # Per-token times for a model trained with training-time RTC (its clean prefix has t = 0).
                TensorSpec("t", (batch, cfg.action_horizon) if cfg.rtc_max_delay else (batch,), "float32"),
                *kv,
            ),
            (TensorSpec("velocity", chunk, "float32"),),
        ),
        fused_signature(model_inputs, chunk),
    ]
    return {m.name: m for m in specs}


def model_input_specs(
    batch: int, cameras: int, image_size: int, max_tokens: int, state_dim: int
) -> tuple[TensorSpec, ...]:
    """The specs of `ModelInputs` as methods take them, in its field order: images, image_masks, tokens,
    token_mask, state."""
    return (
        TensorSpec("images", (batch, cameras, 3, image_size, image_size), "float32"),
        TensorSpec("image_masks", (batch, cameras), "bool"),
        TensorSpec("tokens", (batch, max_tokens), "int64"),
        TensorSpec("token_mask", (batch, max_tokens), "bool"),
        TensorSpec("state", (batch, state_dim), "float32"),
    )


def fused_signature(inputs: tuple[TensorSpec, ...], chunk: tuple[int, ...]) -> MethodSignature:
    """`sample`, the whole loop in one method: the staged methods' model inputs and the noise -> actions."""
    return MethodSignature(
        "sample", (*inputs, TensorSpec("noise", chunk, "float32")), (TensorSpec("actions", chunk, "float32"),)
    )


def example_inputs(signature: MethodSignature, cfg: Any, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Plausible inputs for `signature`: pixels in [-1, 1], valid token ids, masks with padding, t in (0, 1]."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for spec in signature.inputs:
        if spec.dtype == "bool":
            mask = torch.ones(spec.shape, dtype=torch.bool)
            if spec.name == "token_mask" or spec.name == "prefix_mask":
                mask[..., spec.shape[-1] - max(1, spec.shape[-1] // 4) :] = False  # a padded prompt
            out.append(mask)
        elif spec.dtype == "int64":
            out.append(torch.randint(0, min(cfg.vocab_size, 256), spec.shape, generator=gen))
        elif spec.name == "t":
            out.append(torch.rand(spec.shape, generator=gen) * 0.9 + 0.1)
        elif spec.name == "images":
            out.append(torch.rand(spec.shape, generator=gen) * 2 - 1)
        else:
            out.append(torch.randn(spec.shape, generator=gen))
    return tuple(out)


def pi0_method_module(model: Pi0Model, name: str, num_steps: int | None = None) -> nn.Module:
    """The wrapper module exporting pi0 method `name` of `model`."""
    if name == "sample":
        return sample_stage(model, num_steps or model.cfg.num_steps)
    runs: dict[str, Callable[..., Any]] = {
        "encode_images": lambda m, images, *prompt: m.encode_images(images, *prompt),
        "prefill": lambda m, image_tokens, image_masks, tokens, token_mask: flat_cache(
            m.prefill(*m.join_prefix(image_tokens, image_masks, tokens, token_mask))
        ),
        "denoise_step": lambda m, mask, state, x_t, t, *kv: m.denoise_step(paired(kv), mask, state, x_t, t),
    }
    if name not in runs:
        raise ValueError(f"unknown method '{name}'; choose from {', '.join(METHODS)}")
    return Stage(model, runs[name])


def pi0_run_staged(
    cfg: ModelConfig,
    run: RunMethod,
    inputs: ModelInputs,
    noise: torch.Tensor,
    num_steps: int,
    clock: StageClock,
    sample: SampleFn | None = None,
) -> torch.Tensor:
    """encode_images, prefill once, then the Euler loop over denoise_step reading the returned KV cache."""
    prompt = [inputs.tokens, inputs.token_mask] if cfg.vision.film else []
    image_tokens = run("encode_images", [inputs.images, *prompt])[0]
    clock.lap("embed_prefix_ms")
    cache = run("prefill", [image_tokens, inputs.image_masks, inputs.tokens, inputs.token_mask])
    clock.lap("prefill_ms")
    prefix_mask = prefix_mask_of(inputs.image_masks, inputs.token_mask, cfg.vision.num_tokens)

    def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return run("denoise_step", [prefix_mask, inputs.state, x, t, *cache])[0]

    def guided(x: torch.Tensor, t: torch.Tensor, target: torch.Tensor, weights: torch.Tensor, weight: torch.Tensor):
        return run(GUIDED_STEP, [prefix_mask, inputs.state, x, t, target, weights, weight, *cache])[0]

    actions = euler_sample(velocity, noise, num_steps) if sample is None else sample(velocity, guided)
    clock.lap("denoise_ms")
    return actions


@dataclass(frozen=True)
class StagePlan:
    """What a model family supplies to exporters and method runtimes (see the module docstring)."""

    family: str
    methods: tuple[str, ...]
    staged: tuple[str, ...]
    signatures: Callable[..., dict[str, MethodSignature]]
    module: Callable[[Any, str, int | None], nn.Module]  # (the family's model, method, num_steps)
    example_inputs: Callable[..., tuple[torch.Tensor, ...]]
    run_staged: Callable[..., torch.Tensor]  # (cfg, run, inputs, noise, num_steps, clock, sample=None)
    fused_inputs: Callable[[Any, ModelInputs], list[torch.Tensor]]
    # Methods exported only when asked for (not in the default `methods`).
    optional: tuple[str, ...] = ()

    def check_methods(self, methods: tuple[str, ...] | list[str]) -> None:
        known = (*self.methods, *self.optional)
        unknown = [m for m in methods if m not in known]
        if unknown or not methods:
            raise ValueError(f"unknown methods {unknown} for a {self.family} model; choose from {', '.join(known)}")


PI0 = StagePlan(
    family="pi0",
    methods=METHODS,
    staged=STAGED,
    signatures=pi0_signatures,
    module=pi0_method_module,
    example_inputs=example_inputs,
    run_staged=pi0_run_staged,
    fused_inputs=lambda cfg, inputs: list(inputs.as_tuple()),
    optional=(GUIDED_STEP,),
)


def stage_plan(cfg_or_family: Any) -> StagePlan:
    """The StagePlan of a family (its name, or a model config whose class names it)."""
    family = cfg_or_family if isinstance(cfg_or_family, str) else getattr(cfg_or_family, "family", "pi0")
    if family == "pi0":
        return PI0
    if family == "smolvla":
        from omni_ros.policy.smolvla.stages import SMOLVLA

        return SMOLVLA
    raise ValueError(f"model family '{family}' has no exportable stages")


def signatures(cfg: Any, batch: int = 1) -> dict[str, MethodSignature]:
    """Input/output specs of every method for `cfg` (what the sidecar records and the runtime checks)."""
    return stage_plan(cfg).signatures(cfg, batch)


def method_module(model: nn.Module, name: str, num_steps: int | None = None) -> nn.Module:
    """The wrapper module exporting method `name` of `model` (any family)."""
    return stage_plan(model.cfg).module(model, name, num_steps)
