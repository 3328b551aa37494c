"""X-VLA's inference stages as program methods (its `StagePlan`, see omni_ros.policy.methods):

    encode(images, image_masks, tokens, domain_id)              -> context  (the head's tokens, projected)
    denoise_step(context, domain_id, state, x_t, t)             -> clean    (the network's clean estimate)
    sample(images, image_masks, tokens, state, domain_id, noise) -> actions (the whole loop, fused)
    guided_step(context, domain_id, state, x_t, t, target, target_high, weights, scale) -> guided clean
        (optional: `omni-ros export --rtc`; the x0 form's guided RTC estimate, omni_ros.policy.rtc.guided_clean)

`domain_id` (B,) int64 is an input of every method, so one program serves every embodiment of a
cross-embodiment checkpoint (the processor checks it against the checkpoint's domains before any program runs).
X-VLA attends to every prompt position, pads too, so there is no token mask input.

X-VLA's sampler is not Euler on a velocity: each step rebuilds x_t = noise * t + action * (1 - t) from the
previous clean estimate (`XVLAModel.denoise`). `run_staged` runs that loop over `denoise_step` and applies the
action space's postprocess (sigmoid grippers, real width) at the end, as eager does inside the model; the fused
`sample` has it traced in. Its output is the action space's width, not the noise's.

Static shapes: every camera slot (num_views) goes through the vision tower and the missing ones' tokens are
zeroed (eager skips them and writes zeros: the same tokens); the image size is the checkpoint's
resize_imgs_with_padding, so a checkpoint without one has no program form.

Real-time chunking: a runtime's own RTC samplers are the velocity form, so the plan hands runtimes X-VLA's
(`staged_sampler`), both methods as the torch backend runs them (omni_ros.policy.xvla.rtc_hooks): hard
inpainting of the prefix's clean estimates, and guided RTC through the program's `guided_step` (the
vector-Jacobian product through the head, traced ahead of time by export/rtc_step.py) where it was exported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.methods import GUIDED_STEP, MethodSignature, RunMethod, SampleFn, Stage, StagePlan, TensorSpec
from omni_ros.policy.pipeline import StageClock
from omni_ros.policy.rtc import GuidedCleanFn, RtcPlan
from omni_ros.policy.xvla.action_space import build_action_space
from omni_ros.policy.xvla.configuration import XVLAConfig
from omni_ros.policy.xvla.modeling import CleanStep, HeadContext, XVLAModel
from omni_ros.policy.xvla.rtc_hooks import estimate_hook, keep_old_prefix

METHODS = ("encode", "denoise_step", "sample")
STAGED = ("encode", "denoise_step")


def _image_size(cfg: XVLAConfig) -> tuple[int, int]:
    if not cfg.resize:
        raise ValueError(
            "this X-VLA checkpoint has no resize_imgs_with_padding: a program needs one image size; "
            "serve it with the torch backend"
        )
    return int(cfg.resize[0]), int(cfg.resize[1])


def context_len(cfg: XVLAConfig) -> int:
    """Tokens of the head's context: the first view and the prompt (BART), then the other views."""
    n = cfg.tokens_per_camera
    assert n is not None  # _image_size refused a checkpoint without a resize
    return n + cfg.tokenizer.max_tokens + (cfg.num_views - 1) * n


def action_width(cfg: XVLAConfig) -> int:
    """The width of an output chunk: the action space's (after its real-width cut)."""
    space = build_action_space(cfg.action_mode, cfg.action_dim, cfg.model_dim_action)
    return space.real_dim if space.real_dim is not None else space.dim_action


def signatures(cfg: XVLAConfig, batch: int = 1) -> dict[str, MethodSignature]:
    h, w = _image_size(cfg)
    images = TensorSpec("images", (batch, cfg.num_views, 3, h, w), "float32")
    image_masks = TensorSpec("image_masks", (batch, cfg.num_views), "bool")
    tokens = TensorSpec("tokens", (batch, cfg.tokenizer.max_tokens), "int64")
    state = TensorSpec("state", (batch, cfg.state_dim), "float32")
    domain = TensorSpec("domain_id", (batch,), "int64")
    noise = TensorSpec("noise", (batch, cfg.action_horizon, cfg.model_dim_action), "float32")
    context = TensorSpec("context", (batch, context_len(cfg), cfg.head.width), "float32")
    specs = [
        MethodSignature("encode", (images, image_masks, tokens, domain), (context,)),
        MethodSignature(
            "denoise_step",
            (context, domain, state, TensorSpec("x_t", noise.shape, "float32"), TensorSpec("t", (batch,), "float32")),
            (TensorSpec("clean", noise.shape, "float32"),),
        ),
        MethodSignature(
            "sample",
            (images, image_masks, tokens, state, domain, noise),
            (TensorSpec("actions", (batch, cfg.action_horizon, action_width(cfg)), "float32"),),
        ),
    ]
    return {m.name: m for m in specs}


def xvla_example_inputs(signature: MethodSignature, cfg: XVLAConfig, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Plausible inputs: token ids in BART's vocabulary, domains the checkpoint has, the first camera present and
    the last missing (the processor stacks the present ones first; the masking is traced), t in (0, 1]."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for spec in signature.inputs:
        if spec.name == "domain_id":
            out.append(torch.randint(0, cfg.head.num_domains, spec.shape, generator=gen))
        elif spec.name == "tokens":
            out.append(torch.randint(0, min(cfg.text.vocab_size, 256), spec.shape, generator=gen))
        elif spec.name == "image_masks":
            mask = torch.ones(spec.shape, dtype=torch.bool)
            if spec.shape[-1] > 1:
                mask[..., -1] = False
            out.append(mask)
        elif spec.name == "images":
            out.append(torch.randn(spec.shape, generator=gen))  # ImageNet-normalized pixels
        elif spec.name == "t":
            out.append(torch.rand(spec.shape, generator=gen) * 0.9 + 0.1)
        else:
            out.append(torch.randn(spec.shape, generator=gen))
    return tuple(out)


def encode(
    model: XVLAModel, images: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor, domain: torch.Tensor
) -> torch.Tensor:
    """`XVLAModel.encode` in static shapes: every slot through the vision tower, the missing ones zeroed (eager
    writes zeros for them without encoding: the same tokens)."""
    b, views = images.shape[:2]
    feats = model.image_tokens(images.flatten(0, 1)).view(b, views, -1, model.cfg.vision.projection_dim)
    feats = torch.where(image_masks[:, :, None, None], feats, torch.zeros_like(feats))
    encoder = model.vlm.language_model.encoder
    text = encoder.embed_tokens(tokens).to(feats.dtype) * encoder.embed_scale
    vlm = encoder(torch.cat([feats[:, 0], text], dim=1))
    aux = feats[:, 1:].reshape(b, -1, feats.shape[-1])
    return model.transformer.project(vlm, aux, domain)


def denoise_step(
    model: XVLAModel,
    context: torch.Tensor,
    domain: torch.Tensor,
    state: torch.Tensor,
    x_t: torch.Tensor,
    t: torch.Tensor,
) -> torch.Tensor:
    """One network call of `XVLAModel.denoise` (the staged method): handed the context alone, it prepares the
    head's step-invariant part at each call."""
    return _clean(model, model.transformer.prepare(context, domain, x_t.shape[1]), domain, state, x_t, t)


def _clean(
    model: XVLAModel, head: HeadContext, domain: torch.Tensor, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor
) -> torch.Tensor:
    """The action space's preprocess, then the head's clean estimate from the chunk's prepared context."""
    proprio, x = model.action_space.preprocess(model.proprio(state), x_t)
    return model.transformer.step(head, domain, x, proprio, t)


def clean_loop(step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], noise: torch.Tensor, num_steps: int):
    """`XVLAModel.denoise`'s loop over `step(x_t, t) -> clean estimate`: x_t rebuilt from the noise and the
    previous estimate each step, t = i / steps from 1 down; the last estimate, before the action space's
    postprocess."""
    action = torch.zeros_like(noise)
    steps = max(1, int(num_steps))
    for i in range(steps, 0, -1):
        t = torch.full((noise.shape[0],), i / steps, dtype=noise.dtype, device=noise.device)
        x_t = noise * t[:, None, None] + action * (1 - t)[:, None, None]
        action = step(x_t, t)
    return action


def _sample(model: XVLAModel, steps: int, images, image_masks, tokens, state, domain, noise) -> torch.Tensor:
    """The fused loop. Each step pads the state itself, as `denoise_step` does (one padded proprio read by every
    step's gripper zeroing is a pass-through XNNPACK refuses to lower); the same arithmetic as eager's."""
    context = encode(model, images, image_masks, tokens, domain)
    head = model.transformer.prepare(context, domain, noise.shape[1])
    clean = clean_loop(lambda x_t, t: _clean(model, head, domain, state, x_t, t), noise, steps)
    return model.action_space.postprocess(clean)


def method_module(model: XVLAModel, name: str, num_steps: int | None = None) -> nn.Module:
    steps = num_steps or model.cfg.num_steps
    runs: dict[str, Callable[..., Any]] = {
        "encode": encode,
        "denoise_step": denoise_step,
        "sample": lambda m, *inputs: _sample(m, steps, *inputs),
    }
    if name not in runs:
        raise ValueError(f"unknown method '{name}'; choose from {', '.join(METHODS)}")
    return Stage(model, runs[name])


def _domain(inputs: ModelInputs) -> torch.Tensor:
    domain = getattr(inputs, "domain_id", None)
    if domain is None or domain.numel() != inputs.batch_size:
        raise ValueError("X-VLA programs need the inputs' domain_id (one per sample: XVLAProcessor builds it)")
    return domain.to(torch.int64)


def staged_sampler(cfg: XVLAConfig, noise: torch.Tensor, num_steps: int, rtc: RtcPlan | None) -> SampleFn:
    """X-VLA's loop for a runtime, over its `step(x_t, t) -> clean estimate`: the chunk after the action space's
    postprocess, continuing `rtc`'s old plan where that is given (inpainting, or guided through the program's
    guided step: `sample(step, guided)`, guided(x_t, t, target, target_high, weights, scale))."""
    space = build_action_space(cfg.action_mode, cfg.action_dim, cfg.model_dim_action)

    def sample(step: CleanStep, guided: GuidedCleanFn) -> torch.Tensor:
        estimate = step
        if rtc is not None:
            hook = estimate_hook(space, cfg.action_dim, rtc, noise.shape[1], num_steps, noise.dtype, guided=guided)
            estimate = lambda x_t, t: hook(step, x_t, t)  # noqa: E731
        actions = space.postprocess(clean_loop(estimate, noise, num_steps))
        return actions if rtc is None else keep_old_prefix(actions, rtc, cfg.action_dim)

    return sample


def run_staged(
    cfg: XVLAConfig,
    run: RunMethod,
    inputs: ModelInputs,
    noise: torch.Tensor,
    num_steps: int,
    clock: StageClock,
    sample: SampleFn | None = None,
) -> torch.Tensor:
    """One inference: encode once, then X-VLA's own loop over denoise_step (`sample`: the runtime's
    `staged_sampler`, None for a plain chunk; its guided RTC calls guided_step, which runtimes offer only where
    the program has it)."""
    domain = _domain(inputs)
    # Cloned: a runtime may hand back its output buffer, which the next call overwrites.
    context = run("encode", [inputs.images, inputs.image_masks, inputs.tokens, domain])[0].clone()
    clock.lap("embed_prefix_ms")
    clock.lap("prefill_ms")  # no separate prefill: the BART encoder runs inside encode

    def step(x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return run("denoise_step", [context, domain, inputs.state, x_t, t])[0].clone()

    def guided(x_t, t, target, target_high, weights, scale) -> torch.Tensor:
        bound = [context, domain, inputs.state, x_t, t, target, target_high, weights, scale]
        return run(GUIDED_STEP, bound)[0].clone()

    actions = (sample or staged_sampler(cfg, noise, num_steps, None))(step, guided)
    clock.lap("denoise_ms")
    return actions


def fused_inputs(cfg: XVLAConfig, inputs: ModelInputs) -> list[torch.Tensor]:
    """The inputs of `sample` before the noise: images, image_masks, tokens, state, domain_id."""
    return [inputs.images, inputs.image_masks, inputs.tokens, inputs.state, _domain(inputs)]


XVLA = StagePlan(
    family="xvla",
    methods=METHODS,
    staged=STAGED,
    signatures=signatures,
    module=method_module,
    example_inputs=xvla_example_inputs,
    run_staged=run_staged,
    fused_inputs=fused_inputs,
    sampler=staged_sampler,
    optional=(GUIDED_STEP,),
    guidance="clean",
)
