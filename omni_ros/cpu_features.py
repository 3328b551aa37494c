"""What this CPU can do natively, read from /proc/cpuinfo (no torch import).

bfloat16 matmuls are fast on a CPU only where oneDNN has bf16 instructions to run them with: AVX512_BF16 or
AMX_BF16 on x86, the Armv8.6 BF16 extension on Arm. Elsewhere torch emulates bf16 arithmetic, and a 2048x2048
matmul that takes milliseconds in float32 takes minutes (measured on an AVX2-only EPYC, DESIGN.md section 11),
so `policy.dtype: bfloat16` falls back to float32 there (omni_ros.backends.factory).
"""

from __future__ import annotations

import platform
from collections.abc import Iterable
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")

# The flags /proc/cpuinfo lists for native bf16 compute, per architecture, and how to name what is missing.
BF16_FLAGS = {
    "x86_64": (("avx512_bf16", "amx_bf16"), "AVX512_BF16 or AMX_BF16"),
    "aarch64": (("bf16",), "BF16 (Armv8.6)"),
}


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str] | None:
    """The feature flags of the first CPU ("flags" on x86, "Features" on Arm), or None when unreadable."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return frozenset(value.split())
    return None


def missing_bf16_feature(flags: Iterable[str] | None = None, machine: str | None = None) -> str | None:
    """The CPU feature native bfloat16 needs and this CPU lacks, or None (it has one, or we cannot tell).

    `flags` / `machine` default to this machine's; "cannot tell" (another OS, an architecture not listed)
    never blocks bfloat16.
    """
    machine = (machine or platform.machine()).lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    if machine not in BF16_FLAGS:
        return None
    found = cpu_flags() if flags is None else frozenset(flags)
    if found is None:
        return None
    needed, name = BF16_FLAGS[machine]
    return None if any(flag in found for flag in needed) else name
