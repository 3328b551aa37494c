"""Writing rosbag2 (mcap or sqlite3) with `rosbags`: the sim recorder, tests and benchmarks build bags here.

    with BagWriter("out/episodes", storage="mcap") as bag:
        bag.image("/camera/base/image_raw", rgb, stamp=t)
        bag.joint_state("/joint_states", names, q, stamp=t)
        bag.string("/omni_ros/prompt", "reach the red block", t)
        bag.trajectory("/arm_controller/joint_trajectory", names, [q_target], stamp=t)

Messages are serialized to CDR exactly as ROS 2 publishes them; `log_time` (when a recorder would have
received the message) defaults to the stamp.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from omni_ros.eval.bag import (
    ACTION_CHUNK,
    COMPRESSED_IMAGE,
    FLOAT64_ARRAY,
    IMAGE,
    JOINT_STATE,
    JOINT_TRAJECTORY,
    STRING,
    base_typestore,
)
from omni_ros.eval.errors import BagError

STORAGES = ("mcap", "sqlite3")


class BagWriter:
    def __init__(self, path: str | os.PathLike, storage: str = "mcap") -> None:
        from rosbags.rosbag2 import StoragePlugin, Writer

        if storage not in STORAGES:
            raise BagError(f"bag {path}: unknown storage '{storage}'; use one of {', '.join(STORAGES)}")
        self.path = Path(path)
        if self.path.exists():
            raise BagError(f"bag {path}: already exists; choose a new output directory")
        plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
        self.store = base_typestore()
        self._writer: Writer | None = Writer(self.path, version=9, storage_plugin=plugin)
        self._writer.open()
        self._connections: dict[str, Any] = {}
        self.messages = 0
        t = self.store.types
        self._Time = t["builtin_interfaces/msg/Time"]
        self._Duration = t["builtin_interfaces/msg/Duration"]
        self._Header = t["std_msgs/msg/Header"]

    def __enter__(self) -> BagWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def set_custom_data(self, key: str, value: str) -> None:
        assert self._writer is not None, f"bag {self.path} is closed"
        self._writer.set_custom_data(key, value)

    # ----- generic -------------------------------------------------------------------------------------------

    def write(self, topic: str, msgtype: str, msg: Any, log_time: float) -> None:
        self.write_raw(topic, msgtype, bytes(self.store.serialize_cdr(msg, msgtype)), log_time)

    def write_raw(self, topic: str, msgtype: str, data: bytes, log_time: float) -> None:
        assert self._writer is not None, f"bag {self.path} is closed"
        conn = self._connections.get(topic)
        if conn is None:
            conn = self._writer.add_connection(topic, msgtype, typestore=self.store)
            self._connections[topic] = conn
        self._writer.write(conn, round(log_time * 1e9), data)
        self.messages += 1

    def header(self, stamp: float, frame_id: str = "") -> Any:
        return self._Header(stamp=self.time(stamp), frame_id=frame_id)

    def time(self, t: float) -> Any:
        sec = math.floor(t)
        return self._Time(sec=int(sec), nanosec=min(round((t - sec) * 1e9), 999_999_999))

    # ----- typed helpers -------------------------------------------------------------------------------------

    def image(self, topic: str, rgb: np.ndarray, stamp: float, log_time: float | None = None) -> None:
        rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
        h, w = rgb.shape[:2]
        msg = self.store.types[IMAGE](
            header=self.header(stamp),
            height=h,
            width=w,
            encoding="rgb8",
            is_bigendian=0,
            step=w * 3,
            data=rgb.reshape(-1),
        )
        self.write(topic, IMAGE, msg, stamp if log_time is None else log_time)

    def compressed(
        self, topic: str, rgb: np.ndarray, stamp: float, log_time: float | None = None, fmt: str = "jpeg"
    ) -> None:
        import cv2

        ok, buf = cv2.imencode(".jpg" if fmt == "jpeg" else ".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
        if not ok:
            raise BagError(f"cannot encode a {fmt} frame for {topic}")
        msg = self.store.types[COMPRESSED_IMAGE](header=self.header(stamp), format=fmt, data=buf.reshape(-1))
        self.write(topic, COMPRESSED_IMAGE, msg, stamp if log_time is None else log_time)

    def joint_state(
        self,
        topic: str,
        names: Sequence[str],
        positions: ArrayLike,
        stamp: float,
        log_time: float | None = None,
        velocities: ArrayLike | None = None,
    ) -> None:
        msg = self.store.types[JOINT_STATE](
            header=self.header(stamp),
            name=list(names),
            position=np.asarray(positions, dtype=np.float64),
            velocity=np.asarray(velocities if velocities is not None else [], dtype=np.float64),
            effort=np.zeros(0, dtype=np.float64),
        )
        self.write(topic, JOINT_STATE, msg, stamp if log_time is None else log_time)

    def string(self, topic: str, text: str, log_time: float) -> None:
        self.write(topic, STRING, self.store.types[STRING](data=text), log_time)

    def trajectory(
        self,
        topic: str,
        names: Sequence[str],
        points: Sequence[ArrayLike],
        stamp: float,
        log_time: float | None = None,
        point_dt: float = 0.02,
    ) -> None:
        """One JointTrajectory; point k is due `(k + 1) * point_dt` after the stamp (as the policy node sends)."""
        point_type = self.store.types["trajectory_msgs/msg/JointTrajectoryPoint"]
        empty = np.zeros(0, dtype=np.float64)
        pts = []
        for k, positions in enumerate(points):
            tfs = (k + 1) * point_dt
            sec = math.floor(tfs)
            pts.append(
                point_type(
                    positions=np.asarray(positions, dtype=np.float64),
                    velocities=empty,
                    accelerations=empty,
                    effort=empty,
                    time_from_start=self._Duration(sec=int(sec), nanosec=round((tfs - sec) * 1e9)),
                )
            )
        msg = self.store.types[JOINT_TRAJECTORY](header=self.header(stamp), joint_names=list(names), points=pts)
        self.write(topic, JOINT_TRAJECTORY, msg, stamp if log_time is None else log_time)

    def float_array(self, topic: str, values: ArrayLike, log_time: float) -> None:
        layout = self.store.types["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0)
        msg = self.store.types[FLOAT64_ARRAY](layout=layout, data=np.asarray(values, dtype=np.float64))
        self.write(topic, FLOAT64_ARRAY, msg, log_time)

    def action_chunk(
        self,
        topic: str,
        actions: np.ndarray,
        stamp: float,
        dt: float,
        chunk_id: int,
        names: Sequence[str],
        log_time: float | None = None,
        inference_time: float = 0.0,
        backend: str = "",
    ) -> None:
        actions = np.asarray(actions, dtype=np.float32)
        msg = self.store.types[ACTION_CHUNK](
            header=self.header(stamp),
            chunk_id=int(chunk_id),
            joint_names=list(names),
            horizon=int(actions.shape[0]),
            action_dim=int(actions.shape[1]),
            dt=float(dt),
            actions=actions.reshape(-1),
            inference_time=float(inference_time),
            backend=backend,
        )
        self.write(topic, ACTION_CHUNK, msg, stamp if log_time is None else log_time)
