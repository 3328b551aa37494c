"""Key maps: openpi observation layouts (DROID, LIBERO, ALOHA, ...) to and from our raw observation.

An openpi client sends a flat or nested dict such as

    {"observation/exterior_image_1_left": (224, 224, 3) uint8,
     "observation/joint_position": (7,), "observation/gripper_position": (1,),
     "prompt": "pick up the cup"}

and `Policy.infer` takes `{"images": {camera: image}, "state": (D,), "prompt": str}`.
A key map, one YAML file in config/keymaps/, names which openpi key feeds which
camera, which keys are concatenated (in order) into the state, and which key
holds the prompt. A dot in a key is one level of nesting (`images.cam_high`).

`KeyMap.to_raw` is the server direction and checks everything it touches, so a
malformed request gets an error naming the openpi key; `KeyMap.to_openpi` is the
inverse, used by the remote backend to drive any OpenPI server.

openpi compatibility: openpi's policy transforms pick the keys they need and
ignore the rest, and turn float images in [0, 1] into uint8 and CHW into HWC
(`_parse_image` in openpi's droid/libero policies; LeRobot stores images as
float32 CHW). Scripts written against openpi rely on both, so `to_raw(strict=False)`
skips unknown keys (reporting them) and float images are converted the same way:
`(255 * image).astype(uint8)`, truncating. A float image whose values that cast
cannot represent (NaN, inf, below 0 or above 1 by more than a 255th) is refused
instead of wrapped around.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from omni_ros.config import CONFIG_DIR
from omni_ros.observation import ObservationError, ObservationSpec
from omni_ros.typed_config import ConfigError, from_dict, load_yaml

KEYMAP_DIR = CONFIG_DIR / "keymaps"
# `keymap: canonical` takes our own layout unchanged (built from the policy's spec).
CANONICAL = "canonical"
_CHANNELS = (1, 3, 4)


class KeyMapError(ObservationError):
    """An observation does not follow the key map; the message names the openpi key."""


@dataclass
class StatePart:
    """One openpi key holding `dim` numbers of the state vector."""

    key: str = ""
    dim: int = 0


@dataclass
class KeyMapConfig:
    """The YAML form of a key map."""

    name: str = ""
    description: str = ""
    # Our camera name -> openpi key (camera order is the policy's camera order).
    images: dict[str, str] = field(default_factory=dict)
    # Cameras that must be present; null means all of them.
    required_cameras: list[str] | None = None
    # Layout the remote backend sends; the server accepts HWC and CHW and uses
    # this only when a shape could be either.
    image_layout: Literal["hwc", "chw"] = "hwc"
    state: list[StatePart] = field(default_factory=list)
    prompt: str = "prompt"
    # Action size of this embodiment (0: the policy's own).
    action_dim: int = 0
    # Extra openpi keys accepted and dropped.
    ignore: list[str] = field(default_factory=list)


class KeyMap:
    """A validated key map with both directions of the mapping."""

    def __init__(self, config: KeyMapConfig, source: str = "<keymap>") -> None:
        if not config.images:
            raise ConfigError(f"{source}: images: a key map needs at least one camera")
        if not config.state:
            raise ConfigError(f"{source}: state: a key map needs at least one state key")
        for i, part in enumerate(config.state):
            if not part.key:
                raise ConfigError(f"{source}: state[{i}].key: missing")
            if part.dim < 1:
                raise ConfigError(f"{source}: state[{i}].dim: must be >= 1, got {part.dim}")
        required = config.required_cameras if config.required_cameras is not None else list(config.images)
        unknown = sorted(set(required) - set(config.images))
        if unknown:
            raise ConfigError(f"{source}: required_cameras: {unknown} are not cameras of images")
        if config.action_dim < 0:
            raise ConfigError(f"{source}: action_dim: must be >= 0, got {config.action_dim}")
        paths = [*config.images.values(), *(p.key for p in config.state), config.prompt, *config.ignore]
        dupes = sorted({p for p in paths if paths.count(p) > 1})
        if dupes:
            raise ConfigError(f"{source}: key(s) {dupes} used twice")
        self.config = config
        self.name = config.name or Path(source).stem
        self.required_cameras = tuple(required)
        # The tree of expected keys: nested dicts, leaves are True.
        self._tree: dict[str, Any] = {}
        for path in paths:
            node = self._tree
            parts = path.split(".")
            for name in parts[:-1]:
                child = node.setdefault(name, {})
                if child is True:
                    raise ConfigError(f"{source}: key '{path}' nests under a key that is itself a value")
                node = child
            if isinstance(node.get(parts[-1]), dict):
                raise ConfigError(f"{source}: key '{path}' is also the parent of other keys")
            node[parts[-1]] = True
        # Each path split once here, not per request: (camera, path, parts), (part, parts), prompt parts.
        self._images = [(c, p, tuple(p.split("."))) for c, p in config.images.items()]
        self._state = [(part, tuple(part.key.split("."))) for part in config.state]
        self._prompt = tuple(config.prompt.split("."))

    @classmethod
    def canonical(cls, spec: ObservationSpec) -> KeyMap:
        """Our own layout, `{"images": {camera: ...}, "state": ..., "prompt": ...}`, for `spec`."""
        config = KeyMapConfig(
            name=CANONICAL,
            description="omni_ros raw observation: images.<camera>, state, prompt",
            images={name: f"images.{name}" for name in spec.camera_names},
            required_cameras=list(spec.required_cameras),
            state=[StatePart("state", spec.state_dim)],
        )
        return cls(config, source=CANONICAL)

    @property
    def camera_names(self) -> tuple[str, ...]:
        return tuple(self.config.images)

    @property
    def state_dim(self) -> int:
        return sum(part.dim for part in self.config.state)

    @property
    def action_dim(self) -> int | None:
        return self.config.action_dim or None

    def describe(self) -> dict[str, Any]:
        """What the server tells clients about the layout it expects (part of the metadata frame)."""
        return {
            "name": self.name,
            "images": dict(self.config.images),
            "required_cameras": list(self.required_cameras),
            "state": [{"key": p.key, "dim": p.dim} for p in self.config.state],
            "prompt": self.config.prompt,
            "image_layout": self.config.image_layout,
        }

    @classmethod
    def from_description(cls, data: Mapping[str, Any]) -> KeyMap:
        """Rebuild a key map from `describe()` output (what our server puts in its metadata)."""
        return cls(from_dict(KeyMapConfig, dict(data), source="server metadata", prefix="keymap."), "server metadata")

    # -- openpi -> raw (server side) -----------------------------------------

    def to_raw(self, obs: Any, *, strict: bool = True, ignored: list[str] | None = None) -> dict[str, Any]:
        """Map an openpi observation to our raw observation dict, or raise KeyMapError.

        strict: a key the map does not name is an error. Otherwise it is skipped (as openpi's transforms do)
        and its dotted path appended to `ignored` when given.
        """
        if not isinstance(obs, Mapping):
            raise KeyMapError(f"observation must be a dict (msgpack map), got {type(obs).__name__}")
        # `domain_id` (the embodiment of a cross-embodiment policy, X-VLA) passes through under its own name.
        domain = obs.get("domain_id")
        rest = {k: v for k, v in obs.items() if k != "domain_id"} if domain is not None else obs
        self._check_keys(rest, self._tree, "", strict, ignored)
        images: dict[str, np.ndarray] = {}
        for camera, path, parts in self._images:
            found, value = _lookup(obs, parts)
            if not found:
                if camera in self.required_cameras:
                    raise KeyMapError(f"missing image '{path}' (camera '{camera}'); expected keys: {self._expected()}")
                continue
            images[camera] = self._image(value, path)
        state = []
        for part, parts in self._state:
            found, value = _lookup(obs, parts)
            if not found:
                raise KeyMapError(f"missing state key '{part.key}' ({part.dim} numbers)")
            state.append(_state_part(value, part))
        raw: dict[str, Any] = {"images": images, "state": np.concatenate(state)}
        found, prompt = _lookup(obs, self._prompt)
        if found and prompt is not None:
            if isinstance(prompt, bytes):
                prompt = prompt.decode("utf-8", errors="replace")
            if not isinstance(prompt, str):
                raise KeyMapError(f"'{self.config.prompt}' must be a string, got {type(prompt).__name__}")
            raw["prompt"] = prompt
        if domain is not None:
            raw["domain_id"] = domain
        return raw

    def _check_keys(
        self, obs: Mapping, tree: dict[str, Any], prefix: str, strict: bool, ignored: list[str] | None
    ) -> None:
        for key, value in obs.items():
            node = tree.get(key) if isinstance(key, str) else None
            if node is None:
                if strict:
                    if not isinstance(key, str):
                        where = prefix or "<top level>"
                        raise KeyMapError(f"observation keys must be strings, got {key!r} under '{where}'")
                    raise KeyMapError(
                        f"unknown observation key '{prefix}{key}' for key map '{self.name}'; expected keys: "
                        f"{self._expected()}"
                    )
                if ignored is not None:
                    ignored.append(f"{prefix}{key}" if isinstance(key, str) else f"{prefix}{key!r}")
                continue
            if isinstance(node, dict):
                if not isinstance(value, Mapping):
                    raise KeyMapError(f"'{prefix}{key}' must be a dict, got {type(value).__name__}")
                self._check_keys(value, node, f"{prefix}{key}.", strict, ignored)

    def _expected(self) -> str:
        keys = [*self.config.images.values(), *(p.key for p in self.config.state), self.config.prompt]
        return ", ".join(keys)

    def _image(self, value: Any, path: str) -> np.ndarray:
        if not isinstance(value, np.ndarray):
            raise KeyMapError(f"image '{path}' must be a numpy array, got {type(value).__name__}")
        if value.dtype.kind == "f":
            value = _float_image_to_uint8(value, path)
        elif value.dtype != np.uint8:
            raise KeyMapError(f"image '{path}' must be uint8 (or float in [0, 1]), got dtype {value.dtype}")
        if value.ndim != 3:
            raise KeyMapError(f"image '{path}' must be HWC or CHW (rank 3), got shape {value.shape}")
        hwc, chw = value.shape[2] in _CHANNELS, value.shape[0] in _CHANNELS
        if not (hwc or chw):
            raise KeyMapError(f"image '{path}' has no channel axis of size 1, 3 or 4: shape {value.shape}")
        if chw and (not hwc or self.config.image_layout == "chw"):
            value = np.transpose(value, (1, 2, 0))
        if min(value.shape[:2]) < 2:
            raise KeyMapError(f"image '{path}' is too small: shape {value.shape}")
        return value

    # -- raw -> openpi (remote backend side) ---------------------------------

    def to_openpi(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Our raw observation (images HWC) in this key map's openpi layout."""
        out: dict[str, Any] = {}
        for camera, image in raw.get("images", {}).items():
            path = self.config.images.get(camera)
            if path is None:
                raise KeyMapError(f"camera '{camera}' is not in key map '{self.name}' ({list(self.config.images)})")
            image = np.asarray(image)
            if self.config.image_layout == "chw" and image.ndim == 3 and image.shape[2] in _CHANNELS:
                image = np.ascontiguousarray(np.transpose(image, (2, 0, 1)))
            _assign(out, path, image)
        state = np.asarray(raw["state"], dtype=np.float32).reshape(-1)
        if state.shape[0] != self.state_dim:
            raise KeyMapError(f"state has length {state.shape[0]}, key map '{self.name}' needs {self.state_dim}")
        start = 0
        for part in self.config.state:
            _assign(out, part.key, state[start : start + part.dim])
            start += part.dim
        if raw.get("prompt") is not None:
            _assign(out, self.config.prompt, raw["prompt"])
        return out


def _lookup(obs: Mapping, parts: tuple[str, ...]) -> tuple[bool, Any]:
    node: Any = obs
    for part in parts:
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _assign(out: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    for part in parts[:-1]:
        out = out.setdefault(part, {})
    out[parts[-1]] = value


def _float_image_to_uint8(image: np.ndarray, path: str) -> np.ndarray:
    """openpi's conversion of a float image, `(255 * image).astype(np.uint8)`, where that cast is defined."""
    scaled = 255 * image  # in the image's own dtype, as openpi computes it
    if scaled.size == 0:
        return scaled.astype(np.uint8)
    if not np.all(np.isfinite(scaled)):
        raise KeyMapError(f"float image '{path}' contains NaN or inf")
    low, high = float(scaled.min()), float(scaled.max())
    # Truncation maps (-1, 256) onto 0..255; anything else would wrap around into garbage pixels.
    if low <= -1.0 or high >= 256.0:
        raise KeyMapError(
            f"float image '{path}' must hold values in [0, 1] (openpi converts 255 * value to uint8); got values in "
            f"[{low / 255:.4g}, {high / 255:.4g}]; send 0..255 pixels as uint8"
        )
    return scaled.astype(np.uint8)


def _state_part(value: Any, part: StatePart) -> np.ndarray:
    if isinstance(value, (list, tuple)):
        try:
            value = np.asarray(value)
        except Exception as exc:  # ragged lists
            raise KeyMapError(f"'{part.key}' is not a flat list of numbers: {exc}") from exc
    elif isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        value = np.asarray([value])
    if not isinstance(value, np.ndarray):
        raise KeyMapError(f"'{part.key}' must be a numeric array of {part.dim} numbers, got {type(value).__name__}")
    if value.dtype.kind not in "fiu":
        raise KeyMapError(f"'{part.key}' must be numeric, got dtype {value.dtype}")
    if value.ndim == 0:
        value = value.reshape(1)
    if value.ndim != 1 or value.shape[0] != part.dim:
        raise KeyMapError(f"'{part.key}' must hold {part.dim} numbers (shape ({part.dim},)), got shape {value.shape}")
    return value.astype(np.float32)


def keymap_path(name_or_path: str) -> Path:
    """config/keymaps/<name>.yaml for a bare name, else the path as given."""
    if os.sep not in name_or_path and "/" not in name_or_path and not name_or_path.endswith((".yaml", ".yml")):
        return KEYMAP_DIR / f"{name_or_path}.yaml"
    return Path(name_or_path)


def available_keymaps() -> list[str]:
    return sorted(p.stem for p in KEYMAP_DIR.glob("*.yaml"))


def load_keymap(name_or_path: str) -> KeyMap:
    """Load a key map by name (droid, libero, aloha) or from a YAML path."""
    if name_or_path == CANONICAL:
        raise ConfigError(
            "key map 'canonical' is built from the policy: use KeyMap.canonical(policy.spec), "
            "or pass keymap=None to PolicyServer"
        )
    path = keymap_path(name_or_path)
    if not path.is_file():
        known = ", ".join([*available_keymaps(), CANONICAL])
        raise ConfigError(f"key map '{name_or_path}' not found ({path}); known key maps: {known}")
    return KeyMap(load_yaml(path, KeyMapConfig), source=str(path))
