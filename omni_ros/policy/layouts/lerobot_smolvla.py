"""LeRobot's SmolVLA folder (`"type": "smolvla"`) -> a `Checkpoint` of the SmolVLA family.

    config.json               SmolVLAConfig: features, chunk_size, num_vlm_layers, expert_width_multiplier,
                              self_attn_every_n_layers, attention_mode, resize_imgs_with_padding, vlm_model_name
    model.safetensors         model.vlm_with_expert.{vlm.model.{vision_model, connector, text_model}, lm_expert},
                              model.{state_proj, action_in_proj, action_out_proj, action_time_mlp_in/out}
    policy_*processor.json    normalizer statistics (as for pi0)
    vlm_model_name            the SmolVLM whose config gives what the weights do not say (head counts, epsilons):
                              a folder (relative names resolve against the checkpoint folder), the local HF cache
                              entry of a hub name, or the built-in table of published SmolVLMs. Never downloaded.

The tokenizer: `tokenizer=`, else a tokenizer.json in the checkpoint folder, in the local vlm_model_name folder,
or in the local HF cache entry of vlm_model_name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from omni_ros.policy.layouts import lerobot_legacy
from omni_ros.policy.layouts.common import Checkpoint, CheckpointError
from omni_ros.policy.layouts.lerobot_files import features, norm_stats
from omni_ros.policy.layouts.pi0_weights import siglip_key, siglip_placement
from omni_ros.policy.layouts.tokenizer_files import find_tokenizer, in_folder, in_hf_cache
from omni_ros.policy.layouts.weights import Place, Placement, SafetensorsFile

VLM = "vlm_with_expert.vlm.model."
VISION, TEXT, EXPERT = VLM + "vision_model.", VLM + "text_model.", "vlm_with_expert.lm_expert."
CONNECTOR = VLM + "connector.modality_projection.proj.weight"
# Never read by a policy: the language heads and the VLM's final norm (only its cached keys/values matter).
UNUSED = ("vlm_with_expert.vlm.lm_head.", "vlm_with_expert.lm_expert.lm_head.", TEXT + "norm.")

# What the published SmolVLMs' config.json say, for a machine whose HF cache lacks them.
KNOWN_VLMS: dict[str, dict] = {
    "HuggingFaceTB/SmolVLM2-500M-Video-Instruct": {
        "model_type": "smolvlm",
        "scale_factor": 4,
        "text_config": {
            "model_type": "llama",
            "hidden_size": 960,
            "num_attention_heads": 15,
            "num_key_value_heads": 5,
            "head_dim": 64,
            "rms_norm_eps": 1e-5,
            "hidden_act": "silu",
        },
        "vision_config": {
            "hidden_size": 768,
            "num_attention_heads": 12,
            "image_size": 512,
            "patch_size": 16,
            "layer_norm_eps": 1e-6,
            "hidden_act": "gelu_pytorch_tanh",
        },
    },
}

_LAYER = {
    "input_layernorm.weight": "input_norm.weight",
    "post_attention_layernorm.weight": "post_attn_norm.weight",
    **{f"self_attn.{p}_proj.weight": f"{p}_proj.weight" for p in "qkvo"},
    **{f"mlp.{p}_proj.weight": f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")},
}
_TOP = {
    "state_proj": "state_proj",
    "action_in_proj": "expert.action_in_proj",
    "action_out_proj": "expert.action_out_proj",
    "action_time_mlp_in": "expert.time_mlp_in",
    "action_time_mlp_out": "expert.time_mlp_out",
}
UNSUPPORTED = {
    "add_image_special_tokens": "image special tokens around every camera",
    "adapt_to_pi_aloha": "the pi-internal ALOHA joint space",
    "use_delta_joint_actions_aloha": "delta ALOHA joint actions",
}


def vlm_config(path: Path, name: str) -> tuple[dict, str, Path | None]:
    """(the SmolVLM config, where it came from, the local folder holding it if any) of `vlm_model_name`."""
    if not name:
        raise CheckpointError(f"{path}/config.json: vlm_model_name is empty")
    folder = Path(name) if Path(name).is_absolute() else path / name
    file = folder / "config.json" if (folder / "config.json").is_file() else in_hf_cache(name, ("config.json",))
    if file is not None:
        try:
            return json.loads(file.read_text()), str(file), file.parent
        except ValueError as exc:
            raise CheckpointError(f"{file}: not valid JSON: {exc}") from exc
    if name in KNOWN_VLMS:
        return KNOWN_VLMS[name], f"built-in dimensions of {name}", None
    raise CheckpointError(
        f"{path}: vlm_model_name '{name}' is neither a folder with a SmolVLM config.json (relative names are read "
        f"next to config.json) nor in the local Hugging Face cache, and omni_ros has no built-in dimensions for it "
        f"(known: {', '.join(KNOWN_VLMS)}); omni_ros never downloads it"
    )


def check_vlm(config: dict, source: str) -> tuple[dict, dict]:
    """(text_config, vision_config) of a SmolVLM config, or a CheckpointError naming what is not supported."""
    kind = config.get("model_type")
    text, vision = config.get("text_config") or {}, config.get("vision_config") or {}
    if kind != "smolvlm" or text.get("model_type", "llama") != "llama":
        raise CheckpointError(
            f"{source}: vlm_model_name layout '{kind}' (text model '{text.get('model_type')}') is not supported; "
            "omni_ros runs SmolVLA over a SmolVLM (model_type smolvlm, a llama text model)"
        )
    for part, act, want in ((text, "hidden_act", "silu"), (vision, "hidden_act", "gelu_pytorch_tanh")):
        if part.get(act, want) != want:
            raise CheckpointError(f"{source}: activation '{part.get(act)}' is not supported (SmolVLM uses {want})")
    return text, vision


def our_key(key: str) -> str | None:
    """The SmolVLA-family parameter name of LeRobot key `key` (without `model.`); None for unused tensors."""
    if key.startswith(UNUSED):
        return None
    if key.startswith(VISION):
        if (mapped := siglip_key(key[len(VISION) :])) is not None:
            return mapped
    elif key == CONNECTOR:
        return "vision.connector.weight"
    elif key == TEXT + "embed_tokens.weight":
        return "text.embed_tokens.weight"
    elif key.startswith((TEXT, EXPERT)):
        stack, rest = ("text", key[len(TEXT) :]) if key.startswith(TEXT) else ("expert", key[len(EXPERT) :])
        m = re.fullmatch(r"layers\.(\d+)\.(.+)", rest)
        if m and m.group(2) in _LAYER:
            return f"{stack}.layers.{m.group(1)}.{_LAYER[m.group(2)]}"
        if stack == "expert" and rest == "norm.weight":
            return "expert.norm.weight"
    else:
        head, _, kind = key.rpartition(".")
        if head in _TOP:
            return f"{_TOP[head]}.{kind}"
    raise CheckpointError(f"unknown tensor '{key}' for a SmolVLA checkpoint")


def placer(keys: list[str], shape, prefix: str, text_depth: int) -> Place:
    """Where each tensor of the file goes; text layers past `text_depth` (LeRobot keeps only the first
    num_vlm_layers, so normally there are none) are skipped."""
    vision_width = next((shape(k)[0] for k in keys if k.endswith("patch_embedding.weight")), 0)

    def place(key: str) -> Placement | None:
        mapped = our_key(key[len(prefix) :] if key.startswith(prefix) else key)
        if mapped is None:
            return None
        m = re.match(r"text\.layers\.(\d+)\.", mapped)
        if m and int(m.group(1)) >= text_depth:
            return None
        return siglip_placement(mapped, vision_width, unsqueeze_positions=False)

    return place


def read_smolvla(path: Path, config: dict, tokenizer: Any, saved_by: str = ">=0.4") -> Checkpoint:
    from omni_ros.policy.smolvla.configuration import ExpertConfig, SmolVLAConfig, TextConfig, VisionConfig

    source = path / "config.json"
    for option, what in UNSUPPORTED.items():
        if config.get(option):
            raise CheckpointError(f"{source}: {option} ({what}) is not supported by omni_ros's SmolVLA")
    cameras, state_dim, action_dim = features(config, source)
    vlm_name = str(config.get("vlm_model_name") or "HuggingFaceTB/SmolVLM2-500M-Video-Instruct")
    vlm, vlm_source, vlm_folder = vlm_config(path, vlm_name)
    text_cfg, vision_cfg = check_vlm(vlm, vlm_source)

    weights = path / "model.safetensors"
    file = SafetensorsFile(weights)
    legacy = saved_by == lerobot_legacy.ERA
    keys = file.names()
    prefix = "model." if any(k.startswith("model.") for k in keys) else ""
    model_keys = [k for k in keys if not k.startswith(lerobot_legacy.MODULES)]
    names = {k[len(prefix) :] if k.startswith(prefix) else k: k for k in model_keys}

    def shape(name: str) -> tuple[int, ...]:
        if name not in names:
            raise CheckpointError(f"{weights}: no '{prefix}{name}' (not a SmolVLA checkpoint?)")
        return file.shape(names[name])

    def depth(stack: str) -> int:
        layers = {int(m.group(1)) for k in names if (m := re.match(rf"{re.escape(stack)}layers\.(\d+)\.", k))}
        if not layers or layers != set(range(len(layers))):
            raise CheckpointError(f"{weights}: layers of '{stack}' missing or not numbered 0..n-1")
        return len(layers)

    def mismatch(what: str, config_value: Any, weights_value: Any) -> CheckpointError:
        return CheckpointError(f"{path}: {what} is {config_value} in the config but {weights_value} in the weights")

    # Vision: sizes from the weights, heads and epsilon from the SmolVLM config.
    v_width, _, patch, _ = shape(VISION + "embeddings.patch_embedding.weight")
    positions = shape(VISION + "embeddings.position_embedding.weight")[0]
    side = round(positions**0.5)
    if side * side != positions:
        raise CheckpointError(f"{weights}: {positions} vision positions are not a square grid")
    scale_sq = shape(CONNECTOR)[1] // v_width
    scale = round(scale_sq**0.5)
    if scale * scale * v_width != shape(CONNECTOR)[1] or scale != int(vlm.get("scale_factor", scale)):
        raise mismatch("the pixel-shuffle scale_factor", vlm.get("scale_factor"), f"connector {shape(CONNECTOR)}")
    vision = VisionConfig(
        image_size=side * patch,
        patch_size=patch,
        width=v_width,
        depth=depth(VISION + "encoder."),
        num_heads=int(vision_cfg.get("num_attention_heads", 12)),
        mlp_dim=shape(VISION + "encoder.layers.0.mlp.fc1.weight")[0],
        norm_eps=float(vision_cfg.get("layer_norm_eps", 1e-6)),
        scale_factor=scale,
    )
    if int(vision_cfg.get("hidden_size", v_width)) != v_width:
        raise mismatch("the vision width", vision_cfg.get("hidden_size"), v_width)

    # Text decoder: the first num_vlm_layers.
    vocab, width = shape(TEXT + "embed_tokens.weight")
    heads = int(text_cfg.get("num_attention_heads", 0))
    head_dim = int(text_cfg.get("head_dim") or (width // heads if heads else 0))
    if not heads or not head_dim:
        raise CheckpointError(f"{vlm_source}: text_config has no num_attention_heads / head_dim")
    if shape(TEXT + "layers.0.self_attn.q_proj.weight")[0] != heads * head_dim:
        raise mismatch("text heads x head_dim", heads * head_dim, shape(TEXT + "layers.0.self_attn.q_proj.weight"))
    kv_heads = shape(TEXT + "layers.0.self_attn.k_proj.weight")[0] // head_dim
    stored = depth(TEXT)
    wanted = int(config.get("num_vlm_layers") or -1)
    text_depth = stored if wanted <= 0 else wanted
    if text_depth > stored:
        raise mismatch("num_vlm_layers", wanted, f"{stored} text layers")
    text = TextConfig(
        width=width,
        depth=text_depth,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        mlp_dim=shape(TEXT + "layers.0.mlp.gate_proj.weight")[0],
        norm_eps=float(text_cfg.get("rms_norm_eps", 1e-5)),
    )

    # Expert: width and depth from the weights, checked against the config's multiplier and layer count.
    e_width = shape(EXPERT + "layers.0.input_layernorm.weight")[0]
    e_depth = depth(EXPERT)
    multiplier = float(config.get("expert_width_multiplier", 0.75))
    if int(width * multiplier) != e_width:
        raise mismatch(
            f"the expert width (text width {width} x expert_width_multiplier)", int(width * multiplier), e_width
        )
    want_e = int(config.get("num_expert_layers") or -1)
    if (want_e if want_e > 0 else text_depth) != e_depth:
        raise mismatch("the expert depth", want_e if want_e > 0 else text_depth, e_depth)
    mode = str(config.get("attention_mode", "cross_attn"))
    expert = ExpertConfig(
        width=e_width,
        depth=e_depth,
        mlp_dim=shape(EXPERT + "layers.0.mlp.gate_proj.weight")[0],
        attention_mode="cross_attn" if "cross" in mode else "self_attn",
        self_attn_every_n_layers=int(config.get("self_attn_every_n_layers", 2)),
    )
    state_width = shape("state_proj.weight")[1]
    action_width = shape("action_in_proj.weight")[1]
    for what, value, stored_width in (
        ("max_state_dim", config.get("max_state_dim", state_width), state_width),
        ("max_action_dim", config.get("max_action_dim", action_width), action_width),
    ):
        if int(value) != stored_width:
            raise mismatch(what, value, stored_width)
    resize = config.get("resize_imgs_with_padding")
    if not resize or len(resize) != 2 or resize[0] != resize[1]:
        raise CheckpointError(f"{source}: resize_imgs_with_padding {resize} (omni_ros's SmolVLA needs a square tile)")

    given = tokenizer
    if given is None and in_folder(path) is None and vlm_folder is not None and in_folder(vlm_folder):
        given = vlm_folder  # a local SmolVLM folder brings its own tokenizer
    found, origin, tok_cfg = find_tokenizer(path, given, vlm_name, vocab)
    tok_cfg.max_tokens = int(config.get("tokenizer_max_length") or 48)
    try:
        model = SmolVLAConfig(
            name=path.name,
            camera_names=cameras,
            state_dim=state_dim,
            action_dim=action_dim,
            action_horizon=int(config.get("chunk_size", 50)),
            num_steps=int(config.get("num_steps", 10)),
            max_state_dim=state_width,
            max_action_dim=action_width,
            tile_size=int(resize[0]),
            vision=vision,
            text=text,
            expert=expert,
            tokenizer=tok_cfg,
            vocab_size=vocab,
            time_min_period=float(config.get("min_period", 4e-3)),
            time_max_period=float(config.get("max_period", 4.0)),
            lerobot_era="0.3" if legacy else "current",
            euler_time="float32_accumulated" if legacy else "exact",
        )
    except ValueError as exc:
        raise CheckpointError(f"{source}: {exc}") from exc
    return Checkpoint(
        path=path,
        layout="lerobot",
        family="smolvla",
        config=model,
        weights=weights,
        norm_stats=(lerobot_legacy.read_stats if legacy else norm_stats)(path, config, state_dim, action_dim),
        tokenizer=found,
        extra={"lerobot_type": "smolvla", "lerobot_era": saved_by, "vlm": vlm_source},
        place=lerobot_legacy.skip_buffers(placer(keys, file.shape, prefix, text_depth)),
        tokenizer_source=origin,
    )
