"""The observation every entry point builds: ROS nodes, the OpenPI bridge, the evaluator.

A raw observation is a plain dict, the contract of `Policy.infer`:

    {"images": {camera_name: HWC or CHW uint8 array, any size},
     "state": 1-D float array (proprioception, robot units),
     "prompt": str}

`make_observation` validates it against an `ObservationSpec` and reduces each
camera image to exactly one square tile by resize-with-pad (never multi-crop
tiling). Cameras the spec knows but the input lacks are masked out, as pi0
does; cameras listed in `required_cameras` must be present.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from omni_ros.errors import OmniRosError


class ObservationError(OmniRosError, ValueError):
    """The observation does not match what the policy expects; the message says how."""


@dataclass(frozen=True)
class ObservationSpec:
    """What a policy consumes: camera slots, tile size, state size, prompt rule."""

    camera_names: tuple[str, ...]
    state_dim: int
    image_size: int = 224
    required_cameras: tuple[str, ...] = ()
    require_prompt: bool = True
    default_prompt: str = ""

    def __post_init__(self) -> None:
        if not self.camera_names:
            raise ValueError("ObservationSpec needs at least one camera")
        unknown = set(self.required_cameras) - set(self.camera_names)
        if unknown:
            raise ValueError(f"required cameras {sorted(unknown)} are not in camera_names {list(self.camera_names)}")


@dataclass
class Observation:
    """A validated observation: one uint8 tile per camera slot, masks, state, prompt."""

    images: dict[str, np.ndarray]  # name -> (S, S, 3) uint8, zeros when masked
    image_masks: dict[str, bool]
    state: np.ndarray  # (state_dim,) float32
    prompt: str
    extras: dict[str, Any] = field(default_factory=dict)


def resize_with_pad(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Scale `image` (HWC uint8) to fit height x width keeping its aspect, pad the rest with black.

    The content is centred, so a 640x480 frame becomes a 224x168 picture with
    28-pixel bars above and below, like openpi's `image_tools.resize_with_pad`.
    """
    h, w = image.shape[:2]
    if (h, w) == (height, width):
        return image
    scale = min(height / h, width / w)
    new_h, new_w = max(1, round(h * scale)), max(1, round(w * scale))
    # INTER_AREA averages when shrinking (no aliasing); INTER_LINEAR when enlarging.
    interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    resized = cv2.resize(image, (new_w, new_h), interpolation=interp)
    if resized.ndim == 2:
        resized = resized[:, :, None]
    out = np.zeros((height, width, image.shape[2]), dtype=image.dtype)
    top, left = (height - new_h) // 2, (width - new_w) // 2
    out[top : top + new_h, left : left + new_w] = resized
    return out


def to_hwc_rgb(image: Any, name: str) -> np.ndarray:
    """Accept HWC or CHW uint8 with 1, 3 or 4 channels; return HWC RGB uint8."""
    if not isinstance(image, np.ndarray):
        raise ObservationError(f"camera '{name}': expected a numpy array, got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise ObservationError(f"camera '{name}': expected dtype uint8, got {image.dtype}")
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3:
        raise ObservationError(f"camera '{name}': expected an HWC or CHW image (rank 3), got shape {image.shape}")
    if image.shape[-1] not in (1, 3, 4) and image.shape[0] in (1, 3, 4):
        image = np.transpose(image, (1, 2, 0))
    channels = image.shape[-1]
    if channels not in (1, 3, 4):
        raise ObservationError(f"camera '{name}': expected 1, 3 or 4 channels, got shape {image.shape}")
    if min(image.shape[:2]) < 2:
        raise ObservationError(f"camera '{name}': image too small, shape {image.shape}")
    if channels == 1:
        image = np.repeat(image, 3, axis=2)
    elif channels == 4:
        image = image[:, :, :3]
    return np.ascontiguousarray(image)


def make_observation(spec: ObservationSpec, raw: Mapping[str, Any], tile: bool = True) -> Observation:
    """Validate a raw observation dict and reduce every camera to one tile.

    With tile=False the validated RGB images keep their size: a processor that reproduces a reference
    implementation's own resize (a float bilinear one, say) makes the tile itself. Masked cameras are a
    black tile either way.
    """
    if not isinstance(raw, Mapping):
        raise ObservationError(f"observation must be a dict, got {type(raw).__name__}")
    unknown_keys = set(raw) - {"images", "state", "prompt"}
    if unknown_keys:
        raise ObservationError(f"unknown observation keys {sorted(unknown_keys)}; expected images, state, prompt")
    images = raw.get("images")
    if not isinstance(images, Mapping):
        raise ObservationError("observation['images'] must be a dict of camera name -> image")
    unknown = [name for name in images if name not in spec.camera_names]
    if unknown:
        raise ObservationError(f"unknown camera(s) {unknown}; this policy has cameras {list(spec.camera_names)}")
    missing = [name for name in spec.required_cameras if name not in images]
    if missing:
        raise ObservationError(f"missing required camera(s) {missing}")
    if not images:
        raise ObservationError(f"no camera images; this policy has cameras {list(spec.camera_names)}")

    size = spec.image_size
    tiles: dict[str, np.ndarray] = {}
    masks: dict[str, bool] = {}
    for name in spec.camera_names:
        if name in images:
            rgb = to_hwc_rgb(images[name], name)
            tiles[name] = resize_with_pad(rgb, size, size) if tile else rgb
            masks[name] = True
        else:
            tiles[name] = np.zeros((size, size, 3), np.uint8)
            masks[name] = False

    return Observation(images=tiles, image_masks=masks, state=_check_state(spec, raw), prompt=_check_prompt(spec, raw))


def _check_state(spec: ObservationSpec, raw: Mapping[str, Any]) -> np.ndarray:
    if "state" not in raw:
        raise ObservationError("missing observation['state']")
    state = raw["state"]
    try:
        state = np.asarray(state)
    except Exception as exc:  # ragged lists and the like
        raise ObservationError(f"state is not numeric: {exc}") from exc
    if state.dtype.kind not in "fiu":
        raise ObservationError(f"state must be numeric, got dtype {state.dtype}")
    if state.ndim != 1:
        raise ObservationError(f"state must be 1-D, got shape {state.shape}")
    if state.shape[0] != spec.state_dim:
        raise ObservationError(f"state has length {state.shape[0]}, expected {spec.state_dim}")
    state = state.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(state))
    if bad.size:
        raise ObservationError(f"state has non-finite values (NaN/inf) at indices {bad.tolist()}")
    return state


def _check_prompt(spec: ObservationSpec, raw: Mapping[str, Any]) -> str:
    prompt = raw.get("prompt", None)
    if prompt is None:
        prompt = spec.default_prompt
    if isinstance(prompt, bytes):
        prompt = prompt.decode("utf-8", errors="replace")
    if not isinstance(prompt, str):
        raise ObservationError(f"prompt must be a string, got {type(prompt).__name__}")
    prompt = prompt.strip()
    if spec.require_prompt and not prompt:
        raise ObservationError("prompt is empty; this policy needs a task prompt")
    return prompt
