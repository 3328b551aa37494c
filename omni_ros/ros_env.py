"""Process-wide ROS 2 settings that must be in place before rclpy starts."""

from __future__ import annotations

import os


def default_to_localhost() -> None:
    """Keep DDS discovery on this machine unless the user chose otherwise.

    Fast DDS multicasts to the whole subnet by default; a robot that talks to
    other machines sets ROS_AUTOMATIC_DISCOVERY_RANGE=SUBNET explicitly.
    """
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
