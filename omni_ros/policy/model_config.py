"""Architecture configs of the pi0-style policy, and the built-in presets.

A `ModelConfig` fully describes a model: it is what `config.json` of a
checkpoint stores, so a checkpoint rebuilds itself without any other file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from omni_ros.observation import ObservationSpec
from omni_ros.policy.base import PolicyMetadata
from omni_ros.typed_config import from_dict, to_dict


@dataclass
class VisionConfig:
    """SigLIP-style ViT over one square tile per camera."""

    image_size: int = 224
    patch_size: int = 16
    width: int = 384
    depth: int = 6
    num_heads: int = 6
    mlp_dim: int = 1536
    # Spatial-softmax keypoints appended to each camera's tokens (0: none). Each is the softmax-weighted mean
    # position of one learned feature over the patch grid, embedded as a token: an explicit "where" that a
    # small model trained from scratch reads far more easily than positions buried in patch features.
    keypoints: int = 0
    # Emit only the keypoint tokens, not the patch grid: an attention readout over dozens of near-identical
    # table patches stalls in training, over a handful of keypoints it does not.
    keypoints_only: bool = False
    # FiLM the final patch features with the prompt (scale and shift from the mean prompt-token embedding),
    # as language-conditioned visuomotor policies do: the features, and so the keypoints, can then follow
    # "the red block" directly. Without it, picking the named block out of the patches by attention alone
    # stalls for a small model trained from scratch.
    film: bool = False

    @property
    def grid_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_tokens(self) -> int:
        """Tokens per camera: the patch grid (unless keypoints_only), then the keypoints."""
        return self.keypoints + (0 if self.keypoints_only else self.grid_tokens)


@dataclass
class TransformerConfig:
    """A Gemma-style decoder stack (backbone or action expert)."""

    width: int = 512
    depth: int = 6
    num_heads: int = 8
    num_kv_heads: int = 1
    head_dim: int = 64
    mlp_dim: int = 2048


@dataclass
class TokenizerConfig:
    """`bytes` needs no file; `words` maps whole words of `vocab` to one token each (unknown words share
    one id); `sentencepiece` loads a local .model file."""

    kind: str = "bytes"
    path: str | None = None
    max_tokens: int = 48
    vocab: list[str] = field(default_factory=list)


@dataclass
class ModelConfig:
    name: str = "small"
    camera_names: list[str] = field(default_factory=lambda: ["base", "wrist"])
    state_dim: int = 8
    action_dim: int = 8
    action_horizon: int = 50
    # Seconds between consecutive actions of a chunk (50 Hz by default).
    action_dt: float = 0.02
    num_steps: int = 10
    # Predict each chunk relative to the current joint positions (openpi's delta actions): the model outputs
    # chunk - state and the policy adds the observation's state back, so "hold the current pose" is no longer a
    # shortcut that the absolute targets reward.
    relative_actions: bool = False
    # Train the expert's state token to also predict the joint positions the chunk heads for (an auxiliary
    # loss, weighted by the train config's goal_weight). Unused at inference: it only gives the vision and
    # prompt pathway a direct, low-noise gradient towards "where is the named block", which the noisy
    # flow-matching target alone teaches slowly.
    goal_head: bool = False
    vision: VisionConfig = field(default_factory=VisionConfig)
    backbone: TransformerConfig = field(default_factory=TransformerConfig)
    expert: TransformerConfig = field(
        default_factory=lambda: TransformerConfig(
            width=256, depth=4, num_heads=4, num_kv_heads=1, head_dim=64, mlp_dim=1024
        )
    )
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    vocab_size: int = 260
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        b, e = self.backbone, self.expert
        if (b.head_dim, b.num_kv_heads) != (e.head_dim, e.num_kv_heads):
            # The expert's queries attend to the backbone's cached keys/values.
            raise ValueError("backbone and expert must share head_dim and num_kv_heads")
        for part in (b, e):
            if part.num_heads % part.num_kv_heads:
                raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.vision.keypoints_only and self.vision.keypoints <= 0:
            raise ValueError("vision.keypoints_only needs vision.keypoints > 0")
        if self.vision.image_size % self.vision.patch_size:
            raise ValueError("vision.image_size must be a multiple of vision.patch_size")
        if not self.camera_names:
            raise ValueError("at least one camera is needed")
        if self.tokenizer.kind == "words" and self.vocab_size < len(self.tokenizer.vocab) + 4:
            words = len(self.tokenizer.vocab)
            raise ValueError(f"vocab_size {self.vocab_size} is too small for {words} words + 4 special tokens")

    def observation_spec(self) -> ObservationSpec:
        """What a policy of this architecture consumes (the first camera is required, others may be masked)."""
        return ObservationSpec(
            camera_names=tuple(self.camera_names),
            state_dim=self.state_dim,
            image_size=self.vision.image_size,
            required_cameras=(self.camera_names[0],),
        )

    def policy_metadata(self, model: str, backend: str) -> PolicyMetadata:
        return PolicyMetadata(
            model=model,
            backend=backend,
            camera_names=tuple(self.camera_names),
            image_size=self.vision.image_size,
            state_dim=self.state_dim,
            action_dim=self.action_dim,
            action_horizon=self.action_horizon,
            action_dt=self.action_dt,
        )

    @property
    def prefix_len(self) -> int:
        return len(self.camera_names) * self.vision.num_tokens + self.tokenizer.max_tokens

    def to_dict(self) -> dict:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict, source: str = "<config>") -> ModelConfig:
        return from_dict(cls, data, source=source)


# Every word of the simulator's prompts (omni_ros.sim.task); anything else maps to the unknown token.
DEMO_VOCABULARY = (
    *("reach", "touch", "move", "go", "put", "point", "at", "to", "on", "the", "gripper", "block", "cube"),
    *("red", "green", "blue", "yellow", "purple", "orange", "cyan"),
)


def _tiny() -> ModelConfig:
    return ModelConfig(
        name="tiny",
        action_horizon=8,
        num_steps=4,
        vision=VisionConfig(image_size=32, patch_size=8, width=32, depth=1, num_heads=2, mlp_dim=64),
        backbone=TransformerConfig(width=32, depth=2, num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64),
        expert=TransformerConfig(width=16, depth=2, num_heads=1, num_kv_heads=1, head_dim=16, mlp_dim=32),
        tokenizer=TokenizerConfig(max_tokens=16),
    )


def _demo() -> ModelConfig:
    # The built-in demo (checkpoints/demo): the simulated 3-joint arm, sized to train on a 2-core CPU in
    # about 20 minutes. 48 px tiles in 8 px patches keep a 5 cm block about two pixels wide in the top-down
    # view and give 36 tokens per camera; one token per prompt word (the color is one token).
    return ModelConfig(
        name="demo",
        camera_names=["base", "wrist"],
        state_dim=3,
        action_dim=3,
        action_horizon=16,
        action_dt=0.05,
        num_steps=5,
        relative_actions=True,
        goal_head=True,
        vision=VisionConfig(
            image_size=48,
            patch_size=8,
            width=64,
            depth=2,
            num_heads=2,
            mlp_dim=128,
            keypoints=16,
            keypoints_only=True,
            film=True,
        ),
        backbone=TransformerConfig(width=128, depth=2, num_heads=4, num_kv_heads=1, head_dim=32, mlp_dim=256),
        expert=TransformerConfig(width=64, depth=2, num_heads=2, num_kv_heads=1, head_dim=32, mlp_dim=128),
        tokenizer=TokenizerConfig(kind="words", max_tokens=12, vocab=list(DEMO_VOCABULARY)),
        vocab_size=32,
    )


def _small() -> ModelConfig:
    return ModelConfig(name="small")


def _pi0() -> ModelConfig:
    # pi0 dimensions: PaliGemma (So400m/14 at 224 -> 256 tokens, Gemma 2B) + a 300M-class expert.
    return ModelConfig(
        name="pi0",
        camera_names=["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"],
        state_dim=32,
        action_dim=32,
        vision=VisionConfig(image_size=224, patch_size=14, width=1152, depth=27, num_heads=16, mlp_dim=4304),
        backbone=TransformerConfig(width=2048, depth=18, num_heads=8, num_kv_heads=1, head_dim=256, mlp_dim=16384),
        expert=TransformerConfig(width=1024, depth=18, num_heads=8, num_kv_heads=1, head_dim=256, mlp_dim=4096),
        tokenizer=TokenizerConfig(kind="bytes", max_tokens=48),
        vocab_size=257_152,
    )


PRESETS = {"tiny": _tiny, "demo": _demo, "small": _small, "pi0": _pi0}


def preset(name: str, **overrides) -> ModelConfig:
    """A built-in architecture, with top-level fields (cameras, dims, horizon, ...) overridden."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset '{name}'; choose one of {sorted(PRESETS)}")
    config = PRESETS[name]()
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if "camera_names" in overrides:
        overrides["camera_names"] = list(overrides["camera_names"])
    return dataclasses.replace(config, **overrides)
