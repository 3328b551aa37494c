"""Model families: what each supplies to the one inference path (its model and its processor).

A checkpoint layout names the family its folder holds (`Checkpoint.family`); `get(name)` gives the
pieces `omni_ros.policy.load` puts together. A new family adds one folder and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from omni_ros.policy.normalize import NormStats
from omni_ros.policy.pipeline import Processor
from omni_ros.policy.tokenizer import Tokenizer


@dataclass(frozen=True)
class Family:
    name: str
    # The family's model config (a dataclass with from_dict / to_dict), e.g. what a .pte sidecar stores.
    config_type: type[Any]  # a typed config dataclass with from_dict (typed_config)
    # config -> a model with random weights (its inference stages: see omni_ros.policy.torch_runner)
    build_model: Callable[[Any], nn.Module]
    # (config, norm stats, tokenizer) -> the family's pre/post-processing
    build_processor: Callable[[Any, NormStats, Tokenizer | None], Processor]


def _pi0() -> Family:
    """pi0 and pi0.5 (`ModelConfig.variant`): omni_ros's own models and LeRobot / openpi checkpoints."""
    from omni_ros.policy.pi0.configuration import ModelConfig
    from omni_ros.policy.pi0.modeling import Pi0Model
    from omni_ros.policy.pi0.processing import Pi0Processor, ReferenceProcessor

    def processor(cfg: Any, stats: NormStats, tokenizer: Tokenizer | None) -> Processor:
        if cfg.processing.convention == "reference":
            if tokenizer is None:
                raise ValueError("a reference pi0 / pi0.5 checkpoint needs its tokenizer")
            return ReferenceProcessor(cfg, stats, tokenizer)
        return Pi0Processor(cfg, stats, tokenizer)

    return Family("pi0", ModelConfig, Pi0Model, processor)


def _smolvla() -> Family:
    """LeRobot's SmolVLA checkpoints."""
    from omni_ros.policy.smolvla.configuration import SmolVLAConfig
    from omni_ros.policy.smolvla.modeling import SmolVLAModel
    from omni_ros.policy.smolvla.processing import SmolVLAProcessor

    def processor(cfg: Any, stats: NormStats, tokenizer: Tokenizer | None) -> Processor:
        if tokenizer is None:
            raise ValueError("a SmolVLA checkpoint needs its tokenizer (tokenizer.json)")
        return SmolVLAProcessor(cfg, stats, tokenizer)

    return Family("smolvla", SmolVLAConfig, SmolVLAModel, processor)


_FAMILIES: dict[str, Callable[[], Family]] = {"pi0": _pi0, "smolvla": _smolvla}


def get(name: str) -> Family:
    if name not in _FAMILIES:
        raise ValueError(f"unknown model family '{name}'; known: {', '.join(sorted(_FAMILIES))}")
    return _FAMILIES[name]()
