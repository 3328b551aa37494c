"""The pi0-FAST model config: what a LeRobot `pi0_fast` folder's config.json and weights decide.

The vision tower and the Gemma backbone are the pi0 family's (`VisionConfig`, `TransformerConfig`); what differs
is the head (the token embedding, tied, read as logits), the prompt and the decoding rules (DESIGN.md 8c).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from omni_ros.observation import ObservationSpec
from omni_ros.policy.base import PolicyMetadata
from omni_ros.policy.family_base import ChunkConfig
from omni_ros.policy.pi0.configuration import TransformerConfig, VisionConfig
from omni_ros.policy.tokenizer import TokenizerConfig


@dataclass
class FastTokenizerConfig:
    """The FAST action tokenizer (a folder with tokenizer.json + processor_config.json, LeRobot's and PI's form).

    `path`: the folder, absolute or relative to the checkpoint. A FAST id f is PaliGemma id
    `text_vocab_size - 1 - skip_tokens - f` (the top of PaliGemma's vocabulary, below its last 128 pieces)."""

    path: str = ""
    scale: float = 10.0
    vocab_size: int = 1024
    min_token: int = 0
    skip_tokens: int = 128


@dataclass
class Pi0FastConfig(ChunkConfig):
    family: ClassVar[str] = "pi0_fast"

    vision: VisionConfig = field(default_factory=VisionConfig)
    backbone: TransformerConfig = field(default_factory=TransformerConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    vocab_size: int = 257152  # rows of the token embedding (= lm_head, tied)
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6
    # The text tokenizer's base vocabulary (without added tokens): the FAST id mapping counts from its top.
    text_vocab_size: int = 257152
    bos_id: int = 2
    end_id: int = 0  # the end-of-action marker "|"
    action_prefix_ids: list[int] = field(default_factory=list)  # "Action: ", which the model emits first
    # Refuse a sequence that does not start with "Action" ":" (LeRobot's validate_action_token_prefix).
    validate_action_prefix: bool = True
    max_decoding_steps: int = 256
    fast: FastTokenizerConfig = field(default_factory=FastTokenizerConfig)

    def __post_init__(self) -> None:
        if self.vision.image_size % self.vision.patch_size:
            raise ValueError("vision.image_size must be a multiple of vision.patch_size")
        if not self.camera_names:
            raise ValueError("at least one camera is needed")
        if self.backbone.num_heads % self.backbone.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.max_decoding_steps < 1:
            raise ValueError(f"max_decoding_steps must be >= 1, got {self.max_decoding_steps}")

    def fast_id_range(self) -> tuple[int, int]:
        """(lowest, highest) PaliGemma id a FAST token maps to."""
        top = self.text_vocab_size - 1 - self.fast.skip_tokens
        return top - (self.fast.vocab_size - 1), top

    def observation_spec(self) -> ObservationSpec:
        """Any one declared camera will do; the others become masked blanks (as in LeRobot)."""
        return ObservationSpec(
            camera_names=tuple(self.camera_names),
            state_dim=self.state_dim,
            image_size=self.vision.image_size,
            required_cameras=(),
        )

    def policy_metadata(self, model: str, backend: str) -> PolicyMetadata:
        # No noise to announce: a greedy token decoder takes none (a client sending some is refused).
        return replace(super().policy_metadata(model, backend), noise_shape=None)

    @property
    def prefix_len(self) -> int:
        """Prefix length of the static (exported) form: image tokens, prompt slots, the final BOS."""
        return len(self.camera_names) * self.vision.num_tokens + self.tokenizer.max_tokens + 1
