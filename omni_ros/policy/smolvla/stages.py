"""SmolVLA's inference stages as program methods (its `StagePlan`, see omni_ros.policy.methods):

    encode_image(image)                                            -> image_tokens   (ONE camera, scaled)
    prefill(image_tokens, image_masks, tokens, token_mask, state)  -> k_0, v_0, ...  (per expert layer; cross
                                                                      layers' already through the expert's k/v)
    denoise_step(prefix_mask, x_t, t, k_0, v_0, ...)               -> velocity
    sample(images, image_masks, tokens, token_mask, state, noise)  -> actions        (the whole loop, fused)
    guided_step(prefix_mask, x_t, t, target, weights, weight, k_0, v_0, ...) -> guided velocity (optional:
                                                                      `omni-ros export --rtc`, export/rtc_step.py)

One camera per `encode_image` call: the staged runtime encodes only the cameras an observation has (a missing
camera's slot gets zeros, masked out of the prefix), so the vision cost follows the cameras present. The fused
`sample`, having static shapes, encodes every slot and masks the missing ones (the same result). The prompt is
padded to max_tokens: a static program needs one length, and padding is masked out.
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
from omni_ros.policy.pipeline import StageClock
from omni_ros.policy.sampler import euler_sample
from omni_ros.policy.smolvla.configuration import SmolVLAConfig
from omni_ros.policy.smolvla.modeling import SmolVLAModel, prefix_mask_of

METHODS = ("encode_image", "prefill", "denoise_step", "sample")
STAGED = ("encode_image", "prefill", "denoise_step")


def signatures(cfg: SmolVLAConfig, batch: int = 1) -> dict[str, MethodSignature]:
    c, s, n, w = len(cfg.camera_names), cfg.tile_size, cfg.tokens_per_camera, cfg.text.width
    t, p = cfg.tokenizer.max_tokens, cfg.prefix_len
    kv_shape = (batch, cfg.text.num_kv_heads, p, cfg.text.head_dim)
    kv = tuple(
        TensorSpec(f"{kind}_{i}", kv_shape, "float32") for i in range(len(cfg.layer_plan())) for kind in ("k", "v")
    )
    model_inputs = model_input_specs(batch, c, s, t, cfg.max_state_dim)
    _, image_masks, tokens, token_mask, state = model_inputs
    chunk = (batch, cfg.action_horizon, cfg.max_action_dim)
    specs = [
        MethodSignature(
            "encode_image",
            (TensorSpec("image", (batch, 3, s, s), "float32"),),
            (TensorSpec("image_tokens", (batch, n, w), "float32"),),
        ),
        MethodSignature(
            "prefill",
            (TensorSpec("image_tokens", (batch, c * n, w), "float32"), image_masks, tokens, token_mask, state),
            kv,
        ),
        MethodSignature(
            "denoise_step",
            (
                TensorSpec("prefix_mask", (batch, p), "bool"),
                TensorSpec("x_t", chunk, "float32"),
                TensorSpec("t", (batch,), "float32"),
                *kv,
            ),
            (TensorSpec("velocity", chunk, "float32"),),
        ),
        fused_signature(model_inputs, chunk),
    ]
    return {m.name: m for m in specs}


def smolvla_example_inputs(signature: MethodSignature, cfg: SmolVLAConfig, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """As the generic ones, with SmolVLA's prefix mask (images and state valid, the prompt padded), pixels
    in [-1, 1] for the single-camera input too."""
    out = list(example_inputs(signature, cfg, seed))
    for i, spec in enumerate(signature.inputs):
        if spec.name == "image":
            out[i] = torch.rand(spec.shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1
        elif spec.name == "prefix_mask":
            b, t = spec.shape[0], cfg.tokenizer.max_tokens
            token_mask = torch.zeros(b, t, dtype=torch.bool)
            token_mask[:, : t - max(1, t // 4)] = True
            out[i] = prefix_mask_of(
                torch.ones(b, len(cfg.camera_names), dtype=torch.bool), token_mask, cfg.tokens_per_camera
            )
    return tuple(out)


def method_module(model: SmolVLAModel, name: str, num_steps: int | None = None) -> nn.Module:
    if name == "sample":
        return sample_stage(model, num_steps or model.cfg.num_steps)
    runs: dict[str, Callable[..., Any]] = {
        "encode_image": lambda m, image: m.embed_images(image),
        "prefill": lambda m, image_tokens, image_masks, tokens, token_mask, state: flat_cache(
            m.prefill(*m.join_prefix(image_tokens, image_masks, tokens, token_mask, state))
        ),
        "denoise_step": lambda m, prefix_mask, x_t, t, *kv: m.expert(paired(kv), prefix_mask, x_t, t),
    }
    if name not in runs:
        raise ValueError(f"unknown method '{name}'; choose from {', '.join(METHODS)}")
    return Stage(model, runs[name])


def static_prompt(cfg: SmolVLAConfig, inputs: ModelInputs) -> ModelInputs:
    """`inputs` with the prompt right-padded (masked) to max_tokens, the length of the programs' signature."""
    return inputs.padded_prompt(cfg.tokenizer.max_tokens)


def run_staged(
    cfg: SmolVLAConfig,
    run: RunMethod,
    inputs: ModelInputs,
    noise: torch.Tensor,
    num_steps: int,
    clock: StageClock,
    sample: SampleFn | None = None,
) -> torch.Tensor:
    inputs = static_prompt(cfg, inputs)
    n, w = cfg.tokens_per_camera, cfg.text.width
    parts = []
    for i in range(inputs.images.shape[1]):
        if bool(inputs.image_masks[0, i]):
            # Cloned: a runtime may hand back its output buffer, which the next camera's call overwrites.
            parts.append(run("encode_image", [inputs.images[:, i]])[0].clone())
        else:  # a missing camera: masked out of the prefix, its tokens never read
            parts.append(torch.zeros(1, n, w, dtype=inputs.images.dtype))
    clock.lap("embed_prefix_ms")
    image_tokens = torch.cat(parts, dim=1)
    cache = run("prefill", [image_tokens, inputs.image_masks, inputs.tokens, inputs.token_mask, inputs.state])
    clock.lap("prefill_ms")
    prefix_mask = prefix_mask_of(inputs.image_masks, inputs.token_mask, n)

    def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return run("denoise_step", [prefix_mask, x, t, *cache])[0]

    def guided(x: torch.Tensor, t: torch.Tensor, target: torch.Tensor, weights: torch.Tensor, weight: torch.Tensor):
        return run(GUIDED_STEP, [prefix_mask, x, t, target, weights, weight, *cache])[0]

    actions = euler_sample(velocity, noise, num_steps, cfg.euler_time) if sample is None else sample(velocity, guided)
    clock.lap("denoise_ms")
    return actions


SMOLVLA = StagePlan(
    family="smolvla",
    methods=METHODS,
    staged=STAGED,
    signatures=signatures,
    module=method_module,
    example_inputs=smolvla_example_inputs,
    run_staged=run_staged,
    fused_inputs=lambda cfg, inputs: list(static_prompt(cfg, inputs).as_tuple()),
    optional=(GUIDED_STEP,),
)
