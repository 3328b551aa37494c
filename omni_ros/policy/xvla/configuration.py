"""Architecture config of the X-VLA family (LeRobot 0.6.1's `xvla`: Florence-2's DaViT + BART encoder, and a
soft-prompted, domain-aware transformer head trained by flow matching to predict the clean action chunk).

`XVLAConfig` fully describes a model; the LeRobot layout builds it from config.json (its inline Florence-2 config,
either form LeRobot reads) and the weight shapes. Defaults are LeRobot's X-VLA over Florence-2-large.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from omni_ros.observation import ObservationSpec
from omni_ros.policy.family_base import ChunkConfig
from omni_ros.policy.tokenizer import TokenizerConfig


@dataclass
class DaViTConfig:
    """Florence-2's vision tower (DaViT: per stage a conv embedding, then spatial-window + channel blocks) and its
    multimodal projector (learned 2-D positions, a cosine temporal row, mean token + grid tokens, projection)."""

    depths: list[int] = field(default_factory=lambda: [1, 1, 9, 1])
    embed_dim: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048])
    num_heads: list[int] = field(default_factory=lambda: [8, 16, 32, 64])
    num_groups: list[int] = field(default_factory=lambda: [8, 16, 32, 64])
    patch_size: list[int] = field(default_factory=lambda: [7, 3, 3, 3])
    patch_stride: list[int] = field(default_factory=lambda: [4, 2, 2, 2])
    patch_padding: list[int] = field(default_factory=lambda: [3, 1, 1, 1])
    patch_prenorm: list[bool] = field(default_factory=lambda: [False, True, True, True])
    window_size: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    activation: str = "gelu"
    projection_dim: int = 1024
    max_position_embeddings: int = 50
    max_temporal_embeddings: int = 100

    def __post_init__(self) -> None:
        n = len(self.embed_dim)
        lists = (self.depths, self.num_heads, self.num_groups, self.patch_size, self.patch_stride, self.patch_padding)
        if any(len(x) != n for x in (*lists, self.patch_prenorm)):
            raise ValueError("Florence-2 vision config: every per-stage list needs one entry per stage")
        for dim, heads, groups in zip(self.embed_dim, self.num_heads, self.num_groups, strict=True):
            if dim % heads or dim % groups:
                raise ValueError(f"Florence-2 vision stage width {dim} is not divisible by its heads / groups")


@dataclass
class BartConfig:
    """The BART encoder of Florence-2 (post-LN, learned positions offset by 2, layernorm_embedding)."""

    vocab_size: int = 51289
    width: int = 1024
    depth: int = 12
    num_heads: int = 16
    mlp_dim: int = 4096
    max_positions: int = 1024
    activation: str = "gelu"
    scale_embedding: bool = False

    def __post_init__(self) -> None:
        if self.width % self.num_heads:
            raise ValueError(f"BART width {self.width} is not divisible by its {self.num_heads} heads")


@dataclass
class HeadConfig:
    """The soft-prompted transformer (pre-LN blocks, GELU tanh, no mask) and its per-domain layers."""

    width: int = 1024
    depth: int = 24
    num_heads: int = 16
    mlp_ratio: float = 4.0
    num_domains: int = 30
    len_soft_prompts: int = 32
    dim_time: int = 32
    max_len_seq: int = 512
    use_hetero_proj: bool = False

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError(f"the X-VLA head needs at least one block (depth {self.depth})")


@dataclass
class XVLAConfig(ChunkConfig):
    family: ClassVar[str] = "xvla"

    name: str = "xvla"
    camera_names: list[str] = field(default_factory=lambda: ["image", "wrist"])
    state_dim: int = 20
    action_dim: int = 20
    action_horizon: int = 32
    # LeRobot's action-space registry name (omni_ros.policy.xvla.action_space).
    action_mode: str = "ee6d"
    # The model's action width (the action space's dim_action) and proprio width (max_state_dim).
    model_dim_action: int = 20
    max_state_dim: int = 32
    use_proprio: bool = True
    # resize_imgs_with_padding (height, width); None: images go in at their own size.
    resize: list[int] | None = None
    # Camera slots the model sees (LeRobot's num_image_views): declared cameras plus empty ones.
    num_views: int = 2
    domain_id: int = 0
    vision: DaViTConfig = field(default_factory=DaViTConfig)
    text: BartConfig = field(default_factory=BartConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    tokenizer: TokenizerConfig = field(default_factory=lambda: TokenizerConfig(kind="hf", max_tokens=64))

    def __post_init__(self) -> None:
        if not self.camera_names:
            raise ValueError("at least one camera is needed")
        if not 0 <= self.domain_id < self.head.num_domains:
            raise ValueError(f"domain_id {self.domain_id} is not one of the model's {self.head.num_domains} domains")
        if self.vision.projection_dim != self.text.width:
            raise ValueError(
                f"Florence-2 projection_dim {self.vision.projection_dim} must equal the BART width {self.text.width}"
            )

    @property
    def model_action_dim(self) -> int:
        return self.model_dim_action

    @property
    def num_domains(self) -> int:
        """The embodiments one checkpoint serves (calibration spreads its observations across them)."""
        return self.head.num_domains

    @property
    def tokens_per_camera(self) -> int | None:
        """[mean token, grid tokens] of one view at the resize size (None: images keep their own size)."""
        if not self.resize:
            return None
        h, w = self.resize
        v = self.vision
        for k, s, p in zip(v.patch_size, v.patch_stride, v.patch_padding, strict=True):
            h, w = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        return 1 + h * w

    def observation_spec(self) -> ObservationSpec:
        """Any camera may be missing (the present ones move forward, as LeRobot stacks them), one must be there."""
        size = self.resize[0] if self.resize else 224
        return ObservationSpec(camera_names=tuple(self.camera_names), state_dim=self.state_dim, image_size=size)
