"""The pi0 family's inference stages as program methods (its `StagePlan`, see omni_ros.policy.methods):

encode_images(images [, tokens, token_mask])            -> image_tokens   (the prompt only with vision.film)
prefill(image_tokens, image_masks, tokens, token_mask)  -> k_0, v_0, k_1, v_1, ...   (the prefix KV cache)
denoise_step(prefix_mask, state, x_t, t, k_0, v_0, ...) -> velocity
sample(images, image_masks, tokens, token_mask, state, noise) -> actions   (the whole Euler loop, fused)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.methods import (
    GUIDED_STEP,
    MethodSignature,
    RunMethod,
    SampleFn,
    Stage,
    StagePlan,
    TensorSpec,
    example_inputs,
    flat_cache,
    fused_signature,
    model_input_specs,
    paired,
    sample_stage,
)
from omni_ros.policy.pi0.configuration import ModelConfig
from omni_ros.policy.pi0.modeling import Pi0Model
from omni_ros.policy.pipeline import StageClock
from omni_ros.policy.sampler import euler_sample

# The pi0 family's methods (each family's are in its StagePlan).
METHODS = ("encode_images", "prefill", "denoise_step", "sample")
STAGED = ("encode_images", "prefill", "denoise_step")


def prefix_mask_of(image_masks: torch.Tensor, token_mask: torch.Tensor, tokens_per_camera: int) -> torch.Tensor:
    """Validity (B, P) of the prefix [image tokens, prompt tokens], as `Pi0Model.embed_prefix` builds it."""
    return torch.cat([image_masks.repeat_interleave(tokens_per_camera, dim=1), token_mask], dim=1)


def kv_names(cfg: ModelConfig) -> list[str]:
    return [f"{kind}_{i}" for i in range(cfg.backbone.depth) for kind in ("k", "v")]


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

    actions = euler_sample(velocity, noise, num_steps, cfg.euler_time) if sample is None else sample(velocity, guided)
    clock.lap("denoise_ms")
    return actions


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
