"""Simulated robot and chunk executor: rendering cost, tick cost, and command jumps at chunk boundaries.

    .venv/bin/python bench/sim_control.py [--episodes 50] [--latency 0.15]

Prints one JSON object:
- render_ms / env_step_ms / executor_tick_us: medians measured side by side in this run;
- per blending mode, closed-loop with the scripted expert and simulated inference latency (no velocity
  limit, so the blending alone is measured): success rate, mean time to success, the largest per-joint
  command step (max and 99th percentile over all ticks after the second chunk arrived: the start-up fade
  from rest is excluded, every later chunk boundary is included);
  once with the expert's own chunks and once with a random constant offset added to each chunk, the way
  consecutive chunks of a learned policy disagree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from omni_ros.control.config import ControlConfig
from omni_ros.control.executor import ActionChunkExecutor
from omni_ros.sim.config import SimConfig
from omni_ros.sim.env import SimEnv
from omni_ros.sim.expert import ReachExpert


def median_time(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def costs() -> dict:
    env = SimEnv(SimConfig())
    env.reset(0)
    out = {}
    for cam in env.renderer.cameras:
        out[f"render_{cam}_ms"] = round(
            median_time(lambda c=cam: env.renderer.render(c, env.scene, env.arm), 300) * 1e3, 3
        )
    out["env_step_20ms_ms"] = round(median_time(lambda: env.step(0.02), 300) * 1e3, 3)
    frame = env.render()["base"]
    out["frame_tobytes_ms"] = round(median_time(frame.tobytes, 300) * 1e3, 4)
    executor = ActionChunkExecutor(3, ControlConfig(blending="ensemble"), 50.0)
    executor.observe_position(env.arm.q)
    chunk = np.tile(env.arm.q, (50, 1))
    for k in range(3):
        executor.add_chunk(chunk, k * 0.3, 0.02, k * 0.3 + 0.1)
    ticks = iter(np.arange(0.7, 0.9, 0.0001))
    out["executor_tick_ensemble_us"] = round(median_time(lambda: executor.tick(float(next(ticks))), 2000) * 1e6, 1)
    return out


def boundary_jumps(mode: str, episodes: int, latency: float, disagreement: float) -> dict:
    env = SimEnv(SimConfig())
    expert = ReachExpert(env.arm, env.home)
    control = ControlConfig(blending=mode, max_velocity=[])
    rate, period = 50.0, 0.02
    steps, times, successes = [], [], 0
    for seed in range(episodes):
        env.reset(seed)
        target = env.scene.block(env.task.target).xy
        executor = ActionChunkExecutor(3, control, rate)
        rng = np.random.default_rng(seed)
        pending, arrivals, prev = None, [], None
        while not env.done and env.succeeded_at is None:
            now = env.time
            executor.observe_position(env.arm.q)
            if pending is not None and pending[0] <= now + 1e-9:
                executor.add_chunk(pending[2], pending[1], 0.02, now)
                arrivals.append(now)
                pending = None
            if executor.should_request(now):
                executor.request_started(now)
                # A learned policy's consecutive chunks disagree: model it as a constant offset per chunk.
                offset = rng.normal(0.0, disagreement, 3) if disagreement > 0 else 0.0
                pending = (now + latency, now, expert.chunk(env.arm.q, target) + offset)
            cmd = executor.tick(now)
            if cmd.publish:
                if prev is not None and len(arrivals) >= 2:
                    steps.append(float(np.max(np.abs(cmd.positions - prev))))
                prev = cmd.positions
                env.command(cmd.positions)
            env.step(period)
        if env.succeeded_at is not None:
            successes += 1
            times.append(env.succeeded_at)
    return {
        "success_rate": successes / episodes,
        "mean_time_to_success_s": round(float(np.mean(times)), 3) if times else None,
        "max_step": round(max(steps), 4),
        "p99_step": round(float(np.percentile(steps, 99)), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--latency", type=float, default=0.15, help="simulated inference latency, seconds")
    parser.add_argument("--disagreement", type=float, default=0.05, help="std of a per-chunk offset, radians")
    args = parser.parse_args()
    result = {"costs": costs(), "latency_s": args.latency, "episodes": args.episodes}
    for name, noise in (("expert", 0.0), (f"expert+{args.disagreement}rad_chunk_offsets", args.disagreement)):
        result[name] = {
            m: boundary_jumps(m, args.episodes, args.latency, noise) for m in ("latest", "linear", "ensemble")
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
