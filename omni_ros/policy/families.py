"""Model families: what each supplies to the one inference path (its model and its processor).

A checkpoint layout names the family its folder holds (`Checkpoint.family`); `get(name)` gives the
pieces `omni_ros.policy.load` puts together, and `stage_plan(cfg)` the family's inference stages as program
methods (what exporters and method runtimes consume). A new family adds one folder and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from omni_ros.policy.normalize import NormStats
from omni_ros.policy.pipeline import Processor
from omni_ros.policy.tokenizer import Tokenizer

if TYPE_CHECKING:
    from omni_ros.policy.methods import MethodSignature, StagePlan


@dataclass(frozen=True)
class Family:
    name: str
    # The family's model config (a dataclass with from_dict / to_dict), e.g. what a .pte sidecar stores.
    config_type: type[Any]  # a typed config dataclass with from_dict (typed_config)
    # config -> a model with random weights (its inference stages: see omni_ros.policy.torch_runner)
    build_model: Callable[[Any], nn.Module]
    # (config, norm stats, tokenizer) -> the family's pre/post-processing
    build_processor: Callable[[Any, NormStats, Tokenizer | None], Processor]
    # () -> its StagePlan; imported on demand, as only exporters and method runtimes need it
    stages: Callable[[], StagePlan]
    # (model, config, **TorchRunner options) -> its eager runner; None: the flow-matching TorchRunner
    build_runner: Callable[..., Any] | None = None


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

    def stages() -> StagePlan:
        from omni_ros.policy.pi0.stages import PI0

        return PI0

    return Family("pi0", ModelConfig, Pi0Model, processor, stages)


def _smolvla() -> Family:
    """LeRobot's SmolVLA checkpoints."""
    from omni_ros.policy.smolvla.configuration import SmolVLAConfig
    from omni_ros.policy.smolvla.modeling import SmolVLAModel
    from omni_ros.policy.smolvla.processing import SmolVLAProcessor

    def processor(cfg: Any, stats: NormStats, tokenizer: Tokenizer | None) -> Processor:
        if tokenizer is None:
            raise ValueError("a SmolVLA checkpoint needs its tokenizer (tokenizer.json)")
        return SmolVLAProcessor(cfg, stats, tokenizer)

    def stages() -> StagePlan:
        from omni_ros.policy.smolvla.stages import SMOLVLA

        return SMOLVLA

    return Family("smolvla", SmolVLAConfig, SmolVLAModel, processor, stages)


def _pi0_fast() -> Family:
    """LeRobot's pi0-FAST checkpoints: the autoregressive member of the pi0 family."""
    from omni_ros.policy.pi0_fast.configuration import Pi0FastConfig
    from omni_ros.policy.pi0_fast.modeling import Pi0FastModel
    from omni_ros.policy.pi0_fast.processing import Pi0FastProcessor

    def processor(cfg: Any, stats: NormStats, tokenizer: Tokenizer | None) -> Processor:
        if tokenizer is None:
            raise ValueError("a pi0-FAST checkpoint needs its text tokenizer (tokenizer.json)")
        return Pi0FastProcessor(cfg, stats, tokenizer)

    def stages() -> StagePlan:
        from omni_ros.policy.pi0_fast.stages import PI0_FAST

        return PI0_FAST

    def runner(model: nn.Module, cfg: Any, **options: Any) -> Any:
        from pathlib import Path

        from omni_ros.policy.pi0_fast.fast import FastDetokenizer
        from omni_ros.policy.pi0_fast.runner import Pi0FastTorchRunner

        return Pi0FastTorchRunner(model, FastDetokenizer(cfg, Path(cfg.fast.path)), **options)

    return Family("pi0_fast", Pi0FastConfig, Pi0FastModel, processor, stages, runner)


def _xvla() -> Family:
    """LeRobot's X-VLA checkpoints (Florence-2 + a soft-prompted, per-domain action head)."""
    from omni_ros.policy.xvla.configuration import XVLAConfig
    from omni_ros.policy.xvla.modeling import XVLAModel
    from omni_ros.policy.xvla.processing import XVLAProcessor

    def processor(cfg: Any, stats: NormStats, tokenizer: Tokenizer | None) -> Processor:
        if tokenizer is None:
            raise ValueError("an X-VLA checkpoint needs its BART tokenizer (tokenizer.json)")
        return XVLAProcessor(cfg, stats, tokenizer)

    def stages() -> StagePlan:
        from omni_ros.policy.xvla.stages import XVLA

        return XVLA

    def runner(model: nn.Module, cfg: Any, **options: Any) -> Any:
        from omni_ros.policy.xvla.runner import XVLATorchRunner

        return XVLATorchRunner(model, **options)

    return Family("xvla", XVLAConfig, XVLAModel, processor, stages, runner)


_FAMILIES: dict[str, Callable[[], Family]] = {
    "pi0": _pi0,
    "pi0_fast": _pi0_fast,
    "smolvla": _smolvla,
    "xvla": _xvla,
}


def get(name: str) -> Family:
    if name not in _FAMILIES:
        raise ValueError(f"unknown model family '{name}'; known: {', '.join(sorted(_FAMILIES))}")
    return _FAMILIES[name]()


def stage_plan(cfg_or_family: Any) -> StagePlan:
    """The StagePlan of a family (its name, or a model config whose `family` names it; pi0 when it has none)."""
    family = cfg_or_family if isinstance(cfg_or_family, str) else getattr(cfg_or_family, "family", "pi0")
    return get(family).stages()


def signatures(cfg: Any, batch: int = 1) -> dict[str, MethodSignature]:
    """Input/output specs of every method for `cfg` (what the sidecar records and the runtime checks)."""
    return stage_plan(cfg).signatures(cfg, batch)


def method_module(model: nn.Module, name: str, num_steps: int | None = None) -> nn.Module:
    """The wrapper module exporting method `name` of `model` (any family)."""
    return stage_plan(model.cfg).module(model, name, num_steps)
