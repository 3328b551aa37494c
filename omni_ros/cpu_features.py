"""What this CPU can do natively, read from /proc/cpuinfo (no torch import).

Two questions decide how fast a policy's GEMMs can run on a CPU, and both are answered by instruction-set flags:

- an int8 dot product (x86: AVX512_VNNI, AVX_VNNI, AMX_INT8; Arm: the dotprod extension `asimddp`, i8mm):
  without one, an int8 GEMM multiplies at the rate of float FMAs and is no faster than float32 (measured on an
  AVX2-only EPYC: 1.05x at best, DESIGN.md section 11);
- native bfloat16 (x86: AVX512_BF16, AMX_BF16; Arm: BF16): elsewhere torch emulates bf16 arithmetic, and a
  2048x2048 matmul that takes milliseconds in float32 takes minutes.

AMX (Sapphire Rapids and later) multiplies whole tiles: oneDNN's bf16 GEMMs ran 7.5x its float32 ones on such a
Xeon (bench/gemm_kernels.py), faster than any int8 kernel once the activations are quantized, so the two are told
apart (`CpuFeatures.amx_bf16`). `omni_ros.policy.precision` turns these facts into `policy.precision: auto`.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# Flags to believe instead of /proc/cpuinfo's (comma- or space-separated; empty: none): reproduces the choices
# of another machine (`OMNI_ROS_CPU_FLAGS=avx2,avx512_vnni omni-ros policy info`), and keeps the test suite's
# `precision: auto` the same on every CI machine. Kernels still run on the real CPU.
FLAGS_ENV = "OMNI_ROS_CPU_FLAGS"

# The flags /proc/cpuinfo lists for native bf16 compute, per architecture, and how to name what is missing.
BF16_FLAGS = {
    "x86_64": (("amx_bf16", "avx512_bf16"), "AVX512_BF16 or AMX_BF16"),
    "aarch64": (("bf16",), "BF16 (Armv8.6)"),
}
# The flags for an int8 dot product, per architecture, most capable first.
INT8_DOT_FLAGS = {
    "x86_64": (("amx_int8", "avx512_vnni", "avx_vnni"), "AVX512_VNNI, AVX_VNNI or AMX_INT8"),
    "aarch64": (("i8mm", "asimddp"), "the dot-product extension (asimddp) or I8MM"),
}


def _arch(machine: str | None = None) -> str:
    machine = (machine or platform.machine()).lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU's architecture, model name and the feature flags that choose a GEMM kernel."""

    arch: str
    model: str
    flags: frozenset[str] | None  # None: unreadable (another OS): nothing is assumed missing

    def _found(self, table: dict[str, tuple[tuple[str, ...], str]]) -> tuple[str, ...]:
        if self.flags is None or self.arch not in table:
            return ()
        return tuple(flag for flag in table[self.arch][0] if flag in self.flags)

    @property
    def int8_dot(self) -> tuple[str, ...]:
        """The int8 dot-product flags this CPU has, most capable first (empty: none)."""
        return self._found(INT8_DOT_FLAGS)

    @property
    def bf16(self) -> tuple[str, ...]:
        """The native bfloat16 flags this CPU has, most capable first (empty: none)."""
        return self._found(BF16_FLAGS)

    @property
    def amx_bf16(self) -> bool:
        return "amx_bf16" in self.bf16

    @property
    def amd(self) -> bool:
        """An AMD CPU (by its model name): where some of oneDNN's kernels measured slower than another's (the
        int8 linear, the packed single-row product); those choices read this."""
        return "AMD" in self.model

    @property
    def known(self) -> bool:
        """Whether the flags could be read and the architecture is one we have tables for."""
        return self.flags is not None and self.arch in BF16_FLAGS

    def missing(self, kind: str) -> str | None:
        """What `kind` ("int8" or "bf16") needs and this CPU lacks, or None (it has it, or we cannot tell)."""
        table = INT8_DOT_FLAGS if kind == "int8" else BF16_FLAGS
        if not self.known:
            return None
        return None if self._found(table) else table[self.arch][1]

    def key(self) -> str:
        """A short stable identity of what kernels can run here (for caches built for this CPU)."""
        relevant = sorted(set(self.int8_dot) | set(self.bf16) | ({"avx512f"} & (self.flags or frozenset())))
        return f"{self.arch}|{self.model}|{','.join(relevant)}"


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


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The first CPU's model name ("model name" on x86, "CPU part" on Arm), or the platform's processor string."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("model name", "cpu part"):
            return value.strip()
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def _this_cpu() -> CpuFeatures:
    override = os.environ.get(FLAGS_ENV)
    if override is not None:
        flags = frozenset(override.replace(",", " ").split())
        return CpuFeatures(_arch(), f"{cpu_model()} (flags from ${FLAGS_ENV})", flags)
    return hardware()


def detect() -> CpuFeatures:
    """This machine's CPU features (read once per process; tests replace this function to pretend a CPU)."""
    return _this_cpu()


@functools.lru_cache(maxsize=1)
def hardware() -> CpuFeatures:
    """The CPU the kernels run on, from /proc/cpuinfo whatever $OMNI_ROS_CPU_FLAGS says: what a kernel whose
    numbers (not only its speed) depend on an instruction asks. `detect()` says what to choose; this, what the
    chosen kernel can compute correctly here (oneDNN's int8 product without an int8 dot product saturates)."""
    return CpuFeatures(_arch(), cpu_model(), cpu_flags())


def missing_bf16_feature(flags: Iterable[str] | None = None, machine: str | None = None) -> str | None:
    """The CPU feature native bfloat16 needs and this CPU lacks, or None (it has one, or we cannot tell).

    `flags` / `machine` default to this machine's; "cannot tell" (another OS, an architecture not listed)
    never blocks bfloat16.
    """
    if flags is None and machine is None:
        return detect().missing("bf16")
    found = cpu_flags() if flags is None else frozenset(flags)
    return CpuFeatures(_arch(machine), "", found).missing("bf16")
