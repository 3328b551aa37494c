"""A policy's inference stages as separate `nn.Module`s with flat tensor signatures: one per program method.

What a model family's stages are is a policy concept: each family supplies its `StagePlan` (pi0:
omni_ros.policy.pi0.stages, SmolVLA: omni_ros.policy.smolvla.stages; `omni_ros.policy.families.stage_plan(cfg)`
finds it), and every exporter (ExecuTorch `.pte`, ONNX) and every runtime over such methods consumes it:

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

Shapes are static (batch 1, the config's cameras, prompt length and horizon): every backend plans memory for
them and QNN requires it. This module holds what every family shares; it knows no family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import nn

from omni_ros.policy.inputs import ModelInputs

RunMethod = Callable[[str, list[torch.Tensor]], list[torch.Tensor]]
# A runtime's sampler over the staged methods, `sample(velocity, guided) -> actions`: velocity(x_t, t) runs
# denoise_step over the prefix cache, guided(x_t, t, target, weights, weight) the exported guided RTC step
# (where the program has one; X-VLA's clean form: guided(x_t, t, target, target_high, weights, scale)).
# None: plain Euler steps.
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
    # A token decoder's inference (pi0-FAST), in place of run_staged's Euler loop:
    # (cfg, folder of the exported files) -> decode(run, inputs) -> Sampled (its chunk, timings and extras).
    token_decoder: Callable[[Any, Any], Callable[[RunMethod, ModelInputs], Any]] | None = None
    # Its token loop alone: cfg -> generate(run, inputs) -> the generated tokens and timings, not detokenized
    # (the runners' `generate`: what a benchmark on random weights, which form no decodable chunk, times).
    token_generator: Callable[[Any], Callable[[RunMethod, ModelInputs], Any]] | None = None
    # Why real-time chunking does not apply, where it does not (a token decoder): said at configure time.
    rtc_refusal: str = ""
    # A family whose step is not a velocity (X-VLA's clean estimate) samples its own way in a runtime:
    # (cfg, noise, num_steps, rtc) -> the `sample` its run_staged takes (both RTC methods).
    # None: the runtimes' Euler and RTC samplers over the velocity (omni_ros/backends/exported.py).
    sampler: Callable[..., SampleFn] | None = None
    # What the guided step (GUIDED_STEP, export/rtc_step.py) computes from denoise_step: "velocity" (u - weight g,
    # inputs target, weights, weight) or "clean" for a step that predicts the clean action (x0_hat + scale g,
    # inputs target, target_high, weights, scale: omni_ros.policy.rtc.autograd_guided_clean).
    guidance: Literal["velocity", "clean"] = "velocity"

    def check_methods(self, methods: tuple[str, ...] | list[str]) -> None:
        known = (*self.methods, *self.optional)
        unknown = [m for m in methods if m not in known]
        if unknown or not methods:
            raise ValueError(f"unknown methods {unknown} for a {self.family} model; choose from {', '.join(known)}")
