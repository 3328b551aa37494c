#!/usr/bin/env python3
"""Reference fixtures produced by the real LeRobot 0.6.1 code (pi0, pi0.5, SmolVLA).

Runs in the LeRobot venv (`make reference-fixtures` creates it), never in the product venv, and imports nothing
from omni_ros. It builds tiny random LeRobot policies, saves them with LeRobot's own `save_pretrained` (policy and
pre/post-processors), reloads them the way LeRobot does, and runs observations through LeRobot's full inference
pipeline (observation -> preprocessor -> predict_action_chunk(noise=...) -> postprocessor). For every case it stores
the raw robot observation, the noise, LeRobot's final actions and the intermediate tensors a loader needs to debug
itself (preprocessed images, token ids and mask, normalized state, normalized actions, image embeddings, the first
denoising velocity). The pi0 / pi0.5 weights are also re-saved the way openpi's PyTorch conversion writes them.
Guided real-time chunking cases (rtc.json, `record_rtc`) run LeRobot's own RTCProcessor on the saved pi0 and
SmolVLA folders: previous chunk, delay, horizons, noise, and LeRobot's guided and unguided actions.

The sizes LeRobot hard-codes (Gemma variants, SigLIP so400m, projection width, the 257152-token vocabulary) are
patched small so that everything committed stays well under 3 MB; every parameter is re-drawn from a fixed seed
(including RMSNorm / adaRMS weights that HF leaves at zero) so that a wrong convention shows in the actions.

    .venv-lerobot/bin/python scripts/make_reference_fixtures.py --out test/fixtures/reference
    .venv-lerobot/bin/python scripts/make_reference_fixtures.py --check   # regenerate elsewhere and compare
    .venv-lerobot/bin/python scripts/make_reference_fixtures.py --rtc-only  # only the RTC cases, on saved folders
    .venv-lerobot/bin/python scripts/make_reference_fixtures.py --pi0fast-only  # only the pi0-FAST fixtures
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import io
import itertools
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

# Nothing may come from a hub: a missing local file must fail, not download.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    import lerobot
    import numpy as np
    import tokenizers
    import torch
    import transformers
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies import factory as policy_factory
    from lerobot.policies.pi0 import modeling_pi0
    from lerobot.policies.pi05 import modeling_pi05
    from lerobot.policies.utils import prepare_observation_for_inference
    from lerobot.processor import tokenizer_processor
    from safetensors.torch import load_file, save_file
    from torch import nn
except ImportError as exc:  # pragma: no cover - only hit outside the LeRobot venv
    sys.exit(
        f"make_reference_fixtures.py needs the LeRobot venv ({exc}); run `make reference-fixtures` "
        "or `LEROBOT_VENV=... make reference-fixtures`."
    )

LEROBOT_VERSION = "0.6.1"
PALIGEMMA_TOKENIZER_NAME = "google/paligemma-3b-pt-224"  # what LeRobot's pi0 / pi05 processors name
SMOLVLM_DIRNAME = "vlm"  # SmolVLA's vlm_model_name, relative to the checkpoint folder

# ----------------------------------------------------------------------------------------------------------------
# Tiny tokenizers (deterministic: merges are learned here, not by a trainer whose tie-breaking could change)
# ----------------------------------------------------------------------------------------------------------------

CORPUS = (
    "pick up the red cube and place it on the tray. pick the blue block, then stack it on the green one. "
    "open the drawer; put the cup inside and close it. move the arm to the left of the bowl. "
    "push the button, then wait. grasp the handle and pull. task: state: action: "
    "Pick Place Put Move Open Close Stack Push Grasp The RED BLUE GREEN cube block cup bowl tray drawer "
    "0 1 2 3 4 5 6 7 8 9 10 12 25 64 100 127 128 200 255 -1"
)
BASE_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ,.;:-'\n"  # no "!" "_" "?" on purpose


def _learn_merges(word_counts: dict[tuple[str, ...], int], num_merges: int) -> list[tuple[str, str]]:
    """Plain BPE: repeatedly merge the most frequent adjacent pair (ties: lexicographically smallest pair)."""
    words = dict(word_counts)
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for a, b in itertools.pairwise(word):
                pairs[(a, b)] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        merged: dict[tuple[str, ...], int] = {}
        for word, count in words.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + count
        words = merged
    return merges


def build_paligemma_like_tokenizer(
    num_merges: int = 48, extra_chars: str = "", words: tuple[str, ...] = (), vocab_size: int | None = None
) -> tokenizers.Tokenizer:
    """A SentencePiece-style BPE like PaliGemma's: "▁" marks spaces, byte fallback, BOS added by the post-processor.

    Special ids follow Gemma: <pad>=0, <eos>=1, <bos>=2, <unk>=3; then the 256 <0xXX> byte tokens, the base
    characters and the merges. Characters outside the vocabulary ("!", "_", "?") fall back to byte tokens.
    pi0-FAST needs more (`extra_chars` such as its "|" end marker, whole `words` such as "Action" built by merges
    that come first, and `vocab_size`: never-produced "<unused_i>" pieces up to that size, the range whose top the
    FAST action tokens take, as PaliGemma's 257152 pieces end in tokens text never produces).
    """
    from tokenizers import decoders, models, pre_tokenizers, processors

    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in (BASE_CHARS + extra_chars).replace(" ", "▁"):
        vocab.setdefault(ch, len(vocab))
    counts: Counter[tuple[str, ...]] = Counter()
    for i, piece in enumerate(CORPUS.split(" ")):
        text = piece if i == 0 else "▁" + piece
        counts[tuple(text)] += 1
    word_merges = [(w[:i], w[i]) for w in words for i in range(1, len(w))]
    merges = word_merges + _learn_merges(counts, num_merges)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    if vocab_size is not None:
        for i in range(vocab_size - len(vocab)):
            vocab[f"<unused_{i}>"] = len(vocab)
    tok = tokenizers.Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


SMOLVLM_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SMOLVLM_IMAGE_SPECIALS = {
    "fake_image_token": "<fake_token_around_image>",
    "image_token": "<image>",
    "global_image_token": "<global-img>",
    "end_of_utterance_token": "<end_of_utterance>",
}


def build_smollm_like_tokenizer(num_merges: int = 48, vocab_size: int | None = None) -> tokenizers.Tokenizer:
    """A GPT-2 style byte-level BPE like SmolLM2 / SmolVLM2's: no BOS, the image specials appended at the end.

    `vocab_size` pads the vocabulary with never-produced "<|unused_i|>" entries up to that size (a full-size
    SmolVLM embedding has 49280 rows; the tokenizer then covers the whole embedding)."""
    from tokenizers import decoders, models, pre_tokenizers, processors

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(SMOLVLM_SPECIALS)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    counts: Counter[tuple[str, ...]] = Counter()
    for piece, _ in byte_level.pre_tokenize_str(CORPUS):
        counts[tuple(piece)] += 1
    merges = _learn_merges(counts, num_merges)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    if vocab_size is not None:
        for i in range(vocab_size - len(vocab) - len(SMOLVLM_IMAGE_SPECIALS)):
            vocab[f"<|unused_{i}|>"] = len(vocab)
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = SMOLVLM_SPECIALS + list(SMOLVLM_IMAGE_SPECIALS.values())
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def wrap_tokenizer(tok: tokenizers.Tokenizer, **kwargs) -> transformers.PreTrainedTokenizerFast:
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


def paligemma_hf_tokenizer() -> transformers.PreTrainedTokenizerFast:
    return wrap_tokenizer(
        build_paligemma_like_tokenizer(),
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="right",
        truncation_side="right",
    )


def smolvlm_hf_tokenizer(vocab_size: int | None = None) -> transformers.PreTrainedTokenizerFast:
    # Padding / truncation sides as DESIGN.md section 8 records for SmolVLM2's tokenizer (left truncation).
    return wrap_tokenizer(
        build_smollm_like_tokenizer(vocab_size=vocab_size),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        padding_side="right",
        truncation_side="left",
        extra_special_tokens=dict(SMOLVLM_IMAGE_SPECIALS),
    )


# ----------------------------------------------------------------------------------------------------------------
# Tiny pi0 / pi0.5: patch the sizes LeRobot hard-codes
# ----------------------------------------------------------------------------------------------------------------


# Head counts stay those of the real variants (8 query heads / 1 KV head in both Gemma stacks, 16 in SigLIP):
# they are not in the weights, so a loader has to know them, and the fixture must not let a wrong guess pass.
@dataclass
class PiSizes:
    """What the patched LeRobot pi0 / pi05 builds instead of gemma_2b / gemma_300m / SigLIP so400m / 257152.

    `gemma` maps the variant names LeRobot's config keeps ("gemma_2b" is the VLM, "gemma_300m" the expert) to
    GemmaConfig fields; `siglip` sets SiglipVisionConfig fields (the projection width follows the VLM width);
    `vocab` is the size of every embedding and lm_head (set from the tokenizer before building).
    """

    gemma: dict = field(
        default_factory=lambda: {
            "gemma_2b": dict(width=24, depth=2, mlp_dim=48, num_heads=8, num_kv_heads=1, head_dim=8),
            "gemma_300m": dict(width=16, depth=2, mlp_dim=32, num_heads=8, num_kv_heads=1, head_dim=8),
        }
    )
    siglip: dict = field(
        default_factory=lambda: dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=16, patch_size=8
        )
    )
    vocab: int = 0


PI_SIZES = PiSizes()
PI_IMAGE_SIZE = 32  # config.image_resolution (square, as PaliGemma requires)
_ORIG = {}


def install_pi_patches() -> None:
    """Shrink LeRobot's pi0 / pi05 model: Gemma variants, SigLIP, projection width, vocabulary."""
    if _ORIG:
        return
    for mod in (modeling_pi0, modeling_pi05):
        _ORIG[(mod.__name__, "get_gemma_config")] = mod.get_gemma_config
        _ORIG[(mod.__name__, "paligemma")] = mod.PaliGemmaForConditionalGenerationWithPiGemma
        _ORIG[(mod.__name__, "expert")] = mod.PiGemmaForCausalLM

        def get_gemma_config(variant, _mod=mod):
            if variant not in PI_SIZES.gemma:
                raise ValueError(f"Unknown variant: {variant}")
            return _mod.GemmaConfig(**PI_SIZES.gemma[variant])

        def paligemma(config, _cls=_ORIG[(mod.__name__, "paligemma")]):
            config.text_config.vocab_size = PI_SIZES.vocab
            config._vocab_size = PI_SIZES.vocab  # LeRobot sets the same private field
            config.image_token_index = PI_SIZES.vocab - 1
            for key, value in PI_SIZES.siglip.items():
                setattr(config.vision_config, key, value)
            config.vision_config.projection_dim = config.text_config.hidden_size
            return _cls(config)

        def expert(config, _cls=_ORIG[(mod.__name__, "expert")]):
            config.vocab_size = PI_SIZES.vocab
            return _cls(config)

        mod.get_gemma_config = get_gemma_config
        mod.PaliGemmaForConditionalGenerationWithPiGemma = paligemma
        mod.PiGemmaForCausalLM = expert


class _LocalAutoTokenizer:
    """Stands in for `transformers.AutoTokenizer` inside LeRobot's tokenizer step: the gated PaliGemma tokenizer
    name resolves to the tiny local one (a folder holding tokenizer.json); every other name loads as usual."""

    folders: ClassVar[dict[str, Path]] = {}

    @classmethod
    def from_pretrained(cls, name, *args, **kwargs):
        folder = cls.folders.get(str(name))
        if folder is not None:
            return transformers.AutoTokenizer.from_pretrained(str(folder), *args, **kwargs)
        return transformers.AutoTokenizer.from_pretrained(name, *args, **kwargs)


tokenizer_processor.AutoTokenizer = _LocalAutoTokenizer


# ----------------------------------------------------------------------------------------------------------------
# Weights: re-draw every parameter from a fixed seed
# ----------------------------------------------------------------------------------------------------------------


def randomize_parameters(model: nn.Module, seed: int) -> dict[str, str]:
    """Draw every parameter again so that no convention hides behind a zero or a one.

    Gemma-style RMSNorm ((1 + w) * x) weights get w ~ 0.2 N(0, 1) (HF leaves them at zero, which would hide a
    w-vs-(1+w) mix-up); Llama-style RMSNorm (w * x) and LayerNorm weights get 1 + 0.2 N; biases 0.1 N (adaRMS
    dense layers included, so scale / shift / gate are all non-zero); matrices N / sqrt(fan_in); token embeddings
    N / sqrt(width); position embeddings 0.5 N. Returns the rule applied to each parameter name.
    """
    gen = torch.Generator().manual_seed(seed)
    seen: set[int] = set()
    rules: dict[str, str] = {}
    for mname, mod in model.named_modules():
        cls = type(mod).__name__
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            name = f"{mname}.{pname}" if mname else pname
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if isinstance(mod, nn.LayerNorm) or cls.endswith("LayerNorm"):
                value, rule = (1 + 0.2 * noise, "1+0.2N") if pname == "weight" else (0.1 * noise, "0.1N")
            elif "RMSNorm" in cls and pname == "weight":
                gemma_style = cls.startswith(("PiGemma", "Gemma"))
                value, rule = (0.2 * noise, "0.2N (1+w)") if gemma_style else (1 + 0.2 * noise, "1+0.2N (w)")
            elif isinstance(mod, nn.Embedding):
                scale = 0.5 if "position" in name else 1 / math.sqrt(p.shape[-1])
                value, rule = scale * noise, f"{scale:.3g}N"
            elif p.ndim >= 2:
                fan_in = int(np.prod(p.shape[1:]))
                value, rule = noise / math.sqrt(fan_in), "N/sqrt(fan_in)"
            elif pname == "bias":
                value, rule = 0.1 * noise, "0.1N"
            else:
                raise RuntimeError(f"no randomisation rule for {name} ({cls}, {tuple(p.shape)})")
            with torch.no_grad():
                p.copy_(value.to(p.dtype))
            rules[name] = rule
    return rules


def state_dict_sha256(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(tensors):
        t = tensors[key].detach().contiguous().cpu()
        h.update(key.encode())
        h.update(str(t.dtype).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def assert_same_weights(saved: dict[str, torch.Tensor], model: nn.Module, what: str) -> None:
    """LeRobot's from_pretrained can silently keep random weights when loading fails: check every tensor."""
    live = model.state_dict()
    for key, value in saved.items():
        if key not in live:
            raise RuntimeError(f"{what}: saved key {key} is not in the reloaded model")
        if not torch.equal(live[key].to(value.dtype), value):
            raise RuntimeError(f"{what}: {key} differs after reload")


# ----------------------------------------------------------------------------------------------------------------
# Features, statistics, observations
# ----------------------------------------------------------------------------------------------------------------

# Declared order is not alphabetical, so camera order by `input_features` and by sorted name differ.
CAMERAS = [
    ("observation.images.top", 48, 64),  # landscape: resized down, padded top/bottom (pi0) or top (smolvla)
    ("observation.images.left_wrist", 40, 30),  # portrait: padded left/right (pi0) or left (smolvla)
    ("observation.images.right_wrist", 32, 32),  # already the model size: the no-resize path
]


def features(num_cameras: int, state_dim: int, action_dim: int):
    inputs = {key: PolicyFeature(type=FeatureType.VISUAL, shape=(3, h, w)) for key, h, w in CAMERAS[:num_cameras]}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(state_dim,))
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))}
    return inputs, outputs


def dataset_stats(seed: int, num_cameras: int, state_dim: int, action_dim: int) -> dict[str, dict[str, np.ndarray]]:
    """Non-identity statistics with every field a LeRobot dataset carries (the unused ones too)."""
    rng = np.random.default_rng(seed)
    stats: dict[str, dict[str, np.ndarray]] = {}
    for key, dim in (("observation.state", state_dim), ("action", action_dim)):
        mean = rng.normal(0.0, 1.0, dim)
        std = rng.uniform(0.2, 2.0, dim)
        stats[key] = {
            "mean": mean,
            "std": std,
            "min": mean - 3.0 * std,
            "max": mean + 3.0 * std,
            "q01": mean - 2.3 * std + rng.uniform(-0.1, 0.1, dim),
            "q99": mean + 2.3 * std + rng.uniform(-0.1, 0.1, dim),
            "count": np.array([1000]),
        }
    for key, _, _ in CAMERAS[:num_cameras]:  # image statistics exist in real checkpoints; VISUAL is IDENTITY
        stats[key] = {
            "mean": rng.uniform(0.3, 0.6, (3, 1, 1)),
            "std": rng.uniform(0.1, 0.3, (3, 1, 1)),
            "min": np.zeros((3, 1, 1)),
            "max": np.ones((3, 1, 1)),
            "count": np.array([1000]),
        }
    return {k: {s: np.asarray(v, dtype=np.float32) for s, v in d.items()} for k, d in stats.items()}


def robot_observation(seed: int, cameras, stats, *, state_override=None) -> dict[str, np.ndarray]:
    """What a robot sends: uint8 HWC images per camera key, float32 state in robot units."""
    rng = np.random.default_rng(seed)
    obs: dict[str, np.ndarray] = {}
    for key, h, w in cameras:
        obs[key] = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    s = stats["observation.state"]
    state = s["mean"] + s["std"] * rng.normal(0.0, 1.0, s["mean"].shape)
    if state_override is not None:
        state = state_override(state, s)
    obs["observation.state"] = state.astype(np.float32)
    return obs


# ----------------------------------------------------------------------------------------------------------------
# Running a case through LeRobot's full pipeline
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    prompt: str
    present: list[str]  # camera keys the robot sends
    obs_seed: int
    noise_seed: int
    state_override: object = None
    note: str = ""


@contextlib.contextmanager
def quiet():
    """LeRobot prints banners and key reports while loading; keep the script's own progress readable."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        yield buf


def _embed_fn_owner(policy, family):
    return policy.model.vlm_with_expert if family == "smolvla" else policy.model.paligemma_with_expert


def run_case(policy, pre, post, family: str, obs: dict[str, np.ndarray], prompt: str, noise: torch.Tensor):
    """observation -> preprocessor -> predict_action_chunk(noise) -> postprocessor, recording intermediates."""
    policy.reset()
    frame = prepare_observation_for_inference(
        {k: v.copy() for k, v in obs.items()}, torch.device("cpu"), task=prompt, robot_type=""
    )
    batch = pre(frame)

    if family == "smolvla":
        images, masks = policy.prepare_images(dict(batch))
        state_padded = policy.prepare_state(batch)
    else:
        images, masks = policy._preprocess_images(batch)  # the exact tensors the model sees
        state_padded = modeling_pi0.pad_vector(batch["observation.state"], policy.config.max_state_dim)

    owner = _embed_fn_owner(policy, family)
    embeds: list[torch.Tensor] = []
    velocities: list[torch.Tensor] = []
    orig_embed, orig_denoise = owner.embed_image, policy.model.denoise_step

    def embed_image(img):
        out = orig_embed(img)
        embeds.append(out.detach().clone())
        return out

    def denoise_step(*args, **kwargs):
        out = orig_denoise(*args, **kwargs)
        velocities.append(out.detach().clone())
        return out

    owner.embed_image, policy.model.denoise_step = embed_image, denoise_step
    try:
        actions_normalized = policy.predict_action_chunk(batch, noise=noise.clone())
    finally:
        del owner.embed_image, policy.model.denoise_step
    actions = post(actions_normalized.clone())

    tensors = {f"observation/{k}": torch.from_numpy(np.ascontiguousarray(v)) for k, v in obs.items()}
    tensors.update(
        {
            "noise": noise.clone(),
            "actions": actions.detach().float().contiguous(),
            "debug/images": torch.stack([i.float() for i in images], dim=1).contiguous(),
            "debug/image_masks": torch.stack(masks, dim=1).contiguous(),
            "debug/image_embeddings": torch.stack(embeds, dim=1).contiguous(),
            "debug/tokens": batch["observation.language.tokens"].to(torch.int64).contiguous(),
            "debug/token_mask": batch["observation.language.attention_mask"].to(torch.bool).contiguous(),
            "debug/state_normalized": batch["observation.state"].float().contiguous(),
            "debug/actions_normalized": actions_normalized.float().contiguous(),
            "debug/first_velocity": velocities[0].float().contiguous(),
        }
    )
    if family != "pi05":  # pi0.5 has no continuous state input
        tensors["debug/state_padded"] = state_padded.float().contiguous()
    task = batch.get("task")
    prompt_as_tokenized = task[0] if isinstance(task, list | tuple) else task
    return tensors, prompt_as_tokenized, len(velocities)


def model_camera_order(policy, present: list[str]) -> list[str]:
    declared = list(policy.config.image_features)
    order = [k for k in declared if k in present]
    missing = [k for k in declared if k not in present]
    if policy.name == "smolvla":
        return order + [f"<blank for {k}>" for k in missing[: policy.config.empty_cameras]]
    return order + [f"<blank for {k}>" for k in missing]


def noise_for(policy, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((1, policy.config.chunk_size, policy.config.max_action_dim), generator=gen)


def describe(tensors: dict[str, torch.Tensor]) -> dict[str, dict]:
    """{name: {shape, dtype}} in name order (the manifest's view of a tensor file)."""
    items = sorted(tensors.items())
    return {k: {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")} for k, v in items}


def record_cases(spec, policy, pre, post, tokenizer, out: Path, *, tag: str = "", drop=()) -> dict[str, dict]:
    """Run every case of a fixture; write cases/<fixture>__<case>.safetensors; return the manifest entries."""
    cases_dir = out / "cases"
    cases_dir.mkdir(parents=True, exist_ok=True)
    stats = spec.stats
    entries: dict[str, dict] = {}
    for case in spec.cases:
        cams = [c for c in CAMERAS[: spec.num_cameras] if c[0] in case.present]
        obs = robot_observation(case.obs_seed, cams, stats, state_override=case.state_override)
        noise = noise_for(policy, case.noise_seed)
        tensors, tokenized_prompt, steps = run_case(policy, pre, post, spec.family, obs, case.prompt, noise)
        fname = f"cases/{spec.name}{tag}__{case.name}.safetensors"
        save_file({k: v for k, v in tensors.items() if k not in drop}, str(out / fname))
        ids = tensors["debug/tokens"][0][tensors["debug/token_mask"][0]].tolist()
        entries[case.name] = {
            "file": fname,
            "prompt": case.prompt,
            "prompt_as_tokenized": tokenized_prompt,
            "present_cameras": [c[0] for c in cams],
            "missing_cameras": [k for k in policy.config.image_features if k not in case.present],
            "model_camera_order": model_camera_order(policy, case.present),
            "image_masks": tensors["debug/image_masks"][0].tolist(),
            "num_tokens": int(tensors["debug/tokens"].shape[1]),
            "num_valid_tokens": len(ids),
            "token_ids": ids,
            "token_strings": tokenizer.convert_ids_to_tokens(ids),
            "denoise_steps": steps,
            "note": case.note,
            "tensors": describe({k: v for k, v in tensors.items() if k not in drop}),
        }
    return entries


# ----------------------------------------------------------------------------------------------------------------
# Fixture definitions
# ----------------------------------------------------------------------------------------------------------------

PROMPT = "Pick up the RED cube, then place it on the tray!"  # capitals + punctuation: a lowercasing bug shows
LONG_PROMPT = (
    "Pick up the RED cube and the BLUE block, then open the drawer, put the cup inside, close it, "
    "and push the button twice!"
)
PI05_PROMPT = "  Stack_the BLUE block on the green one; then wait.  "  # strip and "_" -> " " in pi0.5
SMOL_PROMPT = "Put the Cup in the DRAWER, then close it."


def out_of_range_state(state, s):
    """pi0.5 does not clip the quantile-normalized state: bins -1 and 255 must appear in the prompt."""
    state = state.copy()
    state[0] = s["q01"][0] - 0.5 * s["std"][0]
    state[1] = s["q99"][1] + 0.5 * s["std"][1]
    return state


@dataclass
class FixtureSpec:
    name: str
    family: str  # pi0 | pi05 | smolvla
    num_cameras: int
    state_dim: int
    action_dim: int
    chunk_size: int
    weight_seed: int
    stats_seed: int
    cases: list[Case]
    config_kwargs: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)


def fixture_specs() -> list[FixtureSpec]:
    cams = [c[0] for c in CAMERAS]
    pi0_cases_3 = [
        Case("all_cameras", PROMPT, cams, obs_seed=11, noise_seed=21),
        Case("missing_left_wrist", PROMPT, [cams[0], cams[2]], 12, 22, note="declared middle camera absent"),
        Case("missing_top", PROMPT, cams[1:], 13, 23, note="declared first camera absent"),
        Case("long_prompt", LONG_PROMPT, cams, 11, 24, note="all_cameras' observation, prompt over the limit"),
    ]
    pi05_cases = [
        Case("all_cameras", PI05_PROMPT, cams[:2], 31, 41, state_override=out_of_range_state),
        Case(
            "missing_left_wrist",
            PI05_PROMPT,
            cams[:1],
            32,
            42,
            state_override=out_of_range_state,
            note="declared last camera absent",
        ),
    ]
    smol_cases = [
        Case("all_cameras", SMOL_PROMPT, cams, 51, 61),
        Case("missing_left_wrist", SMOL_PROMPT, [cams[0], cams[2]], 52, 62, note="dropped: a 2-camera prefix"),
        Case("only_top", SMOL_PROMPT, cams[:1], 53, 63, note="two declared cameras absent: a 1-camera prefix"),
        Case("long_prompt", LONG_PROMPT, cams, 51, 64, note="all_cameras' observation, prompt over the limit"),
    ]
    # 1, 2 and 3 cameras: pi0_1cam, pi05_2cam, pi0_3cam (the pi0 pair shares weights and statistics: same seeds,
    # identical model.safetensors); SmolVLA drops a missing camera, so its 3-camera fixture covers 3, 2 and 1.
    return [
        FixtureSpec("pi0_1cam", "pi0", 1, 8, 7, 10, 1000, 100, [Case("all_cameras", PROMPT, cams[:1], 1, 2)]),
        FixtureSpec("pi0_3cam", "pi0", 3, 8, 7, 10, 1000, 100, pi0_cases_3),
        FixtureSpec("pi05_2cam", "pi05", 2, 7, 6, 12, 2000, 200, pi05_cases),
        FixtureSpec("smolvla_3cam", "smolvla", 3, 6, 7, 8, 3000, 300, smol_cases),
        # An arm whose state and commands are the same 6 joints, as the policy node drives them (node, bridge and
        # evaluator tests run it end to end).
        FixtureSpec("pi0_arm", "pi0", 2, 6, 6, 10, 4000, 400, [Case("all_cameras", PROMPT, cams[:2], 71, 81)]),
    ]


# ----------------------------------------------------------------------------------------------------------------
# Building, saving and reloading with LeRobot's own code
# ----------------------------------------------------------------------------------------------------------------

TINY_SMOLVLM_VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    image_size=32,
    patch_size=4,
    layer_norm_eps=1e-6,
    hidden_act="gelu_pytorch_tanh",
)
TINY_SMOLVLM_TEXT = dict(
    model_type="llama",
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,  # SmolVLA keeps only the first num_vlm_layers (3): the 4th never reaches the weights
    num_attention_heads=4,
    num_key_value_heads=1,  # GQA 4:1; cross-attention k/v input (1 x 8) differs from the expert width (16)
    head_dim=8,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,  # SmolVLA's own RoPE ignores this (hard-coded 10000): the fixture must show it
    max_position_embeddings=512,
    hidden_act="silu",
    tie_word_embeddings=False,
)
SMOL_SCALE_FACTOR = 2


def write_smolvlm_folder(
    vlm_dir: Path, tok, vision: dict = TINY_SMOLVLM_VISION, text: dict = TINY_SMOLVLM_TEXT, scale_factor: int = 2
) -> dict:
    """A local SmolVLM config + processor folder that SmolVLA's `vlm_model_name` points at."""
    from transformers import SmolVLMConfig, SmolVLMImageProcessor, SmolVLMProcessor, SmolVLMVideoProcessor

    vlm_dir.mkdir(parents=True, exist_ok=True)
    text = dict(text, vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    config = SmolVLMConfig(
        vision_config=dict(vision),
        text_config=text,
        scale_factor=scale_factor,
        image_token_id=tok.convert_tokens_to_ids(SMOLVLM_IMAGE_SPECIALS["image_token"]),
        tie_word_embeddings=False,
    )
    config.save_pretrained(vlm_dir)
    side = vision["image_size"]
    seq = (side // vision["patch_size"]) ** 2 // scale_factor**2
    processor = SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(size={"longest_edge": side}, max_image_size={"longest_edge": side}),
        tokenizer=tok,
        video_processor=SmolVLMVideoProcessor(),
        image_seq_len=seq,
    )
    processor.save_pretrained(vlm_dir)
    return {"vision_config": dict(vision), "text_config": text, "scale_factor": scale_factor}


def policy_classes(family: str):
    if family == "pi0":
        from lerobot.policies.pi0.configuration_pi0 import PI0Config
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy
        from lerobot.policies.pi0.processor_pi0 import make_pi0_pre_post_processors

        return PI0Config, PI0Policy, make_pi0_pre_post_processors
    if family == "pi05":
        from lerobot.policies.pi05.configuration_pi05 import PI05Config
        from lerobot.policies.pi05.modeling_pi05 import PI05Policy
        from lerobot.policies.pi05.processor_pi05 import make_pi05_pre_post_processors

        return PI05Config, PI05Policy, make_pi05_pre_post_processors
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
    from lerobot.policies.smolvla.processor_smolvla import make_smolvla_pre_post_processors

    return SmolVLAConfig, SmolVLAPolicy, make_smolvla_pre_post_processors


def make_config(spec: FixtureSpec):
    config_cls, _, _ = policy_classes(spec.family)
    inputs, outputs = features(spec.num_cameras, spec.state_dim, spec.action_dim)
    kwargs = dict(
        input_features=inputs, output_features=outputs, chunk_size=spec.chunk_size, n_action_steps=spec.chunk_size
    )
    kwargs["device"] = "cpu"
    if spec.family == "smolvla":
        side = TINY_SMOLVLM_VISION["image_size"]
        kwargs.update(
            vlm_model_name=SMOLVLM_DIRNAME,
            load_vlm_weights=False,
            num_vlm_layers=3,
            expert_width_multiplier=0.5,  # expert width 16; its MLP width is LeRobot's formula (256)
            resize_imgs_with_padding=(side, side),
        )
    else:
        kwargs.update(image_resolution=(PI_IMAGE_SIZE, PI_IMAGE_SIZE))
    kwargs.update(spec.config_kwargs)
    return config_cls(**kwargs)


def weights_table(path: Path) -> dict[str, dict]:
    return describe(load_file(str(path)))


def build_lerobot_fixture(spec: FixtureSpec, out: Path, pg_tokenizer) -> tuple[dict, object, object, object]:
    """Build, randomise, save with LeRobot, reload with LeRobot; return (manifest entry, policy, pre, post)."""
    _, policy_cls, make_processors = policy_classes(spec.family)
    folder = out / spec.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    spec.stats = dataset_stats(spec.stats_seed, spec.num_cameras, spec.state_dim, spec.action_dim)

    extra: dict = {}
    with contextlib.chdir(folder) if spec.family == "smolvla" else contextlib.nullcontext():
        if spec.family == "smolvla":
            tok = smolvlm_hf_tokenizer()
            extra["smolvlm"] = write_smolvlm_folder(folder / SMOLVLM_DIRNAME, tok, scale_factor=SMOL_SCALE_FACTOR)
            shutil.copyfile(folder / SMOLVLM_DIRNAME / "tokenizer.json", folder / "tokenizer.json")
        else:
            tok = pg_tokenizer
            tok.save_pretrained(str(folder))  # tokenizer.json (+ tokenizer_config.json) next to the weights
            _LocalAutoTokenizer.folders[PALIGEMMA_TOKENIZER_NAME] = folder
        config = make_config(spec)
        with quiet():
            policy = policy_cls(config)
        rules = randomize_parameters(policy, spec.weight_seed)
        pre, post = make_processors(config, dataset_stats=spec.stats)
        with quiet():
            policy.save_pretrained(str(folder))
        pre.save_pretrained(str(folder))
        post.save_pretrained(str(folder))

        # Reload exactly as LeRobot loads a checkpoint folder, and prove the weights arrived.
        saved = load_file(str(folder / "model.safetensors"))
        with quiet() as log:
            policy = policy_cls.from_pretrained(str(folder))
        assert_same_weights(saved, policy, spec.name)
        policy.eval()
        pre, post = policy_factory.make_pre_post_processors(policy.config, pretrained_path=str(folder))
        cases = record_cases(spec, policy, pre, post, tok, out)

    entry = {
        "layout": "lerobot",
        "family": spec.family,
        "path": spec.name,
        "files": sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()),
        "cameras": list(policy.config.image_features),
        "camera_shapes": {k: list(v.shape) for k, v in policy.config.image_features.items()},
        "state_dim": spec.state_dim,
        "action_dim": spec.action_dim,
        "chunk_size": policy.config.chunk_size,
        "max_state_dim": policy.config.max_state_dim,
        "max_action_dim": policy.config.max_action_dim,
        "normalization_mapping": {k: v.value for k, v in policy.config.normalization_mapping.items()},
        "tokenizer": {
            "file": f"{spec.name}/tokenizer.json",
            "processor_tokenizer_name": _processor_tokenizer_name(folder),
            "vocab_size": len(tok),
            "adds_bos": spec.family != "smolvla",
            "padding_side": "right",
            "truncation_side": tok.truncation_side,
        },
        "param_count": sum(p.numel() for p in policy.parameters()),
        "weights_sha256": state_dict_sha256(saved),
        "weights": weights_table(folder / "model.safetensors"),
        "lerobot_reload_log": [line for line in log.getvalue().splitlines() if "key" in line.lower()],
        "randomisation_rules": dict(sorted(Counter(rules.values()).items())),
        "cases": cases,
        **extra,
    }
    if spec.family != "smolvla":
        entry["tiny_variants"] = {
            "paligemma_variant(gemma_2b)": PI_SIZES.gemma["gemma_2b"],
            "action_expert_variant(gemma_300m)": PI_SIZES.gemma["gemma_300m"],
            "siglip": PI_SIZES.siglip,
        }
    return entry, policy, pre, post


def _processor_tokenizer_name(folder: Path) -> str | None:
    steps = json.loads((folder / "policy_preprocessor.json").read_text())["steps"]
    for step in steps:
        name = (step.get("config") or {}).get("tokenizer_name")
        if name:
            return name
    return None


# ----------------------------------------------------------------------------------------------------------------
# openpi PyTorch layout (examples/convert_jax_model_to_pytorch.py: save_model + config.json + assets/<id>/)
# ----------------------------------------------------------------------------------------------------------------


def openpi_stats(stats: dict) -> dict:
    """Statistics that make LeRobot's formulas compute openpi's: (x - mean) / (std + 1e-6) and
    (x - q01) / (q99 - q01 + 1e-6) * 2 - 1 (openpi transforms.Normalize / Unnormalize).
    LeRobot divides by std + 1e-8 and un-normalizes with x * std + mean, so std' = std + 1e-6 - 1e-8 leaves a
    1e-8 * |x| difference on the way out; quantiles are exact with q99' = q99 + 1e-6."""
    adjusted = copy.deepcopy(stats)
    for key in ("observation.state", "action"):
        s = adjusted[key]
        s["std"] = (s["std"].astype(np.float64) + 1e-6 - 1e-8).astype(np.float32)
        s["q99"] = (s["q99"].astype(np.float64) + 1e-6).astype(np.float32)
    return adjusted


def write_norm_stats(folder: Path, asset_id: str, stats: dict) -> Path:
    """openpi `normalize.save`: {"norm_stats": {"state": NormStats, "actions": NormStats}} (pydantic JSON)."""
    path = folder / "assets" / asset_id / "norm_stats.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "norm_stats": {
            name: {f: [float(x) for x in stats[key][f].reshape(-1)] for f in ("mean", "std", "q01", "q99")}
            for name, key in (("state", "observation.state"), ("actions", "action"))
        }
    }
    path.write_text(json.dumps(doc, indent=2))
    return path


def export_openpi(spec, policy, out: Path, name: str, asset_id: str, precision: str, tok) -> dict:
    folder = out / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    # openpi's PaliGemma keeps lm_head tied to embed_tokens, so save_model writes the pair once, as lm_head
    # (sorted first); LeRobot's model has them untied (PaliGemmaForConditionalGenerationWithPiGemma replaces
    # `model` after init) and saves both. The expert's lm_head (tied to the embedding openpi sets to None) stays.
    tensors = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    embed_key = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
    tensors["paligemma_with_expert.paligemma.lm_head.weight"] = tensors.pop(embed_key)
    if precision == "bfloat16":  # the conversion script ends with pi0_model.to(torch.bfloat16): everything bf16
        tensors = {k: v.to(torch.bfloat16) for k, v in tensors.items()}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"), {"format": "pt"})
    (folder / "config.json").write_text(
        json.dumps(
            {
                "action_dim": policy.config.max_action_dim,
                "action_horizon": policy.config.chunk_size,
                "paligemma_variant": policy.config.paligemma_variant,
                "action_expert_variant": policy.config.action_expert_variant,
                "precision": precision,
            },
            indent=2,
        )
    )
    write_norm_stats(folder, asset_id, spec.stats)

    # Reference actions under openpi's conventions, computed by LeRobot's model on the very weights in the file.
    ref_policy = policy
    if precision == "bfloat16":
        ref_policy = copy.deepcopy(policy)
        with torch.no_grad():
            for p in ref_policy.model.parameters():
                p.copy_(p.to(torch.bfloat16).to(p.dtype))
    _, _, make_processors = policy_classes(spec.family)
    pre, post = make_processors(policy.config, dataset_stats=openpi_stats(spec.stats))
    ref_spec = copy.copy(spec)
    ref_spec.name = name
    ref_spec.cases = spec.cases[:2]
    # Images and image embeddings are those of the same-named case of the LeRobot fixture (fp32 weights).
    drop = ("debug/images", "debug/image_embeddings")
    cases = record_cases(ref_spec, ref_policy, pre, post, tok, out, drop=drop)

    lerobot_keys = set(load_file(str(out / spec.name / "model.safetensors")))
    openpi_keys = set(load_file(str(folder / "model.safetensors")))
    renamed = {k.removeprefix("model.") for k in lerobot_keys}
    entry = {
        "layout": "openpi",
        "family": spec.family,
        "path": name,
        "files": sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()),
        "same_weights_as": spec.name,
        "precision": precision,
        "asset_id": asset_id,
        "norm_stats": f"{name}/assets/{asset_id}/norm_stats.json",
        "cameras_openpi_to_lerobot": dict(
            zip(("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"), policy.config.image_features, strict=False)
        ),
        "state_dim": spec.state_dim,
        "action_dim": spec.action_dim,
        "chunk_size": policy.config.chunk_size,
        "tokenizer": {"file": f"{spec.name}/tokenizer.json", "note": "openpi folders carry no tokenizer"},
        "key_mapping": {
            "rule": "openpi key = LeRobot key without the leading 'model.'",
            "only_in_lerobot": sorted(renamed - openpi_keys),
            "only_in_openpi": sorted(openpi_keys - renamed),
            "embedding": "openpi ships the token embedding only as paligemma_with_expert.paligemma.lm_head.weight",
        },
        "images_and_image_embeddings_from": spec.name,
        "weights": weights_table(folder / "model.safetensors"),
        "reference": (
            "actions follow openpi's conventions (normalization eps 1e-6 in and out); LeRobot's own conventions for "
            f"the same observations are the cases of {spec.name}"
            + ("; LeRobot's fp32 model run on the file's bf16 weights cast to fp32" if precision == "bfloat16" else "")
        ),
        "cases": cases,
    }
    if spec.family == "pi0":
        entry["openpi_prompt_tokens_equal_lerobot"] = {
            c: _openpi_pi0_tokens(tok, case.prompt, policy.config.tokenizer_max_length) == v["token_ids"]
            for c, v, case in zip(cases, cases.values(), ref_spec.cases, strict=True)
        }
    return entry


def _openpi_pi0_tokens(tok, prompt: str, max_len: int) -> list[int]:
    """openpi PaligemmaTokenizer.tokenize for pi0: clean, BOS + text, then "\\n" encoded on its own, cut at max_len."""
    cleaned = prompt.strip().replace("_", " ").replace("\n", " ")
    ids = tok(cleaned)["input_ids"] + tok("\n", add_special_tokens=False)["input_ids"]
    return ids[:max_len]


# ----------------------------------------------------------------------------------------------------------------
# Guided real-time chunking: LeRobot's own RTCProcessor on the saved pi0 / SmolVLA fixtures
# ----------------------------------------------------------------------------------------------------------------

RTC_MANIFEST = "rtc.json"


@dataclass
class RtcCase:
    """One guided-RTC request, in LeRobot's terms (`predict_action_chunk(..., inference_delay=,
    prev_chunk_left_over=, execution_horizon=)` with `RTCConfig(prefix_attention_schedule, max_guidance_weight)`).

    The previous chunk is LeRobot's own plain chunk for the same observation from `prev_noise_seed`; the robot has
    executed `executed` of its actions, so LeRobot's action queue hands over `prev[executed:]` (normalized model
    output, `ActionQueue.get_left_over`)."""

    name: str
    schedule: str  # RTCAttentionSchedule member name: EXP | LINEAR | ONES | ZEROS
    max_guidance_weight: float
    inference_delay: int
    execution_horizon: int  # LeRobot's: the soft mask ends here (the paper's H - s), clipped to the leftover
    executed: int
    prev_noise_seed: int
    noise_seed: int
    note: str = ""


# fixture -> (the case whose observation and prompt are reused, the RTC requests). Chunk 10 (pi0) and 8 (SmolVLA).
RTC_SPECS: dict[str, tuple[str, list[RtcCase]]] = {
    "pi0_3cam": (
        "all_cameras",
        [
            RtcCase("exp", "EXP", 10.0, 2, 7, 3, 101, 102, note="LeRobot's default beta; leftover = execution horizon"),
            RtcCase("linear_short_plan", "LINEAR", 5.0, 3, 8, 5, 103, 104, note="leftover (5) shorter than E (8)"),
            RtcCase("ones_no_delay", "ONES", 1.0, 0, 10, 0, 105, 106, note="d = 0, the whole chunk weighed 1"),
        ],
    ),
    "smolvla_3cam": (
        "all_cameras",
        [
            RtcCase("exp", "EXP", 10.0, 2, 5, 2, 201, 202, note="leftover (6) longer than E (5)"),
            RtcCase("zeros", "ZEROS", 4.0, 3, 6, 0, 203, 204, note="only the first d actions guided"),
        ],
    ),
}


def load_saved_policy(out: Path, name: str, family: str):
    """A fixture policy as LeRobot loads a checkpoint folder: (policy, pre, post). Call inside chdir(folder)."""
    folder = out / name
    _, policy_cls, _ = policy_classes(family)
    if family != "smolvla":
        _LocalAutoTokenizer.folders[PALIGEMMA_TOKENIZER_NAME] = folder
    with quiet():
        policy = policy_cls.from_pretrained(str(folder))
    assert_same_weights(load_file(str(folder / "model.safetensors")), policy, name)
    policy.eval()
    pre, post = policy_factory.make_pre_post_processors(policy.config, pretrained_path=str(folder))
    return policy, pre, post


def _normalized_chunk(policy, pre, obs: dict[str, np.ndarray], prompt: str, noise: torch.Tensor, **rtc) -> torch.Tensor:
    """observation -> preprocessor -> predict_action_chunk(noise, **rtc): LeRobot's normalized (1, H, A) chunk."""
    policy.reset()
    frame = prepare_observation_for_inference(
        {k: v.copy() for k, v in obs.items()}, torch.device("cpu"), task=prompt, robot_type=""
    )
    return policy.predict_action_chunk(pre(frame), noise=noise.clone(), **rtc).detach().float()


@contextlib.contextmanager
def model_jacobian_kept(policy):
    """LeRobot 0.6.1's `RTCProcessor.denoise_step` calls the denoiser on x_t *before* `x_t.requires_grad_(True)`,
    so autograd sees x1_t = x_t - t * v_t with v_t a constant: its "correction" is the weighted error itself, not
    the paper's vector-Jacobian product through the model (kinetix's `jax.vjp(denoiser, x_t)`). This wraps the
    model's `denoise_step` to switch requires_grad on its input first (a leaf, inside RTC's enable_grad), the one
    change that gives LeRobot's RTC the paper's VJP; every other line of LeRobot's RTC runs unchanged."""
    original = policy.model.denoise_step

    def denoise_step(*args, **kwargs):
        x_t = kwargs.get("x_t")
        if torch.is_grad_enabled() and x_t is not None and x_t.is_leaf and not x_t.requires_grad:
            x_t.requires_grad_(True)
        return original(*args, **kwargs)

    policy.model.denoise_step = denoise_step
    try:
        yield
    finally:
        del policy.model.denoise_step


def _debug_steps(policy) -> list:
    steps = policy.rtc_processor.get_all_debug_steps()
    policy.rtc_processor.reset_tracker()
    return steps


def record_rtc(out: Path, threads: int) -> dict:
    """Run every RTC_SPECS case through LeRobot on the saved fixture folders; write cases/<fixture>__rtc_<case>
    .safetensors and return the rtc.json document. Reads only what `generate` wrote (folders and case files), so
    `--rtc-only` adds these files to existing fixtures without touching them."""
    from lerobot.configs import RTCAttentionSchedule
    from lerobot.policies.rtc.configuration_rtc import RTCConfig

    torch.set_num_threads(threads)
    install_pi_patches()
    PI_SIZES.vocab = len(paligemma_hf_tokenizer())
    manifest = json.loads((out / "manifest.json").read_text())
    entries: dict[str, dict] = {}
    checks: dict[str, float] = {}
    for name, (obs_case, rtc_cases) in RTC_SPECS.items():
        info = manifest["fixtures"][name]
        family, horizon = info["family"], info["chunk_size"]
        obs_file = info["cases"][obs_case]["file"]
        prompt = info["cases"][obs_case]["prompt"]
        saved = load_file(str(out / obs_file))
        obs = {k.removeprefix("observation/"): v.numpy() for k, v in saved.items() if k.startswith("observation/")}
        with contextlib.chdir(out / name):
            policy, pre, post = load_saved_policy(out, name, family)
            # The saved fixture reproduces itself: these requests start from the very policy of the plain cases.
            replay = post(_normalized_chunk(policy, pre, obs, prompt, saved["noise"]))
            checks[f"{name}: plain chunk reloaded vs the {obs_case} case, max abs"] = float(
                (replay - saved["actions"]).abs().max()
            )
            for case in rtc_cases:
                policy.config.rtc_config = None
                policy.init_rtc_processor()
                prev_full = _normalized_chunk(policy, pre, obs, prompt, noise_for(policy, case.prev_noise_seed))
                noise = noise_for(policy, case.noise_seed)
                unguided = _normalized_chunk(policy, pre, obs, prompt, noise)
                leftover = prev_full[0, case.executed :].clone()

                policy.config.rtc_config = RTCConfig(
                    prefix_attention_schedule=RTCAttentionSchedule[case.schedule],
                    max_guidance_weight=case.max_guidance_weight,
                    execution_horizon=case.execution_horizon,
                    debug=True,
                )
                policy.init_rtc_processor()
                request = dict(
                    inference_delay=case.inference_delay,
                    prev_chunk_left_over=leftover.clone(),
                    execution_horizon=case.execution_horizon,
                )
                guided = _normalized_chunk(policy, pre, obs, prompt, noise, **request)
                steps = _debug_steps(policy)
                with model_jacobian_kept(policy):
                    guided_vjp = _normalized_chunk(policy, pre, obs, prompt, noise, **request)
                steps_vjp = _debug_steps(policy)
                policy.config.rtc_config = None
                policy.init_rtc_processor()

                key = f"{name}__rtc_{case.name}"
                checks[f"{key}: LeRobot correction - weighted error, max abs"] = max(
                    float((s.correction - s.err).abs().max()) for s in steps
                )
                checks[f"{key}: same with the model's Jacobian kept, max abs"] = max(
                    float((s.correction - s.err).abs().max()) for s in steps_vjp
                )
                tensors = {
                    "noise": noise,
                    "prev_actions": post(leftover[None].clone())[0].float().contiguous(),
                    "actions_unguided": post(unguided.clone()).float().contiguous(),
                    "actions_guided": post(guided.clone()).float().contiguous(),
                    "actions_guided_vjp": post(guided_vjp.clone()).float().contiguous(),
                    "debug/prev_chunk_left_over": leftover.contiguous(),
                    "debug/actions_unguided_normalized": unguided.contiguous(),
                    "debug/actions_guided_normalized": guided.contiguous(),
                    "debug/actions_guided_vjp_normalized": guided_vjp.contiguous(),
                    "debug/prefix_weights": steps[0].weights.reshape(-1).float().contiguous(),
                    "debug/guidance_weights": torch.stack(
                        [torch.as_tensor(s.guidance_weight, dtype=torch.float32) for s in steps]
                    ).contiguous(),
                }
                fname = f"cases/{key}.safetensors"
                save_file(tensors, str(out / fname))
                end = min(case.execution_horizon, len(leftover))
                entries[key] = {
                    "file": fname,
                    "fixture": name,
                    "observation_from": obs_file,
                    "prompt": prompt,
                    "chunk_size": horizon,
                    "num_steps": len(steps),
                    "lerobot": {
                        "prefix_attention_schedule": case.schedule,
                        "max_guidance_weight": case.max_guidance_weight,
                        "inference_delay": case.inference_delay,
                        "execution_horizon": case.execution_horizon,
                        "prev_chunk_left_over_rows": len(leftover),
                    },
                    "executed_before_request": case.executed,
                    "soft_mask": {"start": min(case.inference_delay, end), "end": end},
                    "omni_ros_request": {
                        "prev_actions": "prev_actions (robot units)",
                        "inference_delay": case.inference_delay,
                        "execution_horizon": horizon - case.execution_horizon,
                        "schedule": case.schedule.lower(),
                        "max_guidance_weight": case.max_guidance_weight,
                        "method": "guided",
                    },
                    "note": case.note,
                    "tensors": describe(tensors),
                }
    return {
        "format": 1,
        "generator": {
            "script": "scripts/make_reference_fixtures.py",
            "lerobot": lerobot.__version__,
            "torch": torch.__version__.split("+")[0],
            "threads": threads,
            "device": "cpu",
            "dtype": "float32",
        },
        "pipeline": (
            "<Policy>.from_pretrained(folder), config.rtc_config = RTCConfig(prefix_attention_schedule, "
            "max_guidance_weight, execution_horizon, debug=True), init_rtc_processor(); observation -> preprocessor "
            "-> predict_action_chunk(batch, noise=noise, inference_delay=d, prev_chunk_left_over=leftover, "
            "execution_horizon=E) -> postprocessor. leftover = the normalized plain chunk of the same observation "
            "for the previous noise, from row executed_before_request on (LeRobot's ActionQueue.get_left_over)."
        ),
        "tensors": {
            "actions_guided": "LeRobot 0.6.1's RTC as shipped (its correction is the weighted error: see checks)",
            "actions_guided_vjp": (
                "the same with x_t requiring grad before the model call (model_jacobian_kept): the paper's VJP"
            ),
            "actions_unguided": "the same noise without RTC",
            "prev_actions": "the leftover in robot units (postprocessor), what an omni_ros RtcRequest takes",
        },
        "checks": checks,
        "cases": entries,
    }


# ----------------------------------------------------------------------------------------------------------------
# Checks and main
# ----------------------------------------------------------------------------------------------------------------


def thread_variation(spec, policy, pre, post, out: Path) -> float:
    """Max |actions| difference of the first case recomputed with 2 threads (the fixture uses 1)."""
    case = spec.cases[0]
    cams = [c for c in CAMERAS[: spec.num_cameras] if c[0] in case.present]
    obs = robot_observation(case.obs_seed, cams, spec.stats, state_override=case.state_override)
    saved = load_file(str(out / f"cases/{spec.name}__{case.name}.safetensors"))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        tensors, _, _ = run_case(policy, pre, post, spec.family, obs, case.prompt, noise_for(policy, case.noise_seed))
    finally:
        torch.set_num_threads(threads)
    return float((tensors["actions"] - saved["actions"]).abs().max())


def masked_slot_invariance(policy, out: Path, spec) -> float:
    """pi0: a masked blank camera changes nothing wherever it sits (LeRobot appends it last, openpi keeps the
    slot). Recompute the missing-middle-camera case with the blank moved back into its declared slot."""
    saved = load_file(str(out / f"cases/{spec.name}__missing_left_wrist.safetensors"))
    images = list(saved["debug/images"].unbind(1))
    masks = list(saved["debug/image_masks"].unbind(1))
    images.insert(1, images.pop())
    masks.insert(1, masks.pop())
    state = saved["debug/state_padded"]
    with torch.no_grad():
        actions = policy.model.sample_actions(
            images, masks, saved["debug/tokens"], saved["debug/token_mask"], state, noise=saved["noise"].clone()
        )
    ref = saved["debug/actions_normalized"]
    return float((actions[..., : ref.shape[-1]] - ref).abs().max())


def compare_trees(a: Path, b: Path) -> tuple[float, list[str]]:
    """Max abs difference over every tensor of two fixture trees, and the files that differ otherwise."""
    worst, problems = 0.0, []
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    if files_a != files_b:
        problems.append(f"file sets differ: {sorted(set(map(str, files_a)) ^ set(map(str, files_b)))}")
    for rel in files_a:
        if not (b / rel).exists():
            continue
        if rel.suffix == ".safetensors":
            ta, tb = load_file(str(a / rel)), load_file(str(b / rel))
            if set(ta) != set(tb):
                problems.append(f"{rel}: tensor names differ")
                continue
            for k in ta:
                if ta[k].shape != tb[k].shape or ta[k].dtype != tb[k].dtype:
                    problems.append(f"{rel}:{k}: shape/dtype differ")
                elif ta[k].is_floating_point():
                    worst = max(worst, float((ta[k].double() - tb[k].double()).abs().max()) if ta[k].numel() else 0.0)
                elif not torch.equal(ta[k], tb[k]):
                    problems.append(f"{rel}:{k}: integer/bool tensor differs")
        elif (a / rel).read_bytes() != (b / rel).read_bytes():
            problems.append(f"{rel}: bytes differ")
    return worst, problems


def generate(out: Path, threads: int) -> dict:
    torch.set_num_threads(threads)
    install_pi_patches()
    pg_tok = paligemma_hf_tokenizer()
    PI_SIZES.vocab = len(pg_tok)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "cases").exists():
        shutil.rmtree(out / "cases")
    fixtures: dict[str, dict] = {}
    checks: dict[str, float] = {}
    for spec in fixture_specs():
        t0 = time.perf_counter()
        entry, policy, pre, post = build_lerobot_fixture(spec, out, pg_tok)
        fixtures[spec.name] = entry
        checks[f"{spec.name}: actions max abs, 1 vs 2 threads"] = thread_variation(spec, policy, pre, post, out)
        if spec.name == "pi0_3cam":
            checks["pi0_3cam: blank camera in its slot vs appended, max abs"] = masked_slot_invariance(
                policy, out, spec
            )
            fixtures["openpi_pi0"] = export_openpi(spec, policy, out, "openpi_pi0", "tiny_arm", "bfloat16", pg_tok)
        if spec.name == "pi05_2cam":
            fixtures["openpi_pi05"] = export_openpi(
                spec, policy, out, "openpi_pi05", "tiny-robotics/arm", "float32", pg_tok
            )
        print(f"  {spec.name}: {len(spec.cases)} cases in {time.perf_counter() - t0:.1f} s", flush=True)
    first_with: dict[str, str] = {}
    for name, entry in fixtures.items():
        sha = entry.get("weights_sha256")
        if sha in first_with:
            entry["weights"] = f"identical to {first_with[sha]}"
        elif sha:
            first_with[sha] = name
    return {
        "format": 1,
        "generator": {
            "script": "scripts/make_reference_fixtures.py",
            "lerobot": lerobot.__version__,
            "torch": torch.__version__.split("+")[0],
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "threads": threads,
            "device": "cpu",
            "dtype": "float32",
        },
        "pipeline": (
            "lerobot.policies.utils.prepare_observation_for_inference(obs, cpu, task=prompt) -> "
            "preprocessor (make_pre_post_processors(config, pretrained_path=folder)) -> "
            "policy.predict_action_chunk(batch, noise=noise) -> postprocessor, "
            "with policy = <Policy>.from_pretrained(folder)"
        ),
        "checks": checks,
        "fixtures": fixtures,
    }


def tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("test/fixtures/reference"), help="fixture folder")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the fixtures are made with 1)")
    parser.add_argument(
        "--check", action="store_true", help="regenerate into a temporary folder and compare with --out"
    )
    parser.add_argument(
        "--rtc-only",
        action="store_true",
        help=f"only (re)write the guided-RTC cases and {RTC_MANIFEST} from the fixture folders already in --out",
    )
    parser.add_argument(
        "--pi0fast-only",
        action="store_true",
        help=f"only (re)write the pi0-FAST fixtures and {PI0FAST_MANIFEST} (the other fixtures are untouched)",
    )
    args = parser.parse_args()
    if lerobot.__version__ != LEROBOT_VERSION:
        print(f"warning: LeRobot {lerobot.__version__}, the fixtures are defined against {LEROBOT_VERSION}")
    target = args.out.resolve()
    if args.check:
        if not (target / "manifest.json").exists():
            sys.exit(f"--check: no fixtures at {target}")
        with tempfile.TemporaryDirectory() as tmp:
            fresh = Path(tmp) / "reference"
            t0 = time.perf_counter()
            manifest = generate(fresh, args.threads)
            (fresh / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
            write_rtc(fresh, args.threads)
            if (target / PI0FAST_MANIFEST).exists():
                write_pi0fast(fresh, args.threads)
            if (target / "README.md").exists():
                shutil.copyfile(target / "README.md", fresh / "README.md")
            worst, problems = compare_trees(target, fresh)
            print(f"regenerated in {time.perf_counter() - t0:.1f} s; max abs difference over all tensors: {worst:.3g}")
            for p in problems:
                print(f"  differs: {p}")
            return 0 if not problems and worst == 0.0 else 1
    t0 = time.perf_counter()
    checks: dict[str, float] = {}
    if args.pi0fast_only:
        print(f"writing pi0-FAST fixtures to {target}", flush=True)
        doc = write_pi0fast(target, args.threads)
        print(f"done in {time.perf_counter() - t0:.1f} s; {tree_size(target) / 1e6:.2f} MB in {target}")
        for name, value in doc["checks"].items():
            print(f"  check {name}: {value:.3g}")
        return 0
    if not args.rtc_only:
        print(f"writing reference fixtures to {target}", flush=True)
        manifest = generate(target, args.threads)
        (target / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        checks.update(manifest["checks"])
    elif not (target / "manifest.json").exists():
        sys.exit(f"--rtc-only: no fixtures at {target} (run without --rtc-only first)")
    print(f"writing guided-RTC cases to {target}", flush=True)
    checks.update(write_rtc(target, args.threads)["checks"])
    print(f"done in {time.perf_counter() - t0:.1f} s; {tree_size(target) / 1e6:.2f} MB in {target}")
    for name, value in checks.items():
        print(f"  check {name}: {value:.3g}")
    return 0


def write_rtc(out: Path, threads: int) -> dict:
    """The RTC cases and their manifest, after the fixture folders exist (see `record_rtc`)."""
    for old in (out / "cases").glob("*__rtc_*.safetensors"):
        old.unlink()  # a renamed or dropped case must not linger
    doc = record_rtc(out, threads)
    (out / RTC_MANIFEST).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


# ----------------------------------------------------------------------------------------------------------------
# pi0-FAST (`--pi0fast-only`): tiny autoregressive policies, their FAST action tokenizer fitted here
# ----------------------------------------------------------------------------------------------------------------

PI0FAST_MANIFEST = "pi0fast.json"
FAST_DIRNAME = "fast_tokenizer"  # action_tokenizer_name "./fast_tokenizer", resolved against the checkpoint folder
FAST_VOCAB = 128  # BPE vocabulary of the fitted FAST tokenizer (the hub's has 1024; 128 keeps the fixture tiny)
FAST_SKIP = 128  # config.fast_skip_tokens (LeRobot's default)
# PaliGemma-shaped text vocabulary: the tiny pieces, "|" (the end marker) and the word "Action", padded with
# unused pieces so that the FAST ids (vocab - 1 - 128 - id) land in its top, above every piece text produces.
FAST_TEXT_VOCAB = 640
FAST_SIZES = {"image_size": PI_IMAGE_SIZE, "vocab": FAST_TEXT_VOCAB}  # the benchmark's edge model changes them
FAST_PROMPT = "Pick up the RED cube, then place_it on the tray!"  # "_" becomes " " in the pi0-FAST prompt


def fast_text_tokenizer(vocab_size: int = FAST_TEXT_VOCAB) -> transformers.PreTrainedTokenizerFast:
    return wrap_tokenizer(
        build_paligemma_like_tokenizer(extra_chars="|", words=("Action",), vocab_size=vocab_size),
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="right",
        truncation_side="right",
    )


def _fast_processor_class():
    from lerobot.policies.molmoact2.molmoact2_hf_model.action_tokenizer import UniversalActionProcessor

    return UniversalActionProcessor


class _LocalAutoProcessor:
    """Stands in for `transformers.AutoProcessor` in LeRobot's pi0-FAST policy and action-tokenizer step: a
    relative action_tokenizer_name resolves against the checkpoint folder being built or loaded (`folder`), and
    loads with LeRobot's own FAST processor class (`from_pretrained_local`); nothing else is allowed."""

    folder: ClassVar[Path | None] = None

    @classmethod
    def from_pretrained(cls, name, *args, **kwargs):
        path = Path(str(name))
        if not path.is_absolute() and cls.folder is not None:
            path = cls.folder / path
        if not path.is_dir():
            raise FileNotFoundError(f"no FAST tokenizer folder at {path}")
        return _fast_processor_class().from_pretrained_local(str(path))


def smooth_chunk(rng: np.random.Generator, horizon: int, dim: int) -> np.ndarray:
    """A normalized action chunk a robot could follow: a random offset plus a slow ramp and a half sine."""
    t = np.linspace(0.0, 1.0, horizon)[:, None]
    offset = rng.uniform(-0.8, 0.8, dim)
    ramp = rng.uniform(-0.6, 0.6, dim)
    wave = rng.uniform(-0.4, 0.4, dim)
    return (offset + ramp * t + wave * np.sin(np.pi * t)).astype(np.float32)


def fit_fast_tokenizer(folder: Path, seed: int, horizon: int, dim: int, count: int = 400, vocab: int = FAST_VOCAB):
    """LeRobot's FAST processor fitted on random smooth chunks (its `fit()`), saved in `folder`: tokenizer.json
    and processor_config.json (scale, vocab_size, min_token, time_horizon, action_dim)."""
    rng = np.random.default_rng(seed)
    chunks = [smooth_chunk(rng, horizon, dim) for _ in range(count)]
    with quiet():
        processor = _fast_processor_class().fit(
            chunks, scale=10, vocab_size=vocab, time_horizon=horizon, action_dim=dim
        )
    folder.mkdir(parents=True, exist_ok=True)
    processor.tokenizer.save_pretrained(str(folder))
    config = {
        "processor_class": "UniversalActionProcessor",
        "scale": processor.scale,
        "vocab_size": processor.vocab_size,
        "min_token": processor.min_token,
        "time_horizon": horizon,
        "action_dim": dim,
    }
    (folder / "processor_config.json").write_text(json.dumps(config, indent=1) + "\n")
    return processor


@dataclass
class FastCase:
    name: str
    present: list[str]
    obs_seed: int
    target_seed: int  # the normalized chunk the tiny model is taught to emit for this observation
    prompt: str = FAST_PROMPT
    note: str = ""
    train: bool = True  # taught; an untaught case shows what a half-trained model decodes


@dataclass
class FastSpec:
    name: str
    num_cameras: int
    state_dim: int
    action_dim: int
    chunk_size: int
    n_action_steps: int
    weight_seed: int
    stats_seed: int
    cases: list[FastCase]
    config_kwargs: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)


def fast_specs() -> list[FastSpec]:
    cams = [c[0] for c in CAMERAS]
    return [
        FastSpec(
            "pi0fast_1cam",
            1,
            6,
            6,
            10,
            10,
            5000,
            500,
            [
                FastCase("obs_a", cams[:1], 91, 191),
                FastCase("obs_b", cams[:1], 92, 192, note="another observation: another taught sequence"),
            ],
        ),
        FastSpec(
            "pi0fast_3cam",
            3,
            8,
            7,
            10,
            8,
            6000,
            600,
            [
                FastCase("all_cameras", cams, 93, 193),
                FastCase("missing_left_wrist", [cams[0], cams[2]], 94, 194, note="declared middle camera absent"),
                FastCase("missing_top", cams[1:], 95, 195, note="declared first camera absent"),
                FastCase("untaught", cams, 96, 196, train=False, note="never taught: whatever the weights decode"),
            ],
        ),
    ]


def install_fast_patches() -> None:
    """Shrink LeRobot's pi0-FAST like pi0 (sizes, vocabulary) and route its tokenizers to local folders."""
    from lerobot.policies.pi0_fast import modeling_pi0_fast as mod

    if getattr(mod, "_omni_patched", False):
        return
    orig_paligemma = mod.PaliGemmaForConditionalGenerationWithPiGemma

    def get_gemma_config(variant):
        return mod.GemmaConfig(**PI_SIZES.gemma[variant])

    def paligemma(config):
        for key, value in PI_SIZES.siglip.items():
            setattr(config.vision_config, key, value)
        config.vision_config.projection_dim = config.text_config.hidden_size
        # LeRobot's pi0-FAST leaves SigLIP at 224 px whatever image_resolution says: the tiny tile is ours.
        config.vision_config.image_size = FAST_SIZES["image_size"]
        config.text_config.vocab_size = config._vocab_size = FAST_SIZES["vocab"]
        config.image_token_index = FAST_SIZES["vocab"] - 1
        return orig_paligemma(config)

    mod.get_gemma_config = get_gemma_config
    mod.PaliGemmaForConditionalGenerationWithPiGemma = paligemma
    mod.AutoProcessor = _LocalAutoProcessor
    mod.AutoTokenizer = _LocalAutoTokenizer
    tokenizer_processor.AutoProcessor = _LocalAutoProcessor
    mod._omni_patched = True


def fast_policy_classes():
    from lerobot.policies.pi0_fast.configuration_pi0_fast import PI0FastConfig
    from lerobot.policies.pi0_fast.modeling_pi0_fast import PI0FastPolicy
    from lerobot.policies.pi0_fast.processor_pi0_fast import make_pi0_fast_pre_post_processors

    return PI0FastConfig, PI0FastPolicy, make_pi0_fast_pre_post_processors


def _fast_lm_head(policy):
    return policy.model.paligemma_with_expert.paligemma.lm_head


def _fast_embed_tokens(policy):
    return policy.model.paligemma_with_expert.paligemma.model.language_model.embed_tokens


def fast_batch(policy, pre, obs: dict[str, np.ndarray], prompt: str, action: np.ndarray | None = None):
    frame = prepare_observation_for_inference(
        {k: v.copy() for k, v in obs.items()}, torch.device("cpu"), task=prompt, robot_type=""
    )
    if action is not None:
        frame["action"] = torch.from_numpy(action)[None]
    return pre(frame)


def inference_layout_loss(policy, batch) -> torch.Tensor:
    """Next-token cross entropy of [BOS, "Action: ", FAST tokens, "|"] in the layout LeRobot decodes with: the BOS
    at the end of the bidirectional image + prompt block (LeRobot's training `forward` keeps it in the causal
    action block, and a model taught that way decodes its first token from a different context). Built from
    LeRobot's own embed_prefix_fast / language model / lm_head."""
    model = policy.model
    images, img_masks = policy._preprocess_images(batch)
    tokens, masks = batch["observation.language.tokens"], batch["observation.language.attention_mask"]
    targets, target_mask = batch["action.tokens"], batch["action.token_mask"].bool()
    bos, targets, target_mask = targets[:, :1], targets[:, 1:], target_mask[:, 1:]
    embs, pad_masks, att_masks, _, _ = model.embed_prefix_fast(
        images,
        img_masks,
        torch.cat([tokens, bos], dim=1),
        torch.cat([masks, torch.ones_like(masks[:, :1])], dim=1),
        fast_action_tokens=targets,
        fast_action_masks=target_mask,
    )
    position_ids = torch.cumsum(pad_masks, dim=1) - 1
    att_4d = modeling_pi0.prepare_attention_masks_4d(att_masks, dtype=embs.dtype)
    (hidden, _), _ = model.paligemma_with_expert.forward(
        attention_mask=att_4d, position_ids=position_ids, inputs_embeds=[embs, None], use_cache=False
    )
    n = targets.shape[1]
    logits = _fast_lm_head(policy)(hidden[:, -n - 1 : -1])  # the BOS predicts the first target, and so on
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    weights = target_mask.flatten().float()
    return (loss * weights).sum() / weights.sum()


def generalisation_samples(spec: FastSpec, count: int, seed: int) -> list[tuple[dict, str, np.ndarray]]:
    """Extra (observation, prompt, normalized target) pairs the tiny model is also taught, so that observations it
    was never shown (a node's black frames, an evaluator's synthetic bag: flat grey with a bright bar) still
    decode to a well-formed sequence instead of an immediate end marker: uint8 noise, flat or barred frames of
    several sizes, states from the statistics or small robot-unit values, either prompt."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        obs: dict[str, np.ndarray] = {}
        for key, h, w in CAMERAS[: spec.num_cameras]:
            if rng.random() < 0.15 and obs:
                continue  # a camera missing now and then
            side = int(rng.choice([32, 48]))
            kind = rng.integers(3)
            shape = (h, w, 3) if kind == 0 else (side, side, 3)
            if kind == 0:
                image = rng.integers(0, 256, shape, dtype=np.uint8)
            else:
                image = np.full(shape, int(rng.integers(0, 120)), dtype=np.uint8)
                if kind == 2:
                    x = int(rng.integers(0, side - 2))
                    image[:, x : x + 2] = 230
            obs[key] = image
        s = spec.stats["observation.state"]
        if rng.random() < 0.5:
            state = s["mean"] + s["std"] * rng.normal(0.0, 1.0, s["mean"].shape)
        else:
            state = rng.uniform(-1.0, 1.0, s["mean"].shape)
        obs["observation.state"] = state.astype(np.float32)
        prompt = FAST_PROMPT if rng.random() < 0.5 else "Pick up the RED cube"
        samples.append((obs, prompt, smooth_chunk(rng, spec.chunk_size, spec.action_dim)))
    return samples


def teach(policy, pre, spec: FastSpec, steps: int = 500, lr: float = 3e-3, extras: int = 32) -> list[float]:
    """Shape the random weights with next-token cross entropy on [BOS, "Action: ", FAST tokens, "|"] (LeRobot's own
    action tokenizer step makes the targets) until each taught observation decodes its own chunk: plain random
    weights never emit a FAST token (DESIGN.md 8c). The targets are in robot units: LeRobot's preprocessor
    normalizes and tokenizes them. Every step: one taught case and three generalisation samples."""
    a = spec.stats["action"]

    def batch_of(obs, prompt, target):
        return fast_batch(policy, pre, obs, prompt, target * (a["std"] + 1e-8) + a["mean"])

    taught = []
    for case in spec.cases:
        if not case.train:
            continue
        cams = [c for c in CAMERAS[: spec.num_cameras] if c[0] in case.present]
        obs = robot_observation(case.obs_seed, cams, spec.stats)
        target = smooth_chunk(np.random.default_rng(case.target_seed), spec.chunk_size, spec.action_dim)
        taught.append(batch_of(obs, case.prompt, target))
    pool = [batch_of(*sample) for sample in generalisation_samples(spec, extras, spec.weight_seed + 2)]
    model = policy.model
    _fast_embed_tokens(policy).weight = _fast_lm_head(policy).weight  # tied while taught (as LeRobot loads them)
    params = list({id(p): p for p in model.parameters() if p.requires_grad}.values())
    opt = torch.optim.Adam(params, lr=lr)
    model.train()
    losses = []
    gen = torch.Generator().manual_seed(spec.weight_seed + 1)
    for step in range(steps):
        chosen = [taught[step % len(taught)]] + [pool[int(i)] for i in torch.randint(len(pool), (3,), generator=gen)]
        total = 0.0
        opt.zero_grad()
        for b in chosen:
            loss = inference_layout_loss(policy, b) / len(chosen)
            loss.backward()
            total += float(loss)
        opt.step()
        losses.append(total)
        if os.environ.get("FAST_TEACH_LOG") and step % 50 == 0:
            print(f"    teach {spec.name} step {step}: loss {total:.4f}", flush=True)
    model.eval()
    with torch.no_grad():  # tied, as LeRobot's from_pretrained makes them (it copies lm_head into embed_tokens)
        _fast_embed_tokens(policy).weight.copy_(_fast_lm_head(policy).weight)
    return losses


def run_fast_case(policy, pre, post, obs: dict[str, np.ndarray], prompt: str):
    """observation -> preprocessor -> predict_action_chunk -> postprocessor, recording every lm_head output."""
    policy.reset()
    batch = fast_batch(policy, pre, obs, prompt)
    images, masks = policy._preprocess_images(batch)
    logits: list[torch.Tensor] = []
    generated: list[torch.Tensor] = []
    orig_sample = policy.model.sample_actions_fast_kv_cache

    def hook(_mod, _inp, out):
        logits.append(out[:, -1].detach().float().clone())

    def sample(*args, **kwargs):
        out = orig_sample(*args, **kwargs)
        generated.append(out.detach().clone())
        return out

    handle = _fast_lm_head(policy).register_forward_hook(hook)
    policy.model.sample_actions_fast_kv_cache = sample
    try:
        actions_normalized = policy.predict_action_chunk(batch)
    finally:
        handle.remove()
        del policy.model.sample_actions_fast_kv_cache
    actions = post(actions_normalized.clone())
    steps = len(logits)
    step_logits = torch.stack(logits, dim=1)  # (1, steps, vocab)
    top2 = step_logits.topk(2, dim=-1).values
    tensors = {f"observation/{k}": torch.from_numpy(np.ascontiguousarray(v)) for k, v in obs.items()}
    tensors.update(
        {
            "actions": actions.detach().float().contiguous(),
            "action_tokens": generated[0][:, :steps].to(torch.int64).contiguous(),
            "logits": step_logits.contiguous(),
            "top2_margin": (top2[..., 0] - top2[..., 1]).contiguous(),
            "debug/images": torch.stack([i.float() for i in images], dim=1).contiguous(),
            "debug/image_masks": torch.stack(masks, dim=1).contiguous(),
            "debug/tokens": batch["observation.language.tokens"].to(torch.int64).contiguous(),
            "debug/token_mask": batch["observation.language.attention_mask"].to(torch.bool).contiguous(),
            "debug/state_normalized": batch["observation.state"].float().contiguous(),
            "debug/actions_normalized": actions_normalized.float().contiguous(),
        }
    )
    task = batch.get("task")
    return tensors, task[0] if isinstance(task, list | tuple) else task


def build_fast_fixture(spec: FastSpec, out: Path, tok) -> dict:
    config_cls, policy_cls, make_processors = fast_policy_classes()
    folder = out / spec.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    spec.stats = dataset_stats(spec.stats_seed, spec.num_cameras, spec.state_dim, spec.action_dim)
    tok.save_pretrained(str(folder))
    _LocalAutoTokenizer.folders[PALIGEMMA_TOKENIZER_NAME] = folder
    _LocalAutoProcessor.folder = folder
    fast = fit_fast_tokenizer(folder / FAST_DIRNAME, spec.weight_seed, spec.chunk_size, spec.action_dim)
    inputs, outputs = features(spec.num_cameras, spec.state_dim, spec.action_dim)
    config = config_cls(
        input_features=inputs,
        output_features=outputs,
        chunk_size=spec.chunk_size,
        n_action_steps=spec.n_action_steps,
        device="cpu",
        image_resolution=(PI_IMAGE_SIZE, PI_IMAGE_SIZE),
        action_tokenizer_name=f"./{FAST_DIRNAME}",
        max_action_tokens=64,
        max_decoding_steps=40,
        **spec.config_kwargs,
    )
    with quiet():
        policy = policy_cls(config)
    rules = randomize_parameters(policy, spec.weight_seed)
    pre, post = make_processors(config, dataset_stats=spec.stats)
    losses = teach(policy, pre, spec)
    with quiet():
        policy.save_pretrained(str(folder))
    pre.save_pretrained(str(folder))
    post.save_pretrained(str(folder))

    saved = load_file(str(folder / "model.safetensors"))
    with quiet() as log:
        policy = policy_cls.from_pretrained(str(folder))
    assert_same_weights(saved, policy, spec.name)
    policy.eval()
    pre, post = policy_factory.make_pre_post_processors(policy.config, pretrained_path=str(folder))
    cases_dir = out / "cases"
    cases_dir.mkdir(parents=True, exist_ok=True)
    end_id = tok.convert_tokens_to_ids("|")
    entries: dict[str, dict] = {}
    for case in spec.cases:
        cams = [c for c in CAMERAS[: spec.num_cameras] if c[0] in case.present]
        obs = robot_observation(case.obs_seed, cams, spec.stats)
        tensors, prompt_as_tokenized = run_fast_case(policy, pre, post, obs, case.prompt)
        fname = f"cases/{spec.name}__{case.name}.safetensors"
        save_file(tensors, str(out / fname))
        ids = tensors["debug/tokens"][0][tensors["debug/token_mask"][0]].tolist()
        generated = tensors["action_tokens"][0].tolist()
        margins = tensors["top2_margin"][0]
        entries[case.name] = {
            "file": fname,
            "prompt": case.prompt,
            "prompt_as_tokenized": prompt_as_tokenized,
            "present_cameras": [c[0] for c in cams],
            "missing_cameras": [k for k in policy.config.image_features if k not in case.present],
            "image_masks": tensors["debug/image_masks"][0].tolist(),
            "token_ids": ids,
            "token_strings": tok.convert_ids_to_tokens(ids),
            "generated": generated,
            "generated_strings": tok.convert_ids_to_tokens(generated),
            "ends_with_marker": end_id in generated,
            "decode_steps": len(generated),
            "min_top2_margin": float(margins.min()),
            "steps_with_margin_below_1e-3": int((margins <= 1e-3).sum()),
            "taught": case.train,
            "note": case.note,
            "tensors": describe(tensors),
        }
    sequences = {tuple(e["generated"]) for e in entries.values()}
    return {
        "layout": "lerobot",
        "family": "pi0_fast",
        "path": spec.name,
        "files": sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()),
        "cameras": list(policy.config.image_features),
        "state_dim": spec.state_dim,
        "action_dim": spec.action_dim,
        "chunk_size": policy.config.chunk_size,
        "n_action_steps": policy.config.n_action_steps,
        "max_decoding_steps": policy.config.max_decoding_steps,
        "tokenizer_max_length": policy.config.tokenizer_max_length,
        "text_tokenizer": {
            "file": f"{spec.name}/tokenizer.json",
            "vocab_size": tok.vocab_size,
            "bos_id": tok.bos_token_id,
            "end_marker_id": end_id,
            "action_prefix_ids": tok.encode("Action: ", add_special_tokens=False),
        },
        "fast_tokenizer": {
            "folder": f"{spec.name}/{FAST_DIRNAME}",
            "action_tokenizer_name": policy.config.action_tokenizer_name,
            "scale": fast.scale,
            "vocab_size": fast.vocab_size,
            "bpe_vocab_size": len(fast.tokenizer),
            "min_token": fast.min_token,
            "fast_skip_tokens": policy.config.fast_skip_tokens,
        },
        "teaching": {"steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1]},
        "distinct_sequences": len(sequences),
        "param_count": sum(p.numel() for p in policy.parameters()),
        "weights_sha256": state_dict_sha256(saved),
        "lerobot_reload_log": [line for line in log.getvalue().splitlines() if "key" in line.lower()],
        "randomisation_rules": dict(sorted(Counter(rules.values()).items())),
        "tiny_variants": {"paligemma_variant(gemma_2b)": PI_SIZES.gemma["gemma_2b"], "siglip": PI_SIZES.siglip},
        "cases": entries,
    }


def write_pi0fast(out: Path, threads: int) -> dict:
    """Build every pi0-FAST fixture into `out` (folders, cases/pi0fast_*) and write pi0fast.json."""
    torch.set_num_threads(threads)
    install_fast_patches()
    for old in (out / "cases").glob("pi0fast_*.safetensors"):
        old.unlink()
    tok = fast_text_tokenizer()
    fixtures = {}
    for spec in fast_specs():
        t0 = time.perf_counter()
        torch.manual_seed(spec.weight_seed)
        fixtures[spec.name] = build_fast_fixture(spec, out, tok)
        print(f"  {spec.name}: {len(spec.cases)} cases in {time.perf_counter() - t0:.1f} s", flush=True)
    doc = {
        "format": 1,
        "generator": {
            "script": "scripts/make_reference_fixtures.py --pi0fast-only",
            "lerobot": lerobot.__version__,
            "torch": torch.__version__.split("+")[0],
            "transformers": transformers.__version__,
            "threads": threads,
        },
        "pipeline": (
            "prepare_observation_for_inference(obs, cpu, task=prompt) -> preprocessor -> "
            "PI0FastPolicy.predict_action_chunk(batch) (greedy, KV cache) -> postprocessor, with the policy from "
            "PI0FastPolicy.from_pretrained(folder); logits = lm_head output of every decode step"
        ),
        "checks": {
            f"{name}: distinct generated sequences": float(entry["distinct_sequences"])
            for name, entry in fixtures.items()
        },
        "fixtures": fixtures,
    }
    (out / PI0FAST_MANIFEST).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


if __name__ == "__main__":
    sys.exit(main())
