"""sensor_msgs <-> numpy at the edge of the ROS nodes (no cv_bridge: its PyPI copy breaks under numpy 2)."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from omni_ros.errors import OmniRosError

# Channels and the conversion to RGB for each supported raw encoding.
_ENCODINGS = {
    "rgb8": (3, None),
    "bgr8": (3, cv2.COLOR_BGR2RGB),
    "rgba8": (4, cv2.COLOR_RGBA2RGB),
    "bgra8": (4, cv2.COLOR_BGRA2RGB),
    "mono8": (1, cv2.COLOR_GRAY2RGB),
}


class ImageError(OmniRosError):
    """An image message cannot be turned into an RGB frame."""


def stamp_to_sec(stamp: Any) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


def sec_to_stamp(t: float, stamp: Any) -> Any:
    """Fill a builtin_interfaces/Time in place from seconds."""
    sec = int(t // 1)
    stamp.sec = sec
    stamp.nanosec = min(round((t - sec) * 1e9), 999_999_999)
    return stamp


def message_stamp(msg: Any, fallback: float, use_header: bool = True) -> float:
    """The header stamp (when the data was taken) unless unused, absent or zero; else `fallback` (arrival time)."""
    header = getattr(msg, "header", None)  # Float64MultiArray and String have none
    if use_header and header is not None:
        t = stamp_to_sec(header.stamp)
        if t > 0:
            return t
    return fallback


def image_to_rgb(msg: Any, max_pixels: int = 4096 * 4096) -> np.ndarray:
    """sensor_msgs/Image -> HWC RGB uint8 (a copy only where a conversion is needed)."""
    encoding = msg.encoding.lower()
    if encoding not in _ENCODINGS:
        raise ImageError(f"unsupported image encoding '{msg.encoding}'; supported: {', '.join(_ENCODINGS)}")
    channels, conversion = _ENCODINGS[encoding]
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    if h <= 0 or w <= 0 or h * w > max_pixels:
        raise ImageError(f"image size {w}x{h} out of range (at most {max_pixels} pixels)")
    if step < w * channels:
        raise ImageError(f"image step {step} < width {w} x {channels} channels")
    data = np.frombuffer(msg.data, dtype=np.uint8)
    if data.size < h * step:
        raise ImageError(f"image data has {data.size} bytes, expected {h * step} ({w}x{h}, step {step})")
    frame = data[: h * step].reshape(h, step)[:, : w * channels].reshape(h, w, channels)
    return frame if conversion is None else cv2.cvtColor(frame, conversion)


def compressed_to_rgb(msg: Any) -> np.ndarray:
    """sensor_msgs/CompressedImage (jpeg/png) -> HWC RGB uint8."""
    fmt = msg.format.lower()
    if not any(kind in fmt for kind in ("jpeg", "jpg", "png")):
        raise ImageError(f"unsupported compressed format '{msg.format}'; use jpeg or png")
    bgr = cv2.imdecode(np.frombuffer(msg.data, dtype=np.uint8), cv2.IMREAD_COLOR)
    if bgr is None:
        raise ImageError(f"cannot decode {msg.format} image of {len(msg.data)} bytes")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def rgb_to_image(frame: np.ndarray, msg: Any, stamp: float | None = None, frame_id: str = "") -> Any:
    """Fill a sensor_msgs/Image (rgb8) from HWC RGB uint8; `tobytes()` is ~50x faster than assigning arrays."""
    frame = np.ascontiguousarray(frame, dtype=np.uint8)
    msg.height, msg.width = frame.shape[:2]
    msg.encoding = "rgb8"
    msg.is_bigendian = 0
    msg.step = frame.shape[1] * 3
    msg.data = frame.tobytes()
    msg.header.frame_id = frame_id
    if stamp is not None:
        sec_to_stamp(stamp, msg.header.stamp)
    return msg
