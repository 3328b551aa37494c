"""LeRobot 0.6.1's `xvla` folder -> the X-VLA family (DESIGN.md 8d).

config.json                 type "xvla", features, florence_config (inline: the remote-code form checkpoints carry,
                            with dim_embed / image_pos_embed / ..., or the native transformers form), hidden_size,
                            depth, num_heads, num_domains, len_soft_prompts, dim_time, max_len_seq, action_mode, ...
model.safetensors           under `model.`: `vlm.` (Florence-2, native or the older vendored key layout, remapped as
                            LeRobot does) and `transformer.` (the head)
policy_*processor.json      the tokenizer step (BART, max 64) and `xvla_add_domain_id` (the saved domain)
tokenizer.json              the BART tokenizer (not written by LeRobot; looked for as for the other families)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omni_ros.policy.layouts.common import Checkpoint, CheckpointError
from omni_ros.policy.layouts.lerobot_files import features, processor_step
from omni_ros.policy.layouts.tokenizer_files import find_tokenizer
from omni_ros.policy.layouts.weights import Placement, SafetensorsFile
from omni_ros.policy.normalize import NormStats

V = "vlm."
# The vendored (Microsoft remote-code) Florence-2 names -> the native ones (LeRobot's _remap_vendored_florence...).
_BLOCK = r"vision_tower\.blocks\.(\d+)\.(\d+)\.(spatial_block|channel_block)\."
_NEW_BLOCK = r"vision_tower.blocks.\1.\2.\3."
VENDORED_RULES = [
    (r"vision_tower\.convs\.(\d+)\.proj\.", r"vision_tower.convs.\1.conv."),
    (_BLOCK + r"conv1\.fn\.dw\.", _NEW_BLOCK + "conv1."),
    (_BLOCK + r"conv2\.fn\.dw\.", _NEW_BLOCK + "conv2."),
    (_BLOCK + r"(window_attn|channel_attn)\.norm\.", _NEW_BLOCK + "norm1."),
    (_BLOCK + r"(window_attn|channel_attn)\.fn\.", _NEW_BLOCK + r"\4."),
    (_BLOCK + r"ffn\.norm\.", _NEW_BLOCK + "norm2."),
    (_BLOCK + r"ffn\.fn\.net\.", _NEW_BLOCK + "ffn."),
    (r"image_proj_norm\.", "multi_modal_projector.image_proj_norm."),
    (r"image_pos_embed\.", "multi_modal_projector.image_position_embed."),
    (r"visual_temporal_embed\.", "multi_modal_projector.visual_temporal_embed."),
    (r"language_model\.model\.", "language_model."),
]
EMBED = V + "language_model.encoder.embed_tokens.weight"
SHARED = V + "language_model.shared.weight"


def native_name(name: str) -> str:
    """A `vlm.` name of either Florence-2 layout as the native transformers tree spells it."""
    if not name.startswith(V):
        return name
    rest = name[len(V) :]
    for pattern, replacement in VENDORED_RULES:
        rest, count = re.subn("^" + pattern, replacement, rest, count=1)
        if count:
            break
    return V + rest


def xvla_placer(keys: list[str]):
    names = {k: native_name(k.removeprefix("model.")) for k in keys}
    has_embed = EMBED in names.values()

    def place(key: str) -> Placement | None:
        name = names[key]
        if name == V + "image_projection":
            # vendored: an (in, out) parameter used as x @ p; native: the Linear's (out, in) weight
            return Placement(V + "multi_modal_projector.image_projection.weight", transpose=True)
        if name.endswith("visual_temporal_embed.pos_idx_to_embed") or name.endswith("final_logits_bias"):
            return None  # a fixed cosine table (recomputed) / a generation-only buffer
        if name.startswith(V + "language_model.decoder.") or name.startswith(V + "language_model.lm_head"):
            return None  # X-VLA uses the encoder side only
        if name == SHARED:
            return None if has_embed else Placement(EMBED)  # tied: safetensors kept one of the two
        return Placement(name)

    return place


def translate_florence(florence: Any, source: Path) -> tuple[dict, dict]:
    """(vision, text) fields of config.json's florence_config in the native form, as LeRobot translates them."""
    if not isinstance(florence, dict) or not florence.get("vision_config") or not florence.get("text_config"):
        raise CheckpointError(f"{source}: florence_config needs vision_config and text_config")
    vision = dict(florence["vision_config"])
    kind = vision.pop("model_type", None)
    if kind not in (None, "davit", "florence_vision"):
        raise CheckpointError(f"{source}: unsupported Florence-2 vision backbone {kind!r} (DaViT only)")
    pos = vision.pop("image_pos_embed", None)
    if pos is not None:
        if pos.get("type") != "learned_abs_2d":
            raise CheckpointError(f"{source}: unsupported Florence-2 image_pos_embed type {pos.get('type')!r}")
        vision["max_position_embeddings"] = pos["max_pos_embeddings"]
    temporal = vision.pop("visual_temporal_embedding", None)
    if temporal is not None:
        if temporal.get("type") != "COSINE":
            raise CheckpointError(
                f"{source}: unsupported Florence-2 visual_temporal_embedding {temporal.get('type')!r}"
            )
        vision["max_temporal_embeddings"] = temporal["max_temporal_embeddings"]
    pooling = vision.pop("image_feature_source", None)
    if pooling is not None and list(pooling) != ["spatial_avg_pool", "temporal_avg_pool"]:
        raise CheckpointError(f"{source}: unsupported Florence-2 image_feature_source {pooling!r}")
    if "dim_embed" in vision:
        vision["embed_dim"] = vision.pop("dim_embed")
    text = dict(florence["text_config"])
    if text.get("model_type", "florence2_language") not in ("florence2_language", "bart"):
        raise CheckpointError(f"{source}: unsupported Florence-2 language model {text.get('model_type')!r} (BART only)")
    return vision, text


def read_xvla(path: Path, config: dict, tokenizer: Any) -> Checkpoint:
    from omni_ros.policy.xvla.action_space import build_action_space
    from omni_ros.policy.xvla.configuration import BartConfig, DaViTConfig, HeadConfig, XVLAConfig

    source = path / "config.json"
    cameras, state_dim, action_dim = features(config, source)
    vision_fields, text_fields = translate_florence(config.get("florence_config"), source)
    try:
        defaults = DaViTConfig()
        vision = DaViTConfig(
            **{
                k: vision_fields.get(k, getattr(defaults, k))
                for k in (
                    "depths",
                    "embed_dim",
                    "num_heads",
                    "num_groups",
                    "patch_size",
                    "patch_stride",
                    "patch_padding",
                    "patch_prenorm",
                    "window_size",
                    "mlp_ratio",
                    "qkv_bias",
                    "projection_dim",
                    "max_position_embeddings",
                    "max_temporal_embeddings",
                )
            },
            activation=str(vision_fields.get("activation_function", "gelu")),
        )
        text = BartConfig(
            vocab_size=int(text_fields.get("vocab_size", 50265)),
            width=int(text_fields.get("d_model", 1024)),
            depth=int(text_fields.get("encoder_layers", 12)),
            num_heads=int(text_fields.get("encoder_attention_heads", 16)),
            mlp_dim=int(text_fields.get("encoder_ffn_dim", 4096)),
            max_positions=int(text_fields.get("max_position_embeddings", 1024)),
            activation=str(text_fields.get("activation_function", "gelu")),
            scale_embedding=bool(text_fields.get("scale_embedding", False)),
        )
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: florence_config cannot be built: {exc}") from exc
    for what, act in (("vision", vision.activation), ("text", text.activation)):
        if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "silu"):
            raise CheckpointError(f"{source}: Florence-2 {what} activation {act!r} is not supported")
    vision.activation = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}.get(
        vision.activation, vision.activation
    )
    text.activation = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}.get(text.activation, text.activation)
    mode = str(config.get("action_mode", "ee6d"))
    max_action = int(config.get("max_action_dim", 20))
    try:
        space = build_action_space(mode, action_dim, max_action)
    except ValueError as exc:
        raise CheckpointError(f"{source}: {exc}") from exc
    if config.get("domain_feature_key"):
        raise CheckpointError(f"{source}: domain_feature_key is not supported (send `domain_id` instead)")
    if str(config.get("dtype", "float32")) not in ("float32", "bfloat16"):
        raise CheckpointError(f"{source}: dtype {config.get('dtype')!r}")
    head = HeadConfig(
        width=int(config.get("hidden_size", 1024)),
        depth=int(config.get("depth", 24)),
        num_heads=int(config.get("num_heads", 16)),
        mlp_ratio=float(config.get("mlp_ratio", 4.0)),
        num_domains=int(config.get("num_domains", 30)),
        len_soft_prompts=int(config.get("len_soft_prompts", 32)),
        dim_time=int(config.get("dim_time", 32)),
        max_len_seq=int(config.get("max_len_seq", 512)),
        use_hetero_proj=bool(config.get("use_hetero_proj", False)),
    )
    mapping = config.get("normalization_mapping") or {}
    if any(mapping.get(k, "IDENTITY") != "IDENTITY" for k in ("STATE", "ACTION")):
        from omni_ros.policy.layouts.lerobot_files import norm_stats

        stats = norm_stats(path, config, state_dim, action_dim)
    else:
        stats = NormStats.identity(state_dim, action_dim)
    step = processor_step(path, "pre", "xvla_add_domain_id")
    domain = int(step.get("config", {}).get("domain_id", 0))
    tok_step = processor_step(path, "pre", "tokenizer_processor")
    tok_cfg_json = tok_step.get("config", {})
    hub_name = str(tok_cfg_json.get("tokenizer_name") or config.get("tokenizer_name") or "facebook/bart-large")
    if (
        tok_cfg_json.get("padding", "max_length") != "max_length"
        or tok_cfg_json.get("padding_side", "right") != "right"
    ):
        raise CheckpointError(f"{source}: X-VLA's tokenizer step must pad right to max_length")
    found, origin, tok_cfg = find_tokenizer(path, tokenizer, hub_name, text.vocab_size)
    tok_cfg.max_tokens = int(tok_cfg_json.get("max_length") or config.get("tokenizer_max_length") or 64)
    resize = config.get("resize_imgs_with_padding")
    views = config.get("num_image_views") or len(cameras)
    weights = path / "model.safetensors"
    keys = SafetensorsFile(weights).names()
    try:
        model = XVLAConfig(
            name=path.name,
            camera_names=cameras,
            state_dim=state_dim,
            action_dim=action_dim,
            action_horizon=int(config.get("chunk_size", 32)),
            num_steps=int(config.get("num_denoising_steps", 10)),
            action_mode=mode,
            model_dim_action=space.dim_action,
            max_state_dim=int(config.get("max_state_dim", 32)),
            use_proprio=bool(config.get("use_proprio", True)),
            resize=[int(x) for x in resize] if resize else None,
            num_views=max(int(views), len(cameras)),
            domain_id=domain,
            vision=vision,
            text=text,
            head=head,
            tokenizer=tok_cfg,
        )
    except ValueError as exc:
        raise CheckpointError(f"{source}: {exc}") from exc
    vendored = any(native_name(k.removeprefix("model.")) != k.removeprefix("model.") for k in keys)
    return Checkpoint(
        path=path,
        layout="lerobot",
        family="xvla",
        config=model,
        weights=weights,
        norm_stats=stats,
        tokenizer=found,
        extra={"lerobot_type": "xvla", "florence_layout": "vendored" if vendored else "native"},
        place=xvla_placer(keys),
        tokenizer_source=origin,
    )
