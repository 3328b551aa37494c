"""Reading rosbag2 (mcap or sqlite3) with `rosbags`: no ROS install needed, custom messages included.

    bag = open_bag("episodes/")                 # a rosbag2 directory, or a .mcap / .db3 file
    bag.require("/joint_states", JOINT_STATE, role="joint states")
    for topic, log_time, msg in bag.read(["/joint_states", ...]):
        ...
    bag.problems                                # what could not be read, and why

Types come from the ROS 2 (kilted) type store, our own `msg/*.msg`, and the definitions stored in the
bag itself, so a bag recorded with other custom messages still decodes. A message that does not decode
is skipped and counted; storage that breaks mid-way ends the reading with what came before it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from omni_ros.eval.errors import BagError, TopicError

IMAGE = "sensor_msgs/msg/Image"
COMPRESSED_IMAGE = "sensor_msgs/msg/CompressedImage"
JOINT_STATE = "sensor_msgs/msg/JointState"
STRING = "std_msgs/msg/String"
JOINT_TRAJECTORY = "trajectory_msgs/msg/JointTrajectory"
FLOAT64_ARRAY = "std_msgs/msg/Float64MultiArray"
ACTION_CHUNK = "omni_ros/msg/ActionChunk"

CUSTOM_MESSAGES = ("ActionChunk", "AudioChunk", "PolicyStatus")


def _msg_dirs() -> list[Path]:
    """Where our .msg files live: the source tree, or an installed share/omni_ros/msg."""
    dirs = [Path(__file__).resolve().parents[2] / "msg"]
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p] + [sys.prefix]
    dirs += [Path(p) / "share" / "omni_ros" / "msg" for p in prefixes]
    return [d for d in dirs if (d / "ActionChunk.msg").is_file()]


@lru_cache(maxsize=1)
def base_typestore() -> Any:
    """ROS 2 kilted types plus omni_ros/msg/*; callers copy it before adding a bag's own types."""
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    dirs = _msg_dirs()
    if dirs:
        types: dict = {}
        for name in CUSTOM_MESSAGES:
            path = dirs[0] / f"{name}.msg"
            if path.is_file():
                types.update(get_types_from_msg(path.read_text(encoding="utf-8"), f"omni_ros/msg/{name}"))
        store.register(types)
    return store


def typestore_for(connections: Iterable[Any]) -> Any:
    """The base store plus every type a bag defines that the base store lacks."""
    from rosbags.interfaces import MessageDefinitionFormat
    from rosbags.typesys import get_types_from_msg, get_typestore
    from rosbags.typesys.stores import Stores

    base = base_typestore()
    extra: dict = {}
    for conn in connections:
        if conn.msgtype in base.fielddefs or conn.msgtype in extra:
            continue
        if conn.msgdef.format == MessageDefinitionFormat.MSG and conn.msgdef.data:
            try:
                types = get_types_from_msg(conn.msgdef.data, conn.msgtype)
            except Exception:  # an unparsable definition only matters if the topic is used (checked there)
                continue
            extra.update({k: v for k, v in types.items() if k not in base.fielddefs})
    if not extra:
        return base
    store = get_typestore(Stores.EMPTY)
    store.register(dict(base.fielddefs))
    store.register(extra)
    return store


@dataclass
class BagProblems:
    """What was skipped while reading a bag."""

    # "topic: reason" -> count of messages that did not decode.
    undecodable: Counter = field(default_factory=Counter)
    # Set when the storage broke before its end: the evaluation covers what came before.
    truncated: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"undecodable": dict(self.undecodable), "truncated": self.truncated}

    @property
    def any(self) -> bool:
        return bool(self.undecodable) or bool(self.truncated)


class Bag:
    """One open rosbag2 bag: its topics and types, and decoded messages in log-time order."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.name = str(path)
        target = _resolve(self.path)
        from rosbags.rosbag2 import Reader

        recovered = ""
        try:
            self._reader = Reader(target)
            self._reader.open()
        except FileNotFoundError as exc:
            raise BagError(f"bag {self.name}: cannot open: {exc}") from exc
        except Exception as exc:
            self._reader = _recover(target)
            if self._reader is None:
                raise BagError(f"bag {self.name}: not a readable rosbag2 (mcap or sqlite3): {exc}") from exc
            recovered = f"index unreadable ({_short(exc)}); {self._reader.message_count} messages recovered by scanning"
        try:
            self.storage = _storage_of(target, self._reader)
            self.connections = list(self._reader.connections)
            self.topics: dict[str, str] = {}
            self.counts: Counter = Counter()
            for conn in self.connections:
                self.topics.setdefault(conn.topic, conn.msgtype)
                self.counts[conn.topic] += conn.msgcount
            self.start_ns = int(self._reader.start_time) if self._reader.message_count else 0
            self.end_ns = int(self._reader.end_time) if self._reader.message_count else 0
            self.typestore = typestore_for(self.connections)
            self.custom_data = _custom_data(self._reader)
        except Exception as exc:
            self.close()
            raise BagError(f"bag {self.name}: corrupt index or metadata: {exc}") from exc
        self.problems = BagProblems(truncated=recovered)
        self.decoded = 0

    def __enter__(self) -> Bag:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        reader = getattr(self, "_reader", None)
        if reader is not None and reader.is_open:
            with contextlib.suppress(Exception):
                reader.close()

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) * 1e-9

    def require(self, topic: str, types: Iterable[str], role: str) -> str:
        """The type of `topic`; TopicError naming bag and topic when it is absent or of another type."""
        types = tuple(types)
        if topic not in self.topics:
            listing = ", ".join(f"{t} ({self.topics[t]})" for t in sorted(self.topics)) or "none"
            raise TopicError(f"bag {self.name}: no topic '{topic}' ({role}); topics in the bag: {listing}")
        msgtype = self.topics[topic]
        if msgtype not in types:
            raise TopicError(
                f"bag {self.name}: topic '{topic}' ({role}) has type {msgtype}; expected {' or '.join(types)}"
            )
        if msgtype not in self.typestore.fielddefs:
            raise TopicError(f"bag {self.name}: topic '{topic}' has type {msgtype} with no usable definition")
        return msgtype

    def message_count(self, topics: Iterable[str]) -> int:
        return sum(self.counts[t] for t in set(topics))

    def raw(self, topics: Iterable[str]) -> Iterator[tuple[str, str, int, bytes]]:
        """(topic, type, log time ns, CDR bytes) in log-time order; storage errors end the stream (see problems)."""
        wanted = set(topics)
        conns = [c for c in self.connections if c.topic in wanted]
        if not conns:
            return
        stream = self._reader.messages(connections=conns)
        while True:
            try:
                conn, t_ns, data = next(stream)
            except StopIteration:
                stopped = getattr(self._reader, "stopped", "")
                if stopped:
                    self.problems.truncated = "; ".join(x for x in (self.problems.truncated, stopped) if x)
                return
            except Exception as exc:  # a damaged chunk or page: keep what was read before it
                self.problems.truncated = f"reading stopped: {_short(exc)}"
                return
            yield conn.topic, conn.msgtype, int(t_ns), data

    def read(self, topics: Iterable[str]) -> Iterator[tuple[str, float, Any]]:
        """(topic, log time s, decoded message) in log-time order; undecodable messages are skipped and counted."""
        deserialize = self.typestore.deserialize_cdr
        for topic, msgtype, t_ns, data in self.raw(topics):
            try:
                msg = deserialize(data, msgtype)
            except Exception as exc:
                self.problems.undecodable[f"{topic}: {_short(exc)}"] += 1
                continue
            self.decoded += 1
            yield topic, t_ns * 1e-9, msg


def open_bag(path: str | os.PathLike) -> Bag:
    return Bag(path)


def _resolve(path: Path) -> Path:
    """A rosbag2 directory, a .mcap/.db3 file, or a directory holding exactly one such file."""
    if not path.exists():
        raise BagError(f"bag {path}: no such file or directory")
    if path.is_dir():
        if (path / "metadata.yaml").is_file():
            return path
        files = sorted(p for p in path.iterdir() if p.suffix in (".mcap", ".db3"))
        if len(files) == 1:
            return files[0]
        raise BagError(f"bag {path}: no metadata.yaml and {len(files)} .mcap/.db3 files; not a rosbag2 directory")
    if path.suffix not in (".mcap", ".db3"):
        raise BagError(f"bag {path}: unknown storage '{path.suffix}'; expected a rosbag2 directory, .mcap or .db3")
    return path


def _recover(target: Path) -> Any:
    """The intact part of a damaged MCAP file (None when there is nothing to recover)."""
    from omni_ros.eval.mcap_recover import RecoveredMcap

    files = [target] if target.is_file() else sorted(target.glob("*.mcap"))
    if len(files) != 1 or files[0].suffix != ".mcap":
        return None
    try:
        reader = RecoveredMcap(files[0])
    except Exception:
        return None
    return reader if reader.message_count else None


def _custom_data(reader: Any) -> dict[str, str]:
    """metadata.yaml's custom_data (what the recorder said about the bag); none for a bare or recovered file."""
    metadata = getattr(getattr(reader, "storage", None), "metadata", None)
    custom = getattr(metadata, "custom", None)
    return {str(k): str(v) for k, v in custom.items()} if isinstance(custom, dict) else {}


def _storage_of(target: Path, reader: Any) -> str:
    if target.is_file():
        return "mcap" if target.suffix == ".mcap" else "sqlite3"
    files = [p.suffix for p in target.iterdir()]
    return "mcap" if ".mcap" in files else "sqlite3" if ".db3" in files else "unknown"


def _short(exc: Exception) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text[:120]
