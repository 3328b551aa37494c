"""pi0-FAST's inference stages as program methods (its `StagePlan`, see omni_ros.policy.methods):

    prefill(images, image_masks, tokens, token_mask)           -> logits, k_0, v_0, ...  (the prefix, P entries)
    decode_step(token, position, mask, k_0, v_0, ...)          -> logits, k_new_0, v_new_0, ...

The greedy loop and the FAST detokenizer stay in the runner (`token_decoder`, the eager family's very
`greedy_decode`, `DecodeCursor` and `decoded`; `token_generator` is the loop alone, tokens not detokenized): it
keeps a static cache of P + max_decoding_steps entries, copies the prefill's P entries into it, and after each
decode step writes the step's own keys / values at the token's entry. A step's inputs are never its state (the
runtime may copy or reuse them), so `decode_step` attends to the cache entries `mask` (B, P + S) allows plus its
own keys / values, and returns those (B, kv_heads, 1, hd). No fused `sample`: a program has static shapes, a
greedy decode a data-dependent length.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.methods import (
    MethodSignature,
    RunMethod,
    Stage,
    StagePlan,
    TensorSpec,
    example_inputs,
    flat_cache,
    model_input_specs,
    paired,
)
from omni_ros.policy.pi0.stages import prefix_mask_of
from omni_ros.policy.pi0_fast.configuration import Pi0FastConfig
from omni_ros.policy.pi0_fast.modeling import DecodeCursor, Generated, Pi0FastModel, greedy_decode
from omni_ros.policy.pi0_fast.processing import RTC_REASON
from omni_ros.policy.pipeline import Sampled

METHODS = ("prefill", "decode_step")


def kv_names(cfg: Pi0FastConfig, suffix: str = "") -> list[str]:
    return [f"{kind}{suffix}_{i}" for i in range(cfg.backbone.depth) for kind in ("k", "v")]


def signatures(cfg: Pi0FastConfig, batch: int = 1) -> dict[str, MethodSignature]:
    c, s, t, p = len(cfg.camera_names), cfg.vision.image_size, cfg.tokenizer.max_tokens, cfg.prefix_len
    kvh, hd, slots = cfg.backbone.num_kv_heads, cfg.backbone.head_dim, cfg.max_decoding_steps
    images, image_masks, tokens, token_mask, _ = model_input_specs(batch, c, s, t, cfg.state_dim)
    logits = TensorSpec("logits", (batch, cfg.vocab_size), "float32")

    def kv(shape: tuple[int, ...], suffix: str = "") -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec(n, shape, "float32") for n in kv_names(cfg, suffix))

    specs = [
        MethodSignature("prefill", (images, image_masks, tokens, token_mask), (logits, *kv((batch, kvh, p, hd)))),
        MethodSignature(
            "decode_step",
            (
                TensorSpec("token", (batch,), "int64"),
                TensorSpec("position", (batch,), "int64"),
                TensorSpec("mask", (batch, p + slots), "bool"),
                *kv((batch, kvh, p + slots, hd)),
            ),
            (logits, *kv((batch, kvh, 1, hd), "_new")),
        ),
    ]
    return {m.name: m for m in specs}


def _prefill(m: Pi0FastModel, images, image_masks, tokens, token_mask) -> tuple[torch.Tensor, ...]:
    state = images.new_zeros((images.shape[0], 0))  # embed_prefix reads no state (it is in the prompt)
    cache, logits = m.prefill(*m.embed_prefix(ModelInputs(images, image_masks, tokens, token_mask, state)), 0)
    return (logits, *flat_cache(cache))


def _decode_step(m: Pi0FastModel, token, position, mask, *kv) -> tuple[torch.Tensor, ...]:
    logits, fresh = m.decode_step_fresh(paired(kv), mask, token, position)
    return (logits, *flat_cache(fresh))


def method_module(model: Pi0FastModel, name: str, num_steps: int | None = None) -> nn.Module:
    runs: dict[str, Callable[..., Any]] = {"prefill": _prefill, "decode_step": _decode_step}
    if name not in runs:
        raise ValueError(f"unknown method '{name}'; choose from {', '.join(METHODS)}")
    return Stage(model, runs[name])


def token_generator(cfg: Pi0FastConfig) -> Callable[[RunMethod, ModelInputs], Generated]:
    """The exported token loop: prefill once, then the eager family's greedy loop over `decode_step` -> the
    generated tokens (B, n) and the time to first token / of the rest (`Generated`, no logits kept). What
    `token_decoder` detokenizes; also the runners' `generate` (a benchmark's random weights form no FAST chunk)."""
    import time

    steps = cfg.max_decoding_steps

    def generate(run: RunMethod, inputs: ModelInputs) -> Generated:
        start = time.perf_counter()
        out = run("prefill", [inputs.images, inputs.image_masks, inputs.tokens, inputs.token_mask])
        # The static cache: the prefix's entries, then max_decoding_steps empty ones (copied: a runtime may hand
        # back its own output buffers, which the next call overwrites).
        cache = [torch.cat([kv, kv.new_zeros((*kv.shape[:2], steps, kv.shape[3]))], dim=2) for kv in out[1:]]
        # As embed_prefix builds it: image tokens, prompt slots, the final BOS.
        images_mask = prefix_mask_of(inputs.image_masks, inputs.token_mask, cfg.vision.num_tokens)
        prefix_mask = torch.cat([images_mask, torch.ones_like(inputs.token_mask[:, :1])], dim=1)
        cursor = DecodeCursor(prefix_mask, steps)

        def step(token: torch.Tensor, t: int) -> torch.Tensor:
            index = cursor.index(t)
            result = run("decode_step", [token, cursor.position, cursor.mask, *cache])
            for kv, new in zip(cache, result[1:], strict=True):
                kv[:, :, index : index + 1] = new
            cursor.advance(t)
            return result[0].clone()

        logits = out[0].clone()
        first = time.perf_counter()
        tokens, _ = greedy_decode(logits, step, cfg, False)
        end = time.perf_counter()
        return Generated(tokens, None, (first - start) * 1e3, (end - first) * 1e3)

    return generate


def token_decoder(cfg: Pi0FastConfig, folder: Path | str) -> Callable[[RunMethod, ModelInputs], Sampled]:
    """The exported decode: `token_generator`'s tokens through the FAST detokenizer; the FAST tokenizer folder
    (`cfg.fast.path`) relative to the exported files' `folder`."""
    from omni_ros.policy.pi0_fast.fast import FastDetokenizer
    from omni_ros.policy.pi0_fast.runner import decoded

    detokenizer = FastDetokenizer(cfg, Path(folder) / cfg.fast.path)
    generate = token_generator(cfg)

    def decode(run: RunMethod, inputs: ModelInputs) -> Sampled:
        out = generate(run, inputs)
        return decoded(detokenizer, out.tokens, out.prefill_ms, out.decode_ms)

    return decode


def _no_euler(*_: Any) -> Any:
    raise ValueError("pi0-FAST decodes tokens: its programs run through the plan's token_decoder, not run_staged")


PI0_FAST = StagePlan(
    family="pi0_fast",
    methods=METHODS,
    staged=METHODS,
    signatures=signatures,
    module=method_module,
    example_inputs=example_inputs,
    run_staged=_no_euler,
    fused_inputs=_no_euler,
    token_decoder=token_decoder,
    token_generator=token_generator,
    rtc_refusal=RTC_REASON,
)
