"""The reference pi0 / pi0.5 weight tree (openpi's PyTorch port, which LeRobot wraps under `model.`) read into
the pi0 family's names, and the architecture read off the weight shapes.

Head counts are not in the weights: both Gemma stacks of every released variant have 8 query heads and one
KV head (the reference's joint attention reshapes with a literal 8), SigLIP has 16; head_dim follows from
the projection shapes. The token embedding may be stored only as `lm_head` (tied).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from omni_ros.policy.layouts.common import CheckpointError
from omni_ros.policy.layouts.weights import Place, Placement
from omni_ros.policy.pi0.configuration import TransformerConfig, VisionConfig

GEMMA_HEADS = 8
SIGLIP_HEADS = 16

PALI = "paligemma_with_expert.paligemma."
VISION = PALI + "model.vision_tower.vision_model."
LANGUAGE = PALI + "model.language_model."
EXPERT = "paligemma_with_expert.gemma_expert.model."

# Key paths of transformers < 4.52 (LeRobot < 0.4 checkpoints) -> today's.
_OLD_PATHS = (
    (PALI + "language_model.model.", LANGUAGE),
    (PALI + "language_model.lm_head.", PALI + "lm_head."),
    (PALI + "vision_tower.", PALI + "model.vision_tower."),
    (PALI + "multi_modal_projector.", PALI + "model.multi_modal_projector."),
)

_LAYER = {
    "input_layernorm.weight": "input_norm.weight",
    "input_layernorm.dense.weight": "input_norm.dense.weight",
    "input_layernorm.dense.bias": "input_norm.dense.bias",
    "post_attention_layernorm.weight": "post_attn_norm.weight",
    "post_attention_layernorm.dense.weight": "post_attn_norm.dense.weight",
    "post_attention_layernorm.dense.bias": "post_attn_norm.dense.bias",
    "self_attn.q_proj.weight": "q_proj.weight",
    "self_attn.k_proj.weight": "k_proj.weight",
    "self_attn.v_proj.weight": "v_proj.weight",
    "self_attn.o_proj.weight": "o_proj.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
_VIT = {
    "layer_norm1": "norm1",
    "layer_norm2": "norm2",
    "self_attn.out_proj": "proj",
    "mlp.fc1": "fc1",
    "mlp.fc2": "fc2",
}
_TOP = {
    "state_proj": "expert.state_proj",
    "action_in_proj": "expert.action_in_proj",
    "action_out_proj": "expert.action_out_proj",
    "action_time_mlp_in": "expert.time_mlp_in",  # pi0: MLP over [action, time]
    "action_time_mlp_out": "expert.time_mlp_out",
    "time_mlp_in": "expert.time_mlp_in",  # pi0.5: MLP over time (adaRMS condition)
    "time_mlp_out": "expert.time_mlp_out",
}
# Read but not used by a policy: the heads of the language models and the backbone's final norm.
_UNUSED = (PALI + "lm_head.", "paligemma_with_expert.gemma_expert.lm_head.", LANGUAGE + "norm.")


def modern_key(key: str) -> str:
    """`key` with the pre-0.4 LeRobot / older transformers paths rewritten to today's."""
    for old, new in _OLD_PATHS:
        if key.startswith(old):
            return new + key[len(old) :]
    return key


def our_key(key: str) -> str | None:
    """The pi0-family parameter name of reference key `key` (no `model.` prefix), None for unused tensors, or a
    CheckpointError for a key this layout does not know."""
    key = modern_key(key)
    if key.startswith(_UNUSED):
        return None
    if key.startswith(VISION):
        if (mapped := siglip_key(key[len(VISION) :])) is not None:
            return mapped
    elif key.startswith(PALI + "model.multi_modal_projector.linear."):
        return "vision.proj." + key.rsplit(".", 1)[1]
    elif key == LANGUAGE + "embed_tokens.weight":
        return "backbone.embed_tokens.weight"
    elif key.startswith((LANGUAGE, EXPERT)):
        stack, rest = ("backbone", key[len(LANGUAGE) :]) if key.startswith(LANGUAGE) else ("expert", key[len(EXPERT) :])
        m = re.fullmatch(r"layers\.(\d+)\.(.+)", rest)
        if m and m.group(2) in _LAYER:
            return f"{stack}.layers.{m.group(1)}.{_LAYER[m.group(2)]}"
        if stack == "expert" and rest.startswith("norm."):
            return "expert.final_norm." + rest[len("norm.") :]
    else:
        head, _, kind = key.rpartition(".")
        if head in _TOP:
            return f"{_TOP[head]}.{kind}"
    raise CheckpointError(f"unknown tensor '{key}' for a pi0 / pi0.5 checkpoint")


def siglip_key(rest: str) -> str | None:
    """The `vision.` parameter name of a SigLIP tensor (`rest`: its key below `vision_model.`), or None.

    q/k/v become rows of one `qkv` linear: `qkv.q.weight` etc. here, placed by `siglip_placement`."""
    if rest.startswith("embeddings.patch_embedding."):
        return "vision.patch_embed." + rest.rsplit(".", 1)[1]
    if rest == "embeddings.position_embedding.weight":
        return "vision.pos_embed"
    if rest.startswith("post_layernorm."):
        return "vision.norm." + rest.rsplit(".", 1)[1]
    m = re.fullmatch(r"encoder\.layers\.(\d+)\.(.+)\.(weight|bias)", rest)
    if m:
        i, part, kind = m.groups()
        if part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            return f"vision.blocks.{i}.qkv.{part[-6]}.{kind}"
        if part in _VIT:
            return f"vision.blocks.{i}.{_VIT[part]}.{kind}"
    return None


def siglip_placement(mapped: str, vision_width: int, unsqueeze_positions: bool) -> Placement:
    """Where the tensor named `mapped` goes: q/k/v as rows of `qkv`, positions with a leading 1 if asked."""
    if ".qkv." in mapped:
        block, part = mapped.split(".qkv.")
        index = "qkv".index(part[0])
        return Placement(f"{block}.qkv.{part[2:]}", rows=(index * vision_width, (index + 1) * vision_width))
    return Placement(mapped, unsqueeze=unsqueeze_positions and mapped == "vision.pos_embed")


def placer(keys: list[str], shapes: Callable[[str], tuple[int, ...]], strip_prefix: str = "") -> Place:
    """Where each tensor of a reference pi0 / pi0.5 file goes in the pi0 family's model."""
    names = {k: k[len(strip_prefix) :] if strip_prefix and k.startswith(strip_prefix) else k for k in keys}
    has_embedding = any(modern_key(n) == LANGUAGE + "embed_tokens.weight" for n in names.values())
    vision_width = next((shapes(k)[0] for k, n in names.items() if n.endswith("patch_embedding.weight")), 0)

    def place(key: str) -> Placement | None:
        name = names[key]
        if modern_key(name) == PALI + "lm_head.weight" and not has_embedding:
            return Placement("backbone.embed_tokens.weight")  # tied: public checkpoints ship only lm_head
        mapped = our_key(name)
        return None if mapped is None else siglip_placement(mapped, vision_width, unsqueeze_positions=True)

    return place


def our_shapes(keys: list[str], shapes: Callable[[str], tuple[int, ...]], place: Place) -> dict[str, tuple[int, ...]]:
    """Shapes of the model's parameters as the file would fill them (what `architecture` reads)."""
    out: dict[str, tuple[int, ...]] = {}
    for key in keys:
        placement = place(key)
        if placement is None:
            continue
        shape = shapes(key)
        if placement.unsqueeze:
            shape = (1, *shape)
        if placement.rows is not None:
            shape = (placement.rows[1] if placement.name not in out else max(out[placement.name][0], placement.rows[1]),
                      *shape[1:])  # fmt: skip
        out[placement.name] = shape
    return out


@dataclass(frozen=True)
class Architecture:
    """Sizes of a reference pi0 / pi0.5 read off its weights."""

    vision: VisionConfig
    backbone: TransformerConfig
    expert: TransformerConfig
    vocab_size: int
    state_width: int  # 0 for pi0.5 (no state projection)
    action_width: int
    variant: Literal["pi0", "pi05"]

    def model_fields(self) -> dict[str, Any]:
        """The ModelConfig fields the weights decide (both reference layouts build their config from these)."""
        return {
            "vision": self.vision,
            "backbone": self.backbone,
            "expert": self.expert,
            "vocab_size": self.vocab_size,
            "variant": self.variant,
            "mlp_activation": "gelu_tanh",  # the reference models' GELU
            "max_action_dim": self.action_width,
        }


def architecture(shapes: dict[str, tuple[int, ...]], image_size: int | None, source: str) -> Architecture:
    """The architecture of pi0-family weights (our names) from their shapes."""
    vision, backbone, vocab, gemma = prefix_architecture(shapes, image_size, source)
    variant: Literal["pi0", "pi05"] = "pi05" if "expert.final_norm.dense.weight" in shapes else "pi0"
    if "expert.action_in_proj.weight" not in shapes:
        raise CheckpointError(f"{source}: the weights have no 'expert.action_in_proj.weight' (not a pi0 / pi0.5?)")
    return Architecture(
        vision=vision,
        backbone=backbone,
        expert=gemma("expert"),
        vocab_size=vocab,
        state_width=shapes["expert.state_proj.weight"][1] if "expert.state_proj.weight" in shapes else 0,
        action_width=shapes["expert.action_in_proj.weight"][1],
        variant=variant,
    )


def prefix_architecture(
    shapes: dict[str, tuple[int, ...]], image_size: int | None, source: str
) -> tuple[VisionConfig, TransformerConfig, int, Callable[[str], TransformerConfig]]:
    """(vision, backbone, vocabulary rows, a reader of another Gemma stack) of PaliGemma weights (our names): the
    part pi0, pi0.5 and pi0-FAST share."""

    def shape(name: str) -> tuple[int, ...]:
        if name not in shapes:
            raise CheckpointError(f"{source}: the weights have no '{name}' (not a pi0 / pi0.5 checkpoint?)")
        return shapes[name]

    def depth(prefix: str) -> int:
        layers = {int(m.group(1)) for k in shapes if (m := re.match(rf"{re.escape(prefix)}\.(\d+)\.", k))}
        if not layers or layers != set(range(len(layers))):
            raise CheckpointError(f"{source}: layers of '{prefix}' missing or not numbered 0..n-1")
        return len(layers)

    def gemma(prefix: str) -> TransformerConfig:
        q_out, width = shape(f"{prefix}.layers.0.q_proj.weight")
        head_dim = q_out // GEMMA_HEADS
        kv_heads = shape(f"{prefix}.layers.0.k_proj.weight")[0] // head_dim
        mlp = shape(f"{prefix}.layers.0.mlp.gate_proj.weight")[0]
        return TransformerConfig(width, depth(f"{prefix}.layers"), GEMMA_HEADS, kv_heads, head_dim, mlp)

    width, _, patch, _ = shape("vision.patch_embed.weight")
    positions = shape("vision.pos_embed")[1]
    side = round(positions**0.5)
    if side * side != positions:
        raise CheckpointError(f"{source}: {positions} vision positions are not a square grid")
    size = side * patch
    if image_size is not None and image_size != size:
        raise CheckpointError(f"{source}: image_resolution {image_size} does not match the weights' {size} px")
    vision = VisionConfig(
        image_size=size,
        patch_size=patch,
        width=width,
        depth=depth("vision.blocks"),
        num_heads=SIGLIP_HEADS,
        mlp_dim=shape("vision.blocks.0.fc1.weight")[0],
    )
    if width % SIGLIP_HEADS:
        raise CheckpointError(f"{source}: vision width {width} is not divisible by SigLIP's {SIGLIP_HEADS} heads")
    return vision, gemma("backbone"), shape("backbone.embed_tokens.weight")[0], gemma


def tensor_shapes(tensors: dict) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in tensors.items()}
