"""Which TCP ports a set of processes listens on, read from /proc (Linux), for the loopback-only checks."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import NamedTuple

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


class Listener(NamedTuple):
    pid: int
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        address = ipaddress.ip_address(self.address)
        mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a v6 socket bound to 127.0.0.1
        return (mapped or address).is_loopback


def _hex_address(text: str, v6: bool) -> str:
    """/proc/net/tcp{,6} local_address: little-endian 32-bit words, hex."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.IPv6Address(words) if v6 else ipaddress.IPv4Address(words))


def _listening_inodes() -> dict[int, tuple[str, int]]:
    found = {}
    for name, v6 in (("tcp", False), ("tcp6", True)):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != _LISTEN:
                continue
            host, port = fields[1].split(":")
            found[int(fields[9])] = (_hex_address(host, v6), int(port, 16))
    return found


def listeners(pids: list[int]) -> list[Listener]:
    """Every TCP socket in LISTEN state that one of `pids` holds open."""
    inodes = _listening_inodes()
    result = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in inodes:
                    result.append(Listener(pid, *inodes[inode]))
    return result
