"""Messages -> the ObservationAssembler: the one way in for the policy node and the rosbag replay.

Each message is converted at the edge (raw encodings, JPEG/PNG, header stamps) and handed to the
assembler; a frame that cannot be converted is counted with its reason. The robot and the evaluator
therefore accept and refuse the same frames, for the same reasons, stamped the same way:

    feed = MessageFeed(assembler)
    feed.image("base", image_msg, received=now, compressed=False)   # False: refused
    feed.joint_state(joint_state_msg, received=now)
    feed.prompt(string_msg, received=now)
    executor.set_stale(True, feed.explain(assembler.check(now)))

Messages are duck-typed (rclpy's and rosbags' classes alike): an image has the sensor_msgs/Image or
CompressedImage fields, a joint state `name` and `position`, a prompt `data`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from omni_ros.assembler import ObservationAssembler, Problem
from omni_ros.ros_convert import ImageError, compressed_to_rgb, image_to_rgb, message_stamp


class MessageFeed:
    """Feeds one assembler; keeps count of unconvertible frames and each camera's latest rejection."""

    def __init__(
        self,
        assembler: ObservationAssembler,
        *,
        use_header_stamps: bool = True,
        image_errors: Counter[str] | None = None,
        on_new_error: Callable[[str, str], None] | None = None,
    ) -> None:
        """`image_errors`, when given, counts refused frames by "camera 'base': <reason>" (an evaluation's
        tally; a long-running node leaves it out, as reasons with sizes in them are unbounded).
        `on_new_error(camera, reason)` is called when a camera's frames start failing for a new reason."""
        self.assembler = assembler
        self.use_header_stamps = use_header_stamps
        self.image_errors = image_errors
        self._on_new_error = on_new_error
        self._lock = threading.Lock()
        # Why each camera's latest frame was refused; a good frame clears it.
        self._last_error: dict[str, str] = {}

    def image(self, camera: str, msg: Any, received: float, compressed: bool) -> bool:
        """Convert and add a (compressed) image; False when refused (unconvertible, out of order, unknown)."""
        try:
            rgb = compressed_to_rgb(msg) if compressed else image_to_rgb(msg)
        except ImageError as exc:
            reason = str(exc)
            with self._lock:
                if self.image_errors is not None:
                    self.image_errors[f"camera '{camera}': {reason}"] += 1
                new = self._last_error.get(camera) != reason
                self._last_error[camera] = reason
            if new and self._on_new_error is not None:
                self._on_new_error(camera, reason)
            return False
        with self._lock:
            self._last_error.pop(camera, None)
        return self.assembler.add_image(camera, rgb, message_stamp(msg, received, self.use_header_stamps))

    def joint_state(self, msg: Any, received: float) -> bool:
        """Add a sensor_msgs/JointState (reordered by name); False when refused (invalid or out of order)."""
        stamp = message_stamp(msg, received, self.use_header_stamps)
        return self.assembler.add_joint_state(list(msg.name), list(msg.position), stamp)

    def prompt(self, msg: Any, received: float) -> None:
        """Add a std_msgs/String prompt, stamped with its arrival (a String has no header)."""
        self.assembler.add_prompt(msg.data, received)

    def last_error(self, camera: str) -> str:
        """Why `camera`'s latest frame was refused ('' when it was accepted)."""
        with self._lock:
            return self._last_error.get(camera, "")

    def explain(self, problem: Problem | None) -> str:
        """`problem` as a sentence, naming the last rejected frame of a camera that has none usable."""
        if problem is None:
            return ""
        text = str(problem)
        rejected = self.last_error(problem.camera) if problem.camera is not None else ""
        return f"{text} (last frame rejected: {rejected})" if rejected else text
