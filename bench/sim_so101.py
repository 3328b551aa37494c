"""The MuJoCo SO-101 simulator: step + render rates per camera size, and the live ROS 2 stack driving it.

    .venv/bin/python bench/sim_so101.py [--sizes 48 96 160 224] [--seconds 30] [--out FILE]
                                        [--skip-offline] [--skip-live] [--modes processes one-process]

Offline (no ROS), side by side in this run, per camera size: median ms of one physics step
(`physics_dt`), of 20 ms of simulated time, and of rendering both cameras; the rates these allow.

Live (`--modes`): the stack of `omni-ros up --sim so101` with the shipped checkpoint, either one
process per node (`omni-ros node sim` + `omni-ros node policy`) or everything in one process
(`omni-ros up --sim so101`), listened to here over DDS (loopback, its own domain). Reports the
achieved command rate and its error against 50 Hz, per-camera image rates against the configured
camera rate, the JointState rate, chunk latency, and the episodes the policy completed meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from common import cpu_seconds, emit, listen, median_ms, ros_listener, stop

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config" / "sim_so101.yaml"


def offline(sizes: list[int]) -> dict:
    import dataclasses

    from omni_ros.config import load_config
    from omni_ros.sim.engines import make_env

    sim = load_config(CONFIG).sim
    out = {}
    for size in sizes:
        env = make_env(dataclasses.replace(sim, image_width=size, image_height=size))
        env.reset(0)
        env.command(env.positions + 0.3)  # moving, so the physics has work to do
        render = median_ms(env.render, 60, warmup=3)
        cpu = time.process_time()
        for _ in range(60):
            env.render()
        render_cpu = (time.process_time() - cpu) / 60 * 1e3  # all threads (llvmpipe rasterizes on several)
        step = median_ms(lambda e=env: e.step(0.02), 60, warmup=3)
        physics = median_ms(lambda e=env: e.step(sim.so101.physics_dt), 300, warmup=10)
        out[str(size)] = {
            "render_both_cameras_ms": render,
            "render_both_cameras_cpu_ms": round(render_cpu, 3),
            "render_fps_both_cameras": round(1e3 / render, 1),
            "physics_step_ms": physics,
            "physics_steps_per_s": round(1e3 / physics),
            "step_20ms_sim_ms": step,
            "real_time_factor": round(20.0 / step, 1),
        }
        env.close()
        print(f"[bench] {size}px: {out[str(size)]}", file=sys.stderr, flush=True)
    return out


def live(mode: str, seconds: float, warmup: float) -> dict:
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import String
    from trajectory_msgs.msg import JointTrajectory

    from omni_ros.config import load_config
    from omni_ros.msg import ActionChunk

    data = yaml.safe_load(CONFIG.read_text())
    data["policy"] = {"checkpoint": str((CONFIG.parent / data["policy"]["checkpoint"]).resolve()), "num_threads": 1}
    data["sim"]["seed"] = 3_000_000
    camera_rate = float(data["sim"]["camera_rate_hz"])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench_so101.yaml"
        path.write_text(yaml.safe_dump(data))
        cli = [sys.executable, "-m", "omni_ros.cli"]
        if mode == "processes":
            cmds = [[*cli, "node", "sim", "--config", str(path)], [*cli, "node", "policy", "--config", str(path)]]
            cmds[1].append("--sim")
        else:
            cmds = [[*cli, "up", "--sim", "so101", "--config", str(path)]]
        procs = [subprocess.Popen(c, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for c in cmds]
        context, node, now, stamp = ros_listener("bench_so101_listener")
        commands: list[float] = []
        chunks: list[tuple[float, float]] = []
        states: list[float] = []
        images: dict[str, list[float]] = {c: [] for c in data["sim"]["cameras"]}
        episodes: dict[int, dict] = {}
        topic = load_config(path).control.command_topic
        node.create_subscription(JointTrajectory, topic, lambda m: commands.append(stamp(m)), 200)
        node.create_subscription(ActionChunk, "/omni_ros/action_chunk", lambda m: chunks.append((stamp(m), now())), 50)
        sensor = qos_profile_sensor_data
        node.create_subscription(JointState, "/joint_states", lambda m: states.append(stamp(m)), sensor)
        for cam in images:
            node.create_subscription(
                Image, f"/camera/{cam}/image_raw", lambda m, c=cam: images[c].append(stamp(m)), sensor
            )
        latched = QoSProfile(
            depth=5, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL
        )

        def on_episode(msg: String) -> None:
            ep = json.loads(msg.data)
            episodes[ep["seed"]] = ep

        node.create_subscription(String, "/sim/episode", on_episode, latched)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        try:
            cpu_before: list[float] = []

            listen(
                executor,
                lambda: bool(commands),
                [commands, chunks, states, *images.values()],
                warmup,
                seconds,
                on_measure=lambda: cpu_before.extend(cpu_seconds(p.pid) for p in procs),
            )
            cpu_used = [cpu_seconds(p.pid) - before for p, before in zip(procs, cpu_before, strict=True)]
        finally:
            stop(executor, node, context, procs)

    def rate(stamps: list[float]) -> float:
        return round((len(stamps) - 1) / (stamps[-1] - stamps[0]), 3) if len(stamps) > 1 else 0.0

    command_rate = rate(commands)
    intervals = np.diff(commands) * 1e3 if len(commands) > 1 else np.zeros(1)
    latency = [(arrive - s) * 1e3 for s, arrive in chunks]
    done = [e for e in episodes.values() if e.get("success") or e.get("time", 0) >= data["sim"]["episode_time_s"] - 0.1]
    names = ["sim", "policy"] if mode == "processes" else ["all nodes"]
    return {
        "cpu_percent_of_one_core": {n: round(100 * c / seconds, 1) for n, c in zip(names, cpu_used, strict=True)},
        "command_rate_hz": command_rate,
        "command_rate_error_pct": round(abs(command_rate - 50.0) / 50.0 * 100, 3),
        "command_interval_ms_p50": round(float(np.percentile(intervals, 50)), 3),
        "command_interval_ms_p99": round(float(np.percentile(intervals, 99)), 3),
        "camera_rate_hz": {c: rate(s) for c, s in images.items()},
        "camera_rate_configured_hz": camera_rate,
        "joint_state_rate_hz": rate(states),
        "chunks": len(chunks),
        "obs_to_chunk_ms_p50": round(float(np.percentile(latency, 50)), 1) if latency else None,
        "episodes_seen": len(episodes),
        "episodes_succeeded": sum(bool(e.get("success")) for e in episodes.values()),
        "episodes_ended": len(done),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=int, default=[48, 96, 160, 224])
    modes = ["processes", "one-process"]
    parser.add_argument("--modes", nargs="+", default=modes, choices=modes)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--skip-offline", action="store_true")
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    os.environ.setdefault("ROS_DOMAIN_ID", str(150 + os.getpid() % 50))
    from omni_ros.sim.so101.gl import select_gl_backend

    report: dict = {
        "benchmark": "sim_so101",
        "gl_backend": select_gl_backend(),
        "cpus": os.cpu_count(),
        "load_average_1min_at_start": round(os.getloadavg()[0], 2),
    }
    if not args.skip_offline:
        report["offline"] = offline(args.sizes)
    if not args.skip_live:
        report["live"] = {}
        for mode in args.modes:
            print(f"[bench] live, {mode} ...", file=sys.stderr, flush=True)
            report["live"][mode] = live(mode, args.seconds, args.warmup)
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
