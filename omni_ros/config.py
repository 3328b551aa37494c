"""Typed configuration: dataclasses loaded from YAML with precise errors.

Every section is a plain dataclass with defaults, so a config file only names
what it changes. Loading checks each key against the dataclass fields and each
value against the field's type, and an error names the file and the dotted key
(`config/sim.yaml: policy.num_steps: expected int, got str 'ten'`).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from omni_ros.control.config import ControlConfig
from omni_ros.errors import OmniRosError
from omni_ros.eval.config import EvalConfig
from omni_ros.serving.config import ServeConfig
from omni_ros.sim.config import SimConfig
from omni_ros.tts.config import TtsConfig

T = TypeVar("T")

CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"


class ConfigError(OmniRosError, ValueError):
    """A configuration file or value is invalid; the message names file and key."""


@dataclass
class PolicyConfig:
    """Which policy to run and how."""

    # Built-in architecture preset used when no checkpoint is given.
    preset: str = "tiny"
    # Checkpoint directory (config.json + model.safetensors); relative paths
    # are resolved against the config file's directory.
    checkpoint: str | None = None
    backend: Literal["torch", "executorch", "remote"] = "torch"
    # ExecuTorch program (`omni-ros export`) for backend executorch; its sidecar <pte>.json must sit beside it.
    # Relative paths are resolved against the config file's directory.
    pte: str | None = None
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16"] = "float32"
    # Euler steps of the flow-matching sampler; null keeps the model's own (10 for small/pi0).
    num_steps: int | None = None
    # Seed of the sampling noise; null draws fresh noise every call.
    seed: int | None = 0
    # torch intra-op threads; 0 keeps torch's default (one per core). Set before torch starts its pool.
    num_threads: int = 0
    # How torch's idle OpenMP workers wait: passive (sleep; steady on a shared CPU), active (spin), runtime
    # (the OpenMP default); null keeps $OMP_WAIT_POLICY, else passive. See omni_ros/cpu_threads.py.
    omp_wait_policy: Literal["passive", "active", "runtime"] | None = None


@dataclass
class StatusConfig:
    """Where and how often the node reports its health."""

    topic: str = "/omni_ros/status"
    rate_hz: float = 1.0


@dataclass
class RobotConfig:
    """The robot the policy drives."""

    joint_names: list[str] = field(default_factory=lambda: [f"joint_{i}" for i in range(1, 7)])
    control_rate_hz: float = 50.0
    # Safe bring-up: compute and publish chunks, never commands.
    dry_run: bool = True


@dataclass
class CameraTopic:
    """One camera input of the policy node."""

    name: str
    topic: str
    # sensor_msgs/CompressedImage (jpeg/png) instead of sensor_msgs/Image.
    compressed: bool = False


@dataclass
class TopicsConfig:
    """Topics of the policy node (inputs, outputs, safety)."""

    cameras: list[CameraTopic] = field(
        default_factory=lambda: [
            CameraTopic("base", "/camera/base/image_raw"),
            CameraTopic("wrist", "/camera/wrist/image_raw"),
        ]
    )
    joint_states: str = "/joint_states"
    # std_msgs/String, transient-local (latched): the task prompt.
    prompt: str = "/omni_ros/prompt"
    # Used until a prompt arrives; empty -> wait for one.
    default_prompt: str = ""
    # std_msgs/Bool: true engages the e-stop (latched until false and a resume).
    estop: str = "/omni_ros/estop"
    action_chunk: str = "/omni_ros/action_chunk"
    # Optional std_msgs/Float64MultiArray copy of each command for forward controllers; empty -> off.
    forward_command: str = ""
    diagnostics: str = "/diagnostics"


@dataclass
class OmniConfig:
    """The whole omni_ros configuration (one YAML file in config/)."""

    name: str = "default"
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    robot: RobotConfig = field(default_factory=RobotConfig)
    status: StatusConfig = field(default_factory=StatusConfig)
    topics: TopicsConfig = field(default_factory=TopicsConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    tts: TtsConfig = field(default_factory=TtsConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


def load_config(path: str | os.PathLike | None = None, cls: type[T] = OmniConfig) -> T:
    """Load `path` (default: config/default.yaml) into `cls`, validating every key."""
    path = Path(path) if path is not None else CONFIG_DIR / "default.yaml"
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    config = from_dict(cls, data, source=str(path))
    policy = getattr(config, "policy", None)
    if isinstance(policy, PolicyConfig) and policy.checkpoint and not Path(policy.checkpoint).is_absolute():
        # Relative checkpoint paths mean "next to this config file", wherever the command runs from.
        policy.checkpoint = str((path.parent / policy.checkpoint).resolve())
    if isinstance(policy, PolicyConfig) and policy.pte and not Path(policy.pte).is_absolute():
        policy.pte = str((path.parent / policy.pte).resolve())
    serve = getattr(config, "serve", None)
    if isinstance(serve, ServeConfig):
        for key in ("tls_cert", "tls_key"):
            value = getattr(serve, key)
            if value and not Path(value).is_absolute():
                setattr(serve, key, str((path.parent / value).resolve()))
    return config


def from_dict(cls: type[T], data: Any, source: str = "<dict>", prefix: str = "") -> T:
    """Build dataclass `cls` from plain data, raising ConfigError on any mismatch."""
    where = prefix.rstrip(".") or "<top level>"
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {where}: expected a mapping, got {_describe(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            known = ", ".join(fields)
            raise ConfigError(f"{source}: unknown key '{dotted}'{hint}; known keys here: {known}")
        kwargs[key] = _convert(hints[key], value, source, dotted)
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """The plain-data form of a config dataclass (what YAML/JSON would hold)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def _convert(tp: Any, value: Any, source: str, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, source, prefix=f"{key}.")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(arg, value, source, key)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        raise ConfigError(f"{source}: {key}: expected {_type_name(tp)}, got {_describe(value)}")
    if origin is Literal:
        if value not in args:
            choices = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{source}: {key}: expected one of {choices}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"{source}: {key}: expected a list, got {_describe(value)}")
        item = args[0] if args else Any
        return [_convert(item, v, source, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {key}: expected a mapping, got {_describe(value)}")
        key_tp, val_tp = args if args else (Any, Any)
        return {_convert(key_tp, k, source, key): _convert(val_tp, v, source, f"{key}.{k}") for k, v in value.items()}
    if tp is float:
        # YAML writes 50 for 50.0; accept ints where floats are expected, not bools.
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp in (str, bool):
        if type(value) is tp:
            return value
    else:
        raise ConfigError(f"{source}: {key}: unsupported field type {tp!r}")
    raise ConfigError(f"{source}: {key}: expected {_type_name(tp)}, got {_describe(value)}")


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
