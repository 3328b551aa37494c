"""The ROS pipeline under load: sim robot (30 Hz cameras) -> policy node -> commands at 50 Hz.

    .venv/bin/python bench/ros_pipeline.py [--presets tiny small] [--modes latest linear ensemble]
                                           [--seconds 15] [--out FILE]

For each preset and blending mode, starts `omni-ros node sim` and `omni-ros
node policy` as separate processes and listens here over DDS (loopback,
its own domain). Reports, as JSON: observation stamp -> ActionChunk arrival
latency p50/p95, achieved command rate and its error against the target, tick
jitter p50/p95 (deviation of command stamps from the nominal period), and the
largest command jump (max per-joint change between consecutive commands),
which is where chunk boundaries would show.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from common import emit, listen, stop

ROOT = Path(__file__).resolve().parent.parent


def pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 3) if values else float("nan")


def run_case(preset: str, mode: str, seconds: float, warmup: float, policy: str | None = None) -> dict:
    """One sim + policy node pair; `policy` replaces the `policy:` section (YAML flow mapping) when given."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from trajectory_msgs.msg import JointTrajectory

    from omni_ros.msg import ActionChunk

    policy = policy or f"{{preset: {preset}, num_threads: 1}}"
    config = f"""
name: bench
policy: {policy}
robot: {{joint_names: [joint_1, joint_2, joint_3], control_rate_hz: 50.0, dry_run: false}}
control: {{blending: {mode}}}
sim: {{camera_rate_hz: 30.0, auto_reset_s: 0.0}}
"""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.yaml"
        path.write_text(config)
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "omni_ros.cli", "node", name, "--config", str(path)],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for name in ("sim", "policy")
        ]
        context = rclpy.Context()
        rclpy.init(context=context)
        node = rclpy.create_node("bench_listener", context=context)
        now = lambda: node.get_clock().now().nanoseconds * 1e-9  # noqa: E731
        chunks: list[tuple[float, float, float]] = []
        commands: list[tuple[float, np.ndarray]] = []
        node.create_subscription(
            ActionChunk,
            "/omni_ros/action_chunk",
            lambda m: chunks.append((m.header.stamp.sec + m.header.stamp.nanosec * 1e-9, now(), m.inference_time)),
            50,
        )
        node.create_subscription(
            JointTrajectory,
            "/arm_controller/joint_trajectory",
            lambda m: commands.append(
                (m.header.stamp.sec + m.header.stamp.nanosec * 1e-9, np.array(m.points[0].positions))
            ),
            200,
        )
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        try:
            listen(executor, lambda: bool(commands), [chunks, commands], warmup, seconds)
        finally:
            stop(executor, node, context, procs)

    latency = [(arrive - stamp) * 1e3 for stamp, arrive, _ in chunks]
    stamps = np.array([t for t, _ in commands])
    period = 1.0 / 50.0
    intervals = np.diff(stamps) if len(stamps) > 1 else np.array([])
    jitter = np.abs(intervals - period) * 1e3
    positions = np.array([q for _, q in commands]) if commands else np.zeros((0, 3))
    jumps = np.abs(np.diff(positions, axis=0)).max(axis=1) if len(positions) > 1 else np.array([0.0])
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return {
        "chunks": len(chunks),
        "inference_ms_p50": pct([c[2] * 1e3 for c in chunks], 50),
        "obs_to_chunk_ms_p50": pct(latency, 50),
        "obs_to_chunk_ms_p95": pct(latency, 95),
        "commands": len(commands),
        "command_rate_hz": round(float(rate), 3),
        "command_rate_error_pct": round(float(abs(rate - 50.0) / 50.0 * 100), 3),
        "tick_jitter_ms_p50": pct(list(jitter), 50),
        "tick_jitter_ms_p95": pct(list(jitter), 95),
        "max_command_jump_rad": round(float(jumps.max()), 5),
        "p99_command_jump_rad": round(float(np.percentile(jumps, 99)), 5),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--modes", nargs="+", default=["latest", "linear", "ensemble"])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--out")
    args = parser.parse_args()
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    os.environ.setdefault("ROS_DOMAIN_ID", str(150 + os.getpid() % 50))
    report: dict = {"benchmark": "ros_pipeline", "control_rate_hz": 50.0, "camera_rate_hz": 30.0, "cases": {}}
    for preset in args.presets:
        for mode in args.modes:
            print(f"[bench] {preset} / {mode} ...", file=sys.stderr, flush=True)
            report["cases"][f"{preset}/{mode}"] = run_case(preset, mode, args.seconds, args.warmup)
    small = [v for k, v in report["cases"].items() if k.startswith("small/")]
    if small:
        report["targets"] = {
            "small_rate_within_2pct": all(c["command_rate_error_pct"] <= 2.0 for c in small),
            "small_jitter_p95_under_5ms": all(c["tick_jitter_ms_p95"] < 5.0 for c in small),
        }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
