"""What the benchmarks share: the median timing loop, and the one way each hands over its result (JSON on
stdout, and in --out when given)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

# Importing omni_ros puts torch's thread settings (OMP_WAIT_POLICY) in place before anything loads torch, in this
# process and the workers it starts (omni_ros/cpu_threads.py); benchmarks measure what the product runs.
import omni_ros  # noqa: F401


def _cpu_times() -> list[int] | None:
    """The aggregate `cpu` line of /proc/stat (user, nice, system, idle, iowait, irq, softirq, steal, ...)."""
    try:
        return [int(x) for x in Path("/proc/stat").read_text(encoding="utf-8").splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None


# The counters when the benchmark process started: `cpu_facts` reports the share of CPU time the hypervisor took
# (steal) since then. On a shared VM a second vCPU can be half stolen, and then 2 threads run slower than 1.
_START_TIMES = _cpu_times()


def steal_share() -> float | None:
    """Share of this machine's CPU time stolen by the hypervisor since this process started (None: unknown)."""
    now = _cpu_times()
    if _START_TIMES is None or now is None or len(now) < 8:
        return None
    delta = [b - a for a, b in zip(_START_TIMES, now, strict=False)]
    total = sum(delta[:8])
    return round(delta[7] / total, 3) if total > 0 else None


def emit(report: dict[str, Any], out: str | None) -> None:
    """Print `report` (and write it to `out`), with the command that made it and the CPU it ran on (unless the
    report says so already): a result file says how to make it again."""
    import shlex
    import sys

    report.setdefault("command", shlex.join([f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]]))
    report.setdefault("cpu", cpu_facts())
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        Path(out).write_text(text + "\n", encoding="utf-8")


def cpu_facts() -> dict[str, Any]:
    """The CPU a result was measured on: model, cores, the vector / int8 dot-product extensions it has, load."""
    import os
    import platform

    facts: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        info = ""
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            facts["model"] = value.strip()
        elif key.strip() in ("flags", "Features"):
            flags = set(value.split())
            wanted = (
                "avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16",
                "amx_bf16", "amx_int8", "asimddp", "i8mm", "bf16",
            )  # fmt: skip
            facts["extensions"] = [f for f in wanted if f in flags]
            facts["flags"] = sorted(flags)
            break
    facts["load_average"] = [round(x, 2) for x in os.getloadavg()]
    facts["steal_share_since_start"] = steal_share()
    from omni_ros import cpu_threads

    facts["omp_wait_policy"] = cpu_threads.current().wait_policy  # how torch's idle workers wait in this run
    # Whether idle cores poll while inferring, and why (omni_ros/cpu_idle.py).
    facts["cpu_idle_poll"] = cpu_threads.current().idle_poll.describe()
    try:  # what `policy.precision: auto` picks on this CPU, and why
        from omni_ros.backends.stage_program import auto_program_refusal
        from omni_ros.cpu_features import detect
        from omni_ros.policy.precision import choose

        choice = choose("auto")
        facts["precision_auto"] = choice.describe()
        if choice.kernel == "xnnpack" and auto_program_refusal("pi0", detect(), {}) is None:
            # A pi0 / pi0.5 / SmolVLA checkpoint folder gets the int8 program (omni_ros/backends/stage_program.py).
            facts["precision_auto"] = replace(choice, kernel="program").describe() + " (checkpoint folders)"
    except ImportError:
        pass
    return facts


def timings_ms(fn: Callable[[], object], runs: int, warmup: int = 1) -> list[float]:
    """Wall times of `fn` in milliseconds over `runs` calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def median_ms(fn: Callable[[], object], runs: int, warmup: int = 1) -> float:
    return round(statistics.median(timings_ms(fn, runs, warmup)), 3)


class SpawnedServer:
    """`target(*args, pipe, stop)` in a spawned process: it sends its port on `pipe` once it serves, and
    returns when `stop` is set. `with SpawnedServer(main, ...) as url:` is the server's ws:// URL."""

    def __init__(self, target: Callable[..., None], *args: Any, start_timeout_s: float = 600.0) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._parent, child = ctx.Pipe()
        self._stop = ctx.Event()
        self._timeout = start_timeout_s
        self._proc = ctx.Process(target=target, args=(*args, child, self._stop), daemon=True)

    def __enter__(self) -> str:
        self._proc.start()
        if not self._parent.poll(self._timeout):
            raise RuntimeError("benchmark server did not start")
        return f"ws://127.0.0.1:{self._parent.recv()}"

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._proc.join(30)
        if self._proc.is_alive():
            self._proc.kill()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of a process (all its threads) and of its live child processes (the policy
    node's program process, omni_ros/backends/program_process.py), from /proc."""
    import os

    def own(stat: Path) -> tuple[int, float]:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    total = own(Path(f"/proc/{pid}/stat"))[1]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent, seconds = own(stat)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if parent == pid:
            total += seconds
    return total


def listen(
    executor: Any,
    started: Callable[[], bool],
    series: list[list],
    warmup: float,
    seconds: float,
    on_measure: Callable[[], object] | None = None,
    start_timeout: float = 120.0,
) -> None:
    """Spin `executor` until `started()` (at most `start_timeout` s), `warmup` s more, then clear `series` and
    record for `seconds`: what the callbacks append meanwhile is the steady state. `on_measure` runs as recording
    starts."""
    deadline = time.monotonic() + start_timeout
    while time.monotonic() < deadline and not started():
        executor.spin_once(timeout_sec=0.05)
    measure_from = time.monotonic() + warmup
    while time.monotonic() < measure_from:
        executor.spin_once(timeout_sec=0.05)
    for values in series:
        values.clear()
    if on_measure is not None:
        on_measure()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        executor.spin_once(timeout_sec=0.02)


def stop(executor: Any, node: Any, context: Any, procs: list) -> None:
    """Tear down a listener and the node processes it listened to."""
    executor.shutdown()
    node.destroy_node()
    context.try_shutdown()
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=30)


def add_precision_args(parser: Any) -> None:
    """`--precisions` (the eager rows besides fp32) and the workers' hidden `--precision`."""
    parser.add_argument(
        "--precisions",
        nargs="*",
        default=["bf16", "int8"],
        help="eager rows at these policy.precision values besides fp32 (no export; default bf16 int8)",
    )
    parser.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)


def add_worker_args(parser: Any) -> None:
    """The hidden arguments of a benchmark that runs each row in a fresh process of itself: `--worker` (this
    process is one row) and the row's `--precision`."""
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)


def ros_listener(name: str) -> tuple[Any, Any, Callable[[], float], Callable[[Any], float]]:
    """A node on a context of its own: (context, node, now() in s, stamp(msg) in s)."""
    import rclpy

    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node(name, context=context)

    def now() -> float:
        return node.get_clock().now().nanoseconds * 1e-9

    def stamp(msg: Any) -> float:
        return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9

    return context, node, now, stamp
