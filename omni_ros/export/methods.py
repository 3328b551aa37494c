"""The policy's stages as separate `nn.Module`s with flat tensor signatures, one per `.pte` method.

    encode_images(images [, tokens, token_mask])            -> image_tokens   (the prompt only with vision.film)
    prefill(image_tokens, image_masks, tokens, token_mask)  -> k_0, v_0, k_1, v_1, ...   (the prefix KV cache)
    denoise_step(prefix_mask, state, x_t, t, k_0, v_0, ...) -> velocity
    sample(images, image_masks, tokens, token_mask, state, noise) -> actions   (the whole Euler loop, fused)

Shapes are static (batch 1, the config's cameras, prompt length and horizon):
every backend plans memory for them and QNN requires it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.pi0.configuration import ModelConfig
from omni_ros.policy.pi0.modeling import Pi0Model

METHODS = ("encode_images", "prefill", "denoise_step", "sample")
STAGED = ("encode_images", "prefill", "denoise_step")


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


def prefix_mask_of(image_masks: torch.Tensor, token_mask: torch.Tensor, tokens_per_camera: int) -> torch.Tensor:
    """Validity (B, P) of the prefix [image tokens, prompt tokens], as `Pi0Model.embed_prefix` builds it."""
    return torch.cat([image_masks.repeat_interleave(tokens_per_camera, dim=1), token_mask], dim=1)


def kv_names(cfg: ModelConfig) -> list[str]:
    return [f"{kind}_{i}" for i in range(cfg.backbone.depth) for kind in ("k", "v")]


class EncodeImages(nn.Module):
    def __init__(self, model: Pi0Model) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor, *prompt: torch.Tensor) -> torch.Tensor:
        return self.model.encode_images(images, *prompt)


class Prefill(nn.Module):
    def __init__(self, model: Pi0Model) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, image_tokens: torch.Tensor, image_masks: torch.Tensor, tokens: torch.Tensor, token_mask: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        prefix, mask = self.model.join_prefix(image_tokens, image_masks, tokens, token_mask)
        return tuple(t for kv in self.model.prefill(prefix, mask) for t in kv)


class DenoiseStep(nn.Module):
    def __init__(self, model: Pi0Model) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, prefix_mask: torch.Tensor, state: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, *kv: torch.Tensor
    ) -> torch.Tensor:
        cache = [(kv[i], kv[i + 1]) for i in range(0, len(kv), 2)]
        return self.model.denoise_step(cache, prefix_mask, state, x_t, t)


class Sample(nn.Module):
    def __init__(self, model: Pi0Model, num_steps: int) -> None:
        super().__init__()
        self.model, self.num_steps = model, num_steps

    def forward(
        self,
        images: torch.Tensor,
        image_masks: torch.Tensor,
        tokens: torch.Tensor,
        token_mask: torch.Tensor,
        state: torch.Tensor,
        noise: torch.Tensor,
    ) -> torch.Tensor:
        inputs = ModelInputs(images, image_masks, tokens, token_mask, state)
        return self.model.sample(inputs, noise, num_steps=self.num_steps)


def signatures(cfg: ModelConfig, batch: int = 1) -> dict[str, MethodSignature]:
    """Input/output specs of every method for `cfg` (what the sidecar records and the runtime checks)."""
    c, s, v = len(cfg.camera_names), cfg.vision.image_size, cfg.vision.num_tokens
    t, p, w = cfg.tokenizer.max_tokens, cfg.prefix_len, cfg.backbone.width
    kv_shape = (batch, cfg.backbone.num_kv_heads, p, cfg.backbone.head_dim)
    kv = tuple(TensorSpec(n, kv_shape, "float32") for n in kv_names(cfg))
    images = TensorSpec("images", (batch, c, 3, s, s), "float32")
    image_masks = TensorSpec("image_masks", (batch, c), "bool")
    tokens = TensorSpec("tokens", (batch, t), "int64")
    token_mask = TensorSpec("token_mask", (batch, t), "bool")
    state = TensorSpec("state", (batch, cfg.model_state_dim), "float32")
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
                TensorSpec("t", (batch,), "float32"),
                *kv,
            ),
            (TensorSpec("velocity", chunk, "float32"),),
        ),
        MethodSignature(
            "sample",
            (images, image_masks, tokens, token_mask, state, TensorSpec("noise", chunk, "float32")),
            (TensorSpec("actions", chunk, "float32"),),
        ),
    ]
    return {m.name: m for m in specs}


def example_inputs(signature: MethodSignature, cfg: ModelConfig, seed: int = 0) -> tuple[torch.Tensor, ...]:
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


def method_module(model: Pi0Model, name: str, num_steps: int | None = None) -> nn.Module:
    """The wrapper module exporting method `name` of `model`."""
    if name == "encode_images":
        return EncodeImages(model)
    if name == "prefill":
        return Prefill(model)
    if name == "denoise_step":
        return DenoiseStep(model)
    if name == "sample":
        return Sample(model, num_steps or model.cfg.num_steps)
    raise ValueError(f"unknown method '{name}'; choose from {', '.join(METHODS)}")
