"""The pi0-FAST model: the pi0 family's SigLIP + Gemma backbone as a prefix-LM that decodes action tokens.

Inference is three stages with static shapes (what an exporter takes; the greedy loop lives in the runner):

    embed_prefix(inputs)                          -> prefix (B, P, W), prefix_mask (B, P)
    prefill(prefix, prefix_mask)                  -> KV cache sized P + max_decoding_steps, first logits (B, V)
    decode_step(cache, mask, token, position, t)  -> logits (B, V); writes the token's keys / values at P + t

LeRobot 0.6.1's rules (DESIGN.md 8c): the prefix is [image tokens, prompt slots (padded), BOS], ONE bidirectional
block with the pads excluded, positions cumsum(mask) - 1; prompt and generated tokens are embedding rows x sqrt(width)
(as pi0); the logits are the final-normed hidden state times the same embedding (tied lm_head);
a generated token sits at position (valid tokens so far) and sees every valid token before it and itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.layers import additive_mask, attention, rope_cos_sin
from omni_ros.policy.pi0.backbone import Backbone
from omni_ros.policy.pi0.gemma import DecoderLayer, RMSNorm
from omni_ros.policy.pi0.modeling import _init_weights
from omni_ros.policy.pi0.vision import VisionEncoder
from omni_ros.policy.pi0_fast.configuration import Pi0FastConfig

StaticCache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (B, kv_heads, P + S, head_dim), S decode slots


@dataclass
class Generated:
    """A greedy decode: the tokens (B, n) up to the step every row had emitted the end marker, the logits of
    each step (B, n, V) when asked for, and how long the first token and the rest took (ms)."""

    tokens: torch.Tensor
    logits: torch.Tensor | None
    prefill_ms: float
    decode_ms: float


class DecodeCursor:
    """The static-cache bookkeeping of greedy decoding, the same for every runner: which cache entries the token
    being fed sees (`mask`, B x P + S), its RoPE `position` (B,) and the cache entry it goes to."""

    def __init__(self, prefix_mask: torch.Tensor, steps: int) -> None:
        b, self.prefix = prefix_mask.shape
        self.mask = torch.cat([prefix_mask, prefix_mask.new_zeros((b, steps))], dim=1)
        self.position = prefix_mask.long().sum(dim=1)  # the first generated token's position: valid prefix tokens

    def index(self, t: int) -> int:
        """The cache entry of the token fed at step t > 0 (the one generated at step t - 1)."""
        return self.prefix + t - 1

    def advance(self, t: int) -> None:
        """After step t fed its token: it is in the cache, and the next token sits one position further."""
        self.mask[:, self.index(t)] = True
        self.position = self.position + 1


def greedy_decode(
    first_logits: torch.Tensor, step: Callable[[torch.Tensor, int], torch.Tensor], cfg: Pi0FastConfig, keep: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The greedy loop every runner drives (eager, ExecuTorch, ONNX): argmax, then `step(token, t)` -> the next
    logits, until every row has emitted the end marker or max_decoding_steps. -> tokens (B, n), logits (B, n, V)."""
    finished = torch.zeros(first_logits.shape[0], dtype=torch.bool, device=first_logits.device)
    tokens, all_logits = [], []
    logits, token = first_logits, first_logits.argmax(dim=-1)
    for t in range(cfg.max_decoding_steps):
        if t > 0:
            logits = step(token, t)
            token = logits.argmax(dim=-1)
        tokens.append(token)
        if keep:
            all_logits.append(logits.float())
        finished |= token == cfg.end_id
        if bool(finished.all()):
            break
    return torch.stack(tokens, dim=1), torch.stack(all_logits, dim=1) if keep else None


class Pi0FastModel(nn.Module):
    compactable = True  # masked camera slots and trailing pads change nothing (see torch_runner.compact)
    export_form = False  # (a class attribute: what use_export_forms switches)
    # Decoding multiplies one row at a time through the backbone: float32 lays its weights out for single rows
    # there (omni_ros.policy.cpu_linear.row_vector_layout).
    row_vector_modules = ("backbone",)
    # The logits are the final hidden state times the token embedding (tied). A precision fills `head_kernel` from
    # outside with that product in its kernels (omni_ros/policy/precision/tied_head.py); float32 by default.
    tied_head = "backbone.embed_tokens"
    head_kernel: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = staticmethod(F.linear)

    def __init__(self, cfg: Pi0FastConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.vision = VisionEncoder(cfg.vision, cfg.backbone.width, approximate="tanh")
        self.backbone = Backbone(cfg.backbone, cfg.vocab_size, cfg.norm_eps, cfg.rope_theta, "tanh")
        self.final_norm = RMSNorm(cfg.backbone.width, cfg.norm_eps)
        self.apply(_init_weights)
        self.export_form = False

    # -- prefix ---------------------------------------------------------------------------------------------------

    def embed_tokens(self, tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # Gemma's x sqrt(width), as pi0: transformers 5's Gemma embedding scales inside its forward, so LeRobot
        # 0.6.1's "raw" embed_tokens rows are scaled (measured: 1.5e-6 with it, 13 without); lm_head is not.
        return self.backbone.embed_text(tokens).to(dtype)

    def embed_prefix(self, inputs: ModelInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """[image tokens, prompt tokens, BOS] (B, P, W) and their validity mask (B, P)."""
        b, c = inputs.images.shape[:2]
        image_tokens = self.vision(inputs.images.flatten(0, 1))
        image_tokens = image_tokens.reshape(b, c * image_tokens.shape[1], image_tokens.shape[2])
        per_camera = image_tokens.shape[1] // c
        bos = torch.full((b, 1), self.cfg.bos_id, dtype=inputs.tokens.dtype, device=inputs.tokens.device)
        # The second BOS, after the padded prompt slots and inside the bidirectional block (without it: 10.8).
        text = self.embed_tokens(torch.cat([inputs.tokens, bos], dim=1), image_tokens.dtype)
        mask = torch.cat(
            [inputs.image_masks.repeat_interleave(per_camera, dim=1), inputs.token_mask, torch.ones_like(bos).bool()],
            dim=1,
        )
        return torch.cat([image_tokens, text], dim=1), mask

    # -- stages ---------------------------------------------------------------------------------------------------

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, W) last hidden state -> (B, V): final norm, then the tied embedding as lm_head."""
        return self.head_kernel(self.final_norm(hidden), self.backbone.embed_tokens.weight)

    def _mask(self, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return additive_mask(mask, dtype) if self.export_form else mask

    def prefill(
        self, prefix: torch.Tensor, prefix_mask: torch.Tensor, decode_slots: int | None = None
    ) -> tuple[StaticCache, torch.Tensor]:
        """The KV cache of the prefix with `decode_slots` (default max_decoding_steps) empty slots after it, and
        the logits (B, V) the last prefix token (the BOS) gives: the first action token."""
        slots = self.cfg.max_decoding_steps if decode_slots is None else decode_slots
        x, backbone = prefix, self.backbone
        positions = torch.cumsum(prefix_mask.long(), dim=1) - 1
        cos, sin = rope_cos_sin(positions, backbone.cfg.head_dim, backbone.rope_theta, x.dtype)
        attn_mask = (prefix_mask[:, None, :] & prefix_mask[:, :, None])[:, None]
        # A padded query row would see nothing (NaN); let it see itself. It never reaches a valid token.
        index = torch.arange(prefix_mask.shape[1], device=prefix_mask.device)
        attn_mask = self._mask(attn_mask | (index[:, None] == index[None, :]), x.dtype)
        cache: StaticCache = []
        for layer in cast(Iterable[DecoderLayer], backbone.layers):
            q, k, v = layer.qkv(x, cos, sin)
            empty = k.new_zeros((k.shape[0], k.shape[1], slots, k.shape[3]))
            cache.append((torch.cat([k, empty], dim=2), torch.cat([v, empty], dim=2)))
            x = layer.finish(x, attention(q, k, v, attn_mask, self.export_form, backbone.attention_kernel))
        return cache, self.logits(x[:, -1])

    def decode_step(
        self, cache: StaticCache, mask: torch.Tensor, token: torch.Tensor, position: torch.Tensor, index: int
    ) -> torch.Tensor:
        """One generated token (B,) at RoPE `position` (B,), its keys / values written into cache entry `index`;
        `mask` (B, P + S) says which cache entries it sees (the valid prefix, the tokens generated before it and
        itself). -> logits (B, V) of the next token."""
        backbone = self.backbone
        x = self.embed_tokens(token[:, None], cache[0][0].dtype)
        cos, sin = rope_cos_sin(position[:, None], backbone.cfg.head_dim, backbone.rope_theta, x.dtype)
        attn_mask = self._mask(mask[:, None, None, :], x.dtype)
        for i, layer in enumerate(cast(Iterable[DecoderLayer], backbone.layers)):
            q, k, v = layer.qkv(x, cos, sin)
            keys, values = cache[i]
            keys[:, :, index : index + 1] = k
            values[:, :, index : index + 1] = v
            x = layer.finish(x, attention(q, keys, values, attn_mask, self.export_form, backbone.attention_kernel))
        return self.logits(x[:, -1])

    def decode_step_fresh(
        self, cache: StaticCache, mask: torch.Tensor, token: torch.Tensor, position: torch.Tensor
    ) -> tuple[torch.Tensor, StaticCache]:
        """`decode_step` without writing the cache (the exported form: a program's inputs are not its state):
        the token attends to the cache entries `mask` allows and to its own keys / values, which it returns
        (per layer (B, kv_heads, 1, head_dim)) for the runner to write at its entry. -> logits (B, V), fresh."""
        backbone = self.backbone
        x = self.embed_tokens(token[:, None], cache[0][0].dtype)
        cos, sin = rope_cos_sin(position[:, None], backbone.cfg.head_dim, backbone.rope_theta, x.dtype)
        seen = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        attn_mask = self._mask(seen[:, None, None, :], x.dtype)
        fresh: StaticCache = []
        for i, layer in enumerate(cast(Iterable[DecoderLayer], backbone.layers)):
            q, k, v = layer.qkv(x, cos, sin)
            keys, values = cache[i]
            fresh.append((k, v))
            keys, values = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
            x = layer.finish(x, attention(q, keys, values, attn_mask, self.export_form, backbone.attention_kernel))
        return self.logits(x[:, -1]), fresh

    # -- greedy decoding ------------------------------------------------------------------------------------------

    def generate(
        self,
        inputs: ModelInputs,
        keep_logits: bool = False,
        sync: Callable[[], None] | None = None,
        run_step: Callable[[Callable[[], torch.Tensor]], torch.Tensor] | None = None,
    ) -> Generated:
        """Greedy decoding with the KV cache, until every row has emitted the end marker (or max_decoding_steps),
        as LeRobot 0.6.1's `sample_actions_fast_kv_cache` (temperature 0). `run_step(fn)` runs each decode step
        (the runner's choice of torch threads for it, omni_ros.cpu_threads.StepThreads); None calls it directly."""

        def now() -> float:
            if sync is not None:
                sync()
            return time.perf_counter()

        start = now()
        cfg, steps = self.cfg, self.cfg.max_decoding_steps
        prefix, prefix_mask = self.embed_prefix(inputs)
        cache, logits = self.prefill(prefix, prefix_mask, steps)
        cursor = DecodeCursor(prefix_mask, steps)

        def step(token: torch.Tensor, t: int) -> torch.Tensor:
            index = cursor.index(t)
            cursor.mask[:, index] = True  # the token goes into the cache and sees itself

            def once() -> torch.Tensor:
                return self.decode_step(cache, cursor.mask, token, cursor.position, index)

            out = once() if run_step is None else run_step(once)
            cursor.advance(t)
            return out

        first = now()
        tokens, all_logits = greedy_decode(logits, step, cfg, keep_logits)
        end = now()
        return Generated(
            tokens=tokens, logits=all_logits, prefill_ms=(first - start) * 1e3, decode_ms=(end - first) * 1e3
        )
