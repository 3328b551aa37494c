"""Typed configuration machinery: dataclasses <-> plain data and YAML, with precise errors.

Every config section is a plain dataclass with defaults, so a file only names what it changes. Loading
checks each key against the dataclass fields and each value against the field's type, then the dataclass
checks its own ranges in `__post_init__` (raising FieldError). Every error names the file and the dotted
key: `config/sim.yaml: policy.num_steps: expected int, got str 'ten'`,
`config/sim.yaml: serve.workers must be >= 1, got 0`.

A leaf module: it imports nothing of omni_ros but the error base, so any package may describe its own
config with it without importing the others.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from omni_ros.errors import OmniRosError

T = TypeVar("T")


class ConfigError(OmniRosError, ValueError):
    """A configuration file or value is invalid; the message names file and key."""


class FieldError(ConfigError):
    """A value fails its dataclass's own check (raised in `__post_init__`).

    `key` names the field as seen from that dataclass (`workers`, or `eval.trigger_camera` for a check
    across sections), and the message reads "<key> <problem>". `from_dict` puts the file and the section
    in front: `config/x.yaml: serve.workers must be >= 1, got 0`.
    """

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key} {problem}")
        self.key = key
        self.problem = problem


def load_yaml(path: str | os.PathLike, cls: type[T]) -> T:
    """Read the YAML file `path` into dataclass `cls`; an empty file gives the defaults."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return from_dict(cls, {} if data is None else data, source=str(path))


def from_dict(cls: type[T], data: Any, source: str = "<dict>", prefix: str = "") -> T:
    """Build dataclass `cls` from plain data, raising ConfigError on any mismatch."""
    where = prefix.rstrip(".") or "<top level>"
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {where}: expected a mapping, got {_describe(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            known = ", ".join(fields)
            raise ConfigError(f"{source}: unknown key '{dotted}'{hint}; known keys here: {known}")
        kwargs[key] = _convert(hints[key], value, source, dotted)
    missing = [name for name, f in fields.items() if name not in kwargs and _required(f)]
    if missing:
        raise ConfigError(f"{source}: {where}: missing key(s) {', '.join(prefix + m for m in missing)}")
    try:
        return cls(**kwargs)
    except FieldError as exc:
        raise ConfigError(f"{source}: {prefix}{exc}") from exc
    except ValueError as exc:
        if not prefix:
            raise  # the caller of a top-level from_dict knows the file (a checkpoint wraps it in its own error)
        # A nested dataclass's check that does not name its field: name the file and the section.
        raise ConfigError(f"{source}: {where}: {exc}") from exc


def to_dict(obj: Any) -> Any:
    """The plain-data form of a config dataclass (what YAML/JSON would hold)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _convert(tp: Any, value: Any, source: str, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, source, prefix=f"{key}.")  # type: ignore[arg-type]
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
