"""Architecture config of the SmolVLA family (LeRobot's SmolVLA over a SmolVLM backbone).

`SmolVLAConfig` fully describes a model: the LeRobot layout builds it from the checkpoint's config.json, the
SmolVLM config of `vlm_model_name` and the weight shapes; an exported program stores it in its sidecar.
Defaults are LeRobot 0.6.1's SmolVLA over SmolVLM2-500M (16 of its 32 text layers, an expert 0.75x wide).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from omni_ros.observation import ObservationSpec
from omni_ros.policy.family_base import ChunkConfig
from omni_ros.policy.tokenizer import TokenizerConfig


@dataclass
class VisionConfig:
    """SmolVLM's SigLIP encoder and its pixel-shuffle connector."""

    # The size the encoder was trained at: its position embedding is a (image_size / patch_size)^2 grid.
    image_size: int = 512
    patch_size: int = 16
    width: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    norm_eps: float = 1e-6
    # Pixel shuffle: every scale_factor x scale_factor patch block becomes one token of width * scale_factor^2.
    scale_factor: int = 4

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(f"vision.image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.width % self.num_heads:
            raise ValueError(f"vision.width {self.width} is not divisible by num_heads {self.num_heads}")


@dataclass
class TextConfig:
    """The VLM's Llama-style decoder (RMSNorm w * x, SiLU MLP): only its first `depth` layers are kept."""

    width: int = 960
    depth: int = 16
    num_heads: int = 15
    num_kv_heads: int = 5
    head_dim: int = 64
    mlp_dim: int = 2560
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError("text.num_heads must be a multiple of text.num_kv_heads")


@dataclass
class ExpertConfig:
    """The action expert: the text decoder's heads and head_dim at its own width and depth.

    Layer j reads VLM layer j * (text depth / expert depth). Where `self_attn_every_n_layers` says so (layer
    index % n == 0) it self-attends over [prefix cache, actions]; elsewhere it cross-attends to the prefix
    only, through its own k/v projections of the VLM's cached keys/values.
    """

    width: int = 720
    depth: int = 16
    mlp_dim: int = 2048
    # "cross_attn" (alternating, LeRobot's default) or "self_attn" (every layer over [prefix, actions]).
    attention_mode: Literal["cross_attn", "self_attn"] = "cross_attn"
    self_attn_every_n_layers: int = 2


@dataclass
class SmolVLAConfig(ChunkConfig):
    # The model family (omni_ros.policy.families) that runs this config.
    family: ClassVar[str] = "smolvla"

    name: str = "smolvla"
    camera_names: list[str] = field(default_factory=lambda: ["top", "wrist"])
    state_dim: int = 6
    action_dim: int = 6
    # The model's state and action widths (LeRobot zero-pads both to 32).
    max_state_dim: int = 32
    max_action_dim: int = 32
    # Side of the square tile every camera becomes (LeRobot's resize_imgs_with_padding).
    tile_size: int = 512
    vision: VisionConfig = field(default_factory=VisionConfig)
    text: TextConfig = field(default_factory=TextConfig)
    expert: ExpertConfig = field(default_factory=ExpertConfig)
    tokenizer: TokenizerConfig = field(default_factory=lambda: TokenizerConfig(kind="hf", max_tokens=48))
    vocab_size: int = 49280
    # LeRobot's SmolVLA rotates with base 10000 whatever the SmolVLM config says (measured: 100000 is off by 1.2).
    rope_theta: float = 10_000.0
    time_min_period: float = 4e-3
    time_max_period: float = 4.0
    # The LeRobot release whose preprocessing the checkpoint was trained with: "current" (>= 0.4: the prompt
    # cut from the left at max_tokens) or "0.3" (LeRobot <= 0.3: the prompt never truncated).
    lerobot_era: Literal["current", "0.3"] = "current"

    def __post_init__(self) -> None:
        if not self.camera_names:
            raise ValueError("at least one camera is needed")
        if self.max_state_dim < self.state_dim or self.max_action_dim < self.action_dim:
            raise ValueError(
                f"max_state_dim / max_action_dim ({self.max_state_dim} / {self.max_action_dim}) must be at least "
                f"state_dim / action_dim ({self.state_dim} / {self.action_dim})"
            )
        v = self.vision
        if self.tile_size % v.patch_size or (self.tile_size // v.patch_size) % v.scale_factor:
            raise ValueError(
                f"tile_size {self.tile_size} must be a multiple of patch_size x scale_factor "
                f"({v.patch_size} x {v.scale_factor})"
            )
        if self.expert.width % 2:
            raise ValueError("expert.width must be even (sine-cosine time embedding)")
        if self.text.depth % self.expert.depth:
            raise ValueError(f"text.depth {self.text.depth} is not a multiple of expert.depth {self.expert.depth}")
        stride = self.text.depth // self.expert.depth
        n = self.expert.self_attn_every_n_layers
        # A self-attention layer needs its expert layer (LeRobot fails on the combination otherwise).
        if stride > 1 and (self.expert.attention_mode == "self_attn" or n <= 0 or n % stride):
            raise ValueError(
                f"an expert of {self.expert.depth} layers over {self.text.depth} VLM layers needs cross_attn with "
                f"self_attn_every_n_layers a multiple of {stride}"
            )

    @property
    def model_state_dim(self) -> int:
        return self.max_state_dim

    @property
    def model_action_dim(self) -> int:
        return self.max_action_dim

    @property
    def tokens_per_camera(self) -> int:
        side = self.tile_size // self.vision.patch_size // self.vision.scale_factor
        return side * side

    @property
    def prefix_len(self) -> int:
        """[image tokens of every camera slot, prompt tokens, state token] at full prompt length."""
        return len(self.camera_names) * self.tokens_per_camera + self.tokenizer.max_tokens + 1

    def layer_plan(self) -> list[tuple[int, str]]:
        """(VLM layer index, "self" | "cross") of every expert layer, in order."""
        stride = self.text.depth // self.expert.depth
        n = self.expert.self_attn_every_n_layers
        plan = []
        for i in range(0, self.text.depth, stride):
            cross = self.expert.attention_mode == "cross_attn" and not (n > 0 and i % n == 0)
            plan.append((i, "cross" if cross else "self"))
        return plan

    def observation_spec(self) -> ObservationSpec:
        """Any camera may be missing (it is left out of the prefix), at least one must be there."""
        return ObservationSpec(
            camera_names=tuple(self.camera_names), state_dim=self.state_dim, image_size=self.tile_size
        )
