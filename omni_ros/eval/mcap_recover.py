"""Reading what is left of a damaged MCAP file (a recorder that crashed leaves no footer or index).

The indexed reader needs the summary at the end of the file; this one walks the records from the start
(schemas, channels, messages, uncompressed chunks) and stops at the first record that is cut off or
malformed, so everything written before the damage can still be evaluated.

Record layout (MCAP spec): opcode u8, length u64, body. Strings are u32 length + UTF-8.
"""

from __future__ import annotations

import mmap
import struct
from collections import Counter
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

MAGIC = b"\x89MCAP0\r\n"
OP_SCHEMA, OP_CHANNEL, OP_MESSAGE, OP_CHUNK, OP_FOOTER, OP_DATA_END = 0x03, 0x04, 0x05, 0x06, 0x02, 0x0F


class _Cursor:
    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("record body ends early")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u16(self) -> int:
        return struct.unpack("<H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> str:
        return bytes(self.take(self.u32())).decode("utf-8")


class RecoveredMcap:
    """A reader-like view (connections, messages) of the intact part of an MCAP file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        # Mapped, not read: a damaged multi-gigabyte recording must not be copied into memory.
        with self.path.open("rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.data = memoryview(self._map)
        if bytes(self.data[:8]) != MAGIC:
            raise ValueError("not an MCAP file (bad magic)")
        self.is_open = True
        self.stopped = ""
        self._schemas: dict[int, tuple[str, str, str]] = {}
        self._channels: dict[int, Any] = {}
        counts: Counter = Counter()
        times: list[int] = []
        for channel_id, t_ns, _ in self._walk():
            counts[channel_id] += 1
            times.append(t_ns)
        self.message_count = sum(counts.values())
        self.start_time = min(times) if times else 0
        self.end_time = max(times) if times else 0
        self.connections = [c._replace(msgcount=counts[c.id]) for c in self._channels.values()]

    def close(self) -> None:
        self.is_open = False

    def _walk(self) -> Iterator[tuple[int, int, memoryview]]:
        """(channel id, log time ns, data) of every intact message; sets `stopped` at the damage."""
        self.stopped = ""
        cur = _Cursor(self.data)
        cur.pos = 8
        while cur.pos < len(self.data):
            start = cur.pos
            try:
                op = cur.take(1)[0]
                length = cur.u64()
                available = len(self.data) - cur.pos
                if op == OP_CHUNK and length > available:
                    # The recorder died while writing this chunk: its complete messages still count.
                    yield from self._chunk(_Cursor(cur.take(available)))
                    raise ValueError("chunk cut off")
                body = _Cursor(cur.take(length))
                if op == OP_CHUNK:
                    yield from self._chunk(body)
                elif op in (OP_FOOTER, OP_DATA_END):
                    return
                else:
                    yield from self._record(op, body)
            except Exception as exc:
                self.stopped = f"damaged or cut-off record at byte {start} of {len(self.data)}: {exc}"
                return

    def _chunk(self, body: _Cursor) -> Iterator[tuple[int, int, memoryview]]:
        body.take(8 + 8 + 8 + 4)  # start/end time, uncompressed size, crc
        compression = body.string()
        size = body.u64()
        records = body.take(min(size, len(body.data) - body.pos))
        if compression:
            records = memoryview(_decompress(compression, bytes(records)))
        inner = _Cursor(records)
        while inner.pos < len(records):
            op = inner.take(1)[0]
            yield from self._record(op, _Cursor(inner.take(inner.u64())))

    def _record(self, op: int, body: _Cursor) -> Iterator[tuple[int, int, memoryview]]:
        if op == OP_MESSAGE:
            channel_id = body.u16()
            body.take(4)  # sequence
            log_time = body.u64()
            body.take(8)  # publish time
            if channel_id in self._channels:
                yield channel_id, log_time, body.data[body.pos :]
        elif op == OP_SCHEMA:
            sid = body.u16()
            name, encoding = body.string(), body.string()
            text = bytes(body.take(body.u32())).decode("utf-8", errors="replace")
            self._schemas[sid] = (name, encoding, text)
        elif op == OP_CHANNEL:
            cid, sid = body.u16(), body.u16()
            topic, encoding = body.string(), body.string()
            if cid not in self._channels:
                self._channels[cid] = _connection(cid, topic, encoding, self._schemas.get(sid), self)

    def messages(
        self, connections: Collection[Any] = (), start: int | None = None, stop: int | None = None
    ) -> Iterator[tuple[Any, int, bytes]]:
        wanted = {c.id: c for c in connections} if connections else {c.id: c for c in self.connections}
        for channel_id, t_ns, data in self._walk():
            if channel_id in wanted:
                yield wanted[channel_id], t_ns, bytes(data)


def _decompress(kind: str, data: bytes) -> bytes:
    if kind == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 31)
    if kind == "lz4":
        import lz4.frame

        return lz4.frame.decompress(data)
    raise ValueError(f"unsupported chunk compression '{kind}'")


def _connection(cid: int, topic: str, encoding: str, schema: tuple[str, str, str] | None, owner: Any) -> Any:
    from rosbags.interfaces import Connection, ConnectionExtRosbag2, MessageDefinition, MessageDefinitionFormat

    name, schema_encoding, text = schema if schema else ("", "", "")
    fmt = MessageDefinitionFormat.MSG if schema_encoding == "ros2msg" else MessageDefinitionFormat.NONE
    msgdef = MessageDefinition(fmt, text if fmt is MessageDefinitionFormat.MSG else "")
    return Connection(cid, topic, name, msgdef, "", 0, ConnectionExtRosbag2(encoding, []), owner)
