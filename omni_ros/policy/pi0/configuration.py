"""Architecture configs of the pi0 family (pi0 and pi0.5).

A `ModelConfig` fully describes a model: it is what `config.json` of an
omni_ros checkpoint stores, so a checkpoint rebuilds itself without any other
file; the LeRobot and openpi layouts build one from their own files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from omni_ros.observation import ObservationSpec
from omni_ros.policy.family_base import ChunkConfig
from omni_ros.policy.tokenizer import TokenizerConfig


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
class ProcessingConfig:
    """How a raw observation becomes model inputs: omni_ros's own convention, or a reference implementation's."""

    # "omni_ros": resize-with-pad of the uint8 image with OpenCV (area averaging when shrinking), centred,
    #   pixels x / 127.5 - 1 (Pi0Processor). "reference": the image as float in [0, 1], bilinear resize
    #   (align_corners=False, no antialias) to fit with sizes truncated, centred zero padding, x * 2 - 1, the
    #   state zero-padded to the model's width (ReferenceProcessor: openpi's and LeRobot's pi0 / pi0.5).
    convention: Literal["omni_ros", "reference"] = "omni_ros"
    # The prompt as tokenized: "as_is" (the built-in tokenizers end it themselves), "newline" (LeRobot pi0
    # appends "\n"), "openpi" (underscores and newlines as spaces, then "\n" tokenized on its own), "pi05"
    # ("Task: {task}, State: {normalized state in 256 bins};\nAction: ").
    prompt_format: Literal["as_is", "newline", "openpi", "pi05"] = "as_is"
    # With relative_actions, these action dims stay absolute (LeRobot's relative_exclude_joints, e.g. a gripper).
    absolute_dims: list[int] = field(default_factory=list)
    # At least this camera must be in every observation (omni_ros: the first); none for the reference, which
    # needs any one camera and treats the others as empty.
    require_first_camera: bool = True
    # The LeRobot release whose preprocessing the checkpoint was trained with (the reference convention):
    # "current" (>= 0.4: centred padding, prompt truncated at max_tokens) or "0.3" (LeRobot <= 0.3: zero padding
    # at the left and top, the prompt never truncated, a missing camera dropped, which the masked slot equals).
    lerobot_era: Literal["current", "0.3"] = "current"


@dataclass
class ModelConfig(ChunkConfig):
    # The model family (omni_ros.policy.families) that runs this config.
    family: ClassVar[str] = "pi0"

    # Predict each chunk relative to the current joint positions (openpi's delta actions): the model outputs
    # chunk - state and the policy adds the observation's state back, so "hold the current pose" is no longer a
    # shortcut that the absolute targets reward.
    relative_actions: bool = False
    # Train the expert's state token to also predict the joint positions the chunk heads for (an auxiliary
    # loss, weighted by the train config's goal_weight). Unused at inference: it only gives the vision and
    # prompt pathway a direct, low-noise gradient towards "where is the named block", which the noisy
    # flow-matching target alone teaches slowly.
    goal_head: bool = False
    # Trained with training-time RTC (arXiv 2512.05964): a clean action prefix of up to this many actions,
    # per-token time 0, no loss on it. Its hard-inpainting RTC then feeds the prefix clean; 0: not trained so.
    rtc_max_delay: int = 0
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
    # "pi0": a state token and a time-mixing MLP in the expert; "pi05": adaRMS time conditioning, no state
    # token (the state is written into the prompt), bidirectional attention among the action tokens.
    variant: Literal["pi0", "pi05"] = "pi0"
    # GELU of the SigLIP and Gemma MLPs. The reference models use the tanh approximation; omni_ros's own
    # models use the exact one, which ExecuTorch's XNNPACK computes for both.
    mlp_activation: Literal["gelu", "gelu_tanh"] = "gelu"
    # The model's state and action widths when wider than the robot's (openpi pads both to 32); 0: the robot's.
    max_state_dim: int = 0
    max_action_dim: int = 0
    # Periods (in flow-matching time) of the sinusoidal time embedding.
    time_min_period: float = 4e-3
    time_max_period: float = 4.0
    processing: ProcessingConfig = field(default_factory=ProcessingConfig)

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
        if not 0 <= self.rtc_max_delay < self.action_horizon:
            raise ValueError(f"rtc_max_delay must be in [0, action_horizon), got {self.rtc_max_delay}")
        if self.model_state_dim < self.state_dim or self.model_action_dim < self.action_dim:
            raise ValueError("max_state_dim / max_action_dim must be 0 or at least state_dim / action_dim")
        if self.variant == "pi05" and self.processing.prompt_format != "pi05":
            raise ValueError("variant pi05 reads the state from the prompt: processing.prompt_format must be pi05")
        if self.tokenizer.kind == "words" and self.vocab_size < len(self.tokenizer.vocab) + 4:
            words = len(self.tokenizer.vocab)
            raise ValueError(f"vocab_size {self.vocab_size} is too small for {words} words + 4 special tokens")

    @property
    def model_state_dim(self) -> int:
        """Width of the state the model takes (the robot's, zero-padded)."""
        return self.max_state_dim or self.state_dim

    @property
    def model_action_dim(self) -> int:
        """Width of the actions the model samples (the robot's are the first action_dim)."""
        return self.max_action_dim or self.action_dim

    def observation_spec(self) -> ObservationSpec:
        """What a policy of this architecture consumes (by default the first camera is required, others may be
        masked)."""
        return ObservationSpec(
            camera_names=tuple(self.camera_names),
            state_dim=self.state_dim,
            image_size=self.vision.image_size,
            required_cameras=(self.camera_names[0],) if self.processing.require_first_camera else (),
        )

    @property
    def prefix_len(self) -> int:
        return len(self.camera_names) * self.vision.num_tokens + self.tokenizer.max_tokens
