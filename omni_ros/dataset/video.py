"""MP4 video in and out with PyAV, encoded the way LeRobot 0.6.1 encodes its datasets.

LeRobot 0.6.1 decodes with torchcodec when it loads, else with PyAV; on a fresh Linux machine torchcodec
finds no FFmpeg libraries and LeRobot falls back to PyAV (verified), so PyAV, which bundles its own FFmpeg,
is what we write and read with. The encoder settings are LeRobot's defaults (libsvtav1, yuv420p, a key frame
every 2 frames, crf 30, preset 12, fast-decode 0): its loader seeks to the nearest key frame before a
requested time, so a short GOP keeps random access cheap.

Frames of consecutive episodes go into one file per camera (as LeRobot appends episodes); an episode's
frames sit at [from_timestamp, to_timestamp) in it, frame k at pts k in a 1/fps time base.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from omni_ros.errors import OmniRosError


class VideoError(OmniRosError):
    """A video cannot be written or read."""


@dataclass
class VideoSettings:
    """LeRobot 0.6.1's default RGB encoder (lerobot/configs/video.py), recorded in info.json as it records them."""

    codec: str = "libsvtav1"
    pix_fmt: str = "yuv420p"
    g: int = 2
    crf: int = 30
    preset: int = 12
    fast_decode: int = 0
    # Encoder threads (svtav1 `lp`); None lets the codec decide.
    threads: int | None = None
    extra_options: dict[str, Any] = field(default_factory=dict)

    def codec_options(self) -> dict[str, str]:
        opts = {"g": str(self.g), "crf": str(self.crf), "preset": str(self.preset)}
        params = [f"fast-decode={max(0, min(2, self.fast_decode))}"]
        if self.threads is not None:
            params.append(f"lp={self.threads}")
        opts["svtav1-params"] = ":".join(params)
        return opts

    def info(self, width: int, height: int, fps: int) -> dict[str, Any]:
        """The feature's `info` block in meta/info.json (LeRobot's get_video_info keys)."""
        return {
            "video.height": height,
            "video.width": width,
            "video.codec": "av1" if self.codec == "libsvtav1" else self.codec,
            "video.pix_fmt": self.pix_fmt,
            "video.fps": fps,
            "video.channels": 3,
            "has_audio": False,
            "video.g": self.g,
            "video.crf": self.crf,
            "video.preset": self.preset,
            "video.fast_decode": self.fast_decode,
            "video.video_backend": "pyav",
            "video.extra_options": dict(self.extra_options),
            "is_depth_map": False,
        }


class VideoWriter:
    """One MP4 file of one camera; frames are appended in order (RGB, HxWx3 uint8, fixed size)."""

    def __init__(self, path: Path, width: int, height: int, fps: int, settings: VideoSettings) -> None:
        import av

        # SVT-AV1 prints its whole configuration to stderr for every file; errors only.
        os.environ.setdefault("SVT_LOG", "1")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.width, self.height = width, height
        self.frames = 0
        try:
            # Typed loosely: PyAV's stubs give add_stream a union of video, audio and subtitle streams.
            self._container: Any = av.open(str(path), "w")
            stream: Any = self._container.add_stream(settings.codec, fps, options=settings.codec_options())
            self._stream = stream
        except Exception as exc:
            raise VideoError(f"cannot open {settings.codec} encoder for {path}: {exc}") from exc
        self._stream.pix_fmt = settings.pix_fmt
        self._stream.width = width
        self._stream.height = height

    def add(self, rgb: np.ndarray) -> None:
        import av

        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        self.frames += 1

    def close(self) -> None:
        if self._container is None:
            return
        for packet in self._stream.encode():
            self._container.mux(packet)
        self._container.close()
        self._container = None

    def discard(self) -> None:
        """Close without draining the encoder (the file is being thrown away). Draining an SVT-AV1 encoder after
        a failed export hung the process in `encode()` (a CI run of test_dataset_export.py); closing the
        container frees the encoder without asking it for what it still holds."""
        if self._container is None:
            return
        container, self._container = self._container, None
        container.close()

    @property
    def size_bytes(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0


def read_frames(path: Path, from_s: float, count: int, fps: float) -> Iterator[np.ndarray]:
    """`count` RGB frames starting at `from_s` seconds, in order (HxWx3 uint8); VideoError if any is missing.

    Frames are matched to their expected times k / fps within half a period, as LeRobot's decoder matches a
    query to the nearest decoded frame.
    """
    import av

    if count <= 0:
        return
    tolerance = 0.5 / fps
    try:
        container = av.open(str(path))
    except Exception as exc:
        raise VideoError(f"cannot open video {path}: {exc}") from exc
    with container:
        stream: Any = container.streams.video[0]
        container.seek(max(0, round(from_s / stream.time_base) - 1), backward=True, any_frame=False, stream=stream)
        k = 0
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            t = float(frame.pts * stream.time_base)
            want = from_s + k / fps
            if t < want - tolerance:
                continue
            if t > want + tolerance:
                raise VideoError(f"video {path}: no frame at {want:.4f} s (next one at {t:.4f} s)")
            yield frame.to_ndarray(format="rgb24")
            k += 1
            if k == count:
                return
    raise VideoError(f"video {path}: {k} of {count} frames from {from_s:.4f} s")
