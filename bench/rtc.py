"""Real-time chunking against blending, closed loop in the simulator with the shipped demo policy.

    nice -n 10 .venv/bin/python bench/rtc.py [--episodes 50] [--latencies 0.1 0.2 0.3 0.4] [--out FILE]
    nice -n 5 .venv/bin/python bench/rtc.py --sweep --latencies 0.3 --episodes 8 \
        --schedules exp linear ones --betas 5 10 --fades 0 0.15 0.2 --out bench/results/rtc_sweep.json

For each injected inference latency and each way a new chunk takes over (latest, linear, ensemble, rtc
guided, rtc hard inpainting), the same held-out episodes run through the real `ActionChunkExecutor`
(`omni_ros.sim.rollout.run_episode`, simulated time, the policy's chunks arriving `latency` s after their
observation). Everything else is the same for every mode: the policy and its seeded noise, prefetch
threshold, blend window, no velocity clamp (so the blending alone is measured, as bench/sim_control.py does).

Per mode and latency:
- boundary jump: at every chunk arrival after the first, the largest per-joint deviation of a command from
  the constant-velocity continuation of the two before it, |q_k - 2 q_{k-1} + q_{k-2}|, over the ticks from
  the arrival to the end of the blend window (the seam a robot feels; a smooth motion gives ~0). p50 / p95 /
  max over all boundaries of all episodes, radians;
- jerk: RMS of the commands' third difference / tick^3 over every tick after the first blend (rad/s^3);
- success rate and mean time to success;
- for rtc: how far the new chunk's first d actions are from the plan they continue (p95, rad).
With --sweep, the RTC settings instead: at each latency the blendings once, then rtc guided for every
schedule x beta x fade x delay given (and inpainting for every fade x delay), each against the best blending.
Otherwise, the cost of guidance: plain / guided / inpainting inference timed side by side on the same recorded
(observation, RTC request) pairs, one thread, medians.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import emit, timings_ms

import omni_ros.policy
from omni_ros.control.config import ControlConfig, RtcConfig
from omni_ros.control.executor import ActionChunkExecutor, Command
from omni_ros.policy.pipeline import InferencePipeline
from omni_ros.policy.rtc import SCHEDULES, RtcRequest
from omni_ros.sim.config import SimConfig
from omni_ros.sim.env import SimEnv
from omni_ros.sim.evaluate import HELD_OUT_SEED
from omni_ros.sim.rollout import run_episode

ROOT = Path(__file__).resolve().parents[1]
MODES = ("latest", "linear", "ensemble", "rtc-guided", "rtc-inpaint")


def control_for(mode: str, base: ControlConfig) -> ControlConfig:
    if mode == "rtc-guided":
        return dataclasses.replace(base, blending="rtc", rtc=dataclasses.replace(base.rtc, method="guided"))
    if mode == "rtc-inpaint":
        return dataclasses.replace(base, blending="rtc", rtc=dataclasses.replace(base.rtc, method="inpaint"))
    return dataclasses.replace(base, blending=mode)


class Recorder:
    """Commands and chunk arrivals of one episode (an `on_tick` callback), and what the policy was asked."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.positions: list[np.ndarray] = []
        self.arrivals: list[float] = []
        self._accepted = 0

    def __call__(self, now: float, command: Command, executor: ActionChunkExecutor) -> None:
        if executor.stats.chunks_accepted > self._accepted:
            self._accepted = executor.stats.chunks_accepted
            self.arrivals.append(now)
        if command.publish and command.positions is not None:
            self.times.append(now)
            self.positions.append(command.positions.copy())


def boundary_jumps(rec: Recorder, window: float, tick: float) -> list[float]:
    if len(rec.positions) < 3:
        return []
    q = np.asarray(rec.positions)
    t = np.asarray(rec.times)
    second = np.zeros(len(q))
    second[2:] = np.abs(q[2:] - 2 * q[1:-1] + q[:-2]).max(axis=1)
    jumps = []
    arrivals = rec.arrivals[1:]  # the first chunk fades in from rest: start-up, not a boundary
    for i, a in enumerate(arrivals):
        end = a + window + 2 * tick
        if i + 1 < len(arrivals):
            end = min(end, arrivals[i + 1] - 1e-9)
        sel = (t >= a - 1e-9) & (t <= end + 1e-9)
        sel[:2] = False
        if sel.any():
            jumps.append(float(second[sel].max()))
    return jumps


def jerk_samples(rec: Recorder, start: float, tick: float) -> np.ndarray:
    q = np.asarray(rec.positions)
    t = np.asarray(rec.times)
    if len(q) < 4:
        return np.zeros(0)
    third = (q[3:] - 3 * q[2:-1] + 3 * q[1:-2] - q[:-3]) / tick**3
    return third[t[3:] >= start].ravel()


def run_cell(
    policy: InferencePipeline, mode: str, latency: float, episodes: int, base: ControlConfig, record: list | None
) -> dict[str, Any]:
    env = SimEnv(SimConfig())
    control = control_for(mode, base)
    rate = 50.0
    tick = 1.0 / rate
    jumps: list[float] = []
    jerks: list[np.ndarray] = []
    prefix_errors: list[float] = []
    successes, times, inferences = 0, [], 0

    def chunk_policy(obs: dict, rtc: RtcRequest | None = None) -> np.ndarray:
        nonlocal inferences
        inferences += 1
        actions = (policy.infer(obs) if rtc is None else policy.infer(obs, rtc=rtc))["actions"]
        if rtc is not None:
            k = min(rtc.inference_delay, len(rtc.actions))
            if k:
                prefix_errors.append(float(np.abs(actions[:k] - rtc.actions[:k]).max()))
            if record is not None and len(record) < 40:
                record.append((obs, rtc))
        return actions

    for k in range(episodes):
        rec = Recorder()
        result = run_episode(
            env,
            chunk_policy,
            HELD_OUT_SEED + k,
            control=control,
            control_rate_hz=rate,
            chunk_dt=policy.metadata.action_dt,
            latency=latency,
            on_tick=rec,
        )
        window = max(control.blend_window_s, control.rtc.fade(control.blend_window_s)) + policy.metadata.action_dt
        jumps += boundary_jumps(rec, window, tick)
        if rec.arrivals:
            jerks.append(jerk_samples(rec, rec.arrivals[0] + control.blend_window_s + 3 * tick, tick))
        if result.success:
            successes += 1
            times.append(result.time_to_success)
    jerk = np.concatenate(jerks) if jerks else np.zeros(0)
    row: dict[str, Any] = {
        "success_rate": successes / episodes,
        "mean_time_to_success_s": round(float(np.mean(times)), 3) if times else None,
        "boundaries": len(jumps),
        "boundary_jump_p50_rad": _pct(jumps, 50),
        "boundary_jump_p95_rad": _pct(jumps, 95),
        "boundary_jump_max_rad": round(max(jumps), 5) if jumps else None,
        "jerk_rms_rad_s3": round(float(np.sqrt(np.mean(jerk**2))), 1) if jerk.size else None,
        "inferences": inferences,
    }
    if prefix_errors:
        row["prefix_error_p95_rad"] = _pct(prefix_errors, 95)
    return row


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 5) if values else None


def guidance_cost(policy: Any, pairs: list, repeats: int) -> dict[str, Any]:
    """Plain, guided and inpainting inference on the same (observation, request) pairs, interleaved."""
    samples: dict[str, list[float]] = {"plain": [], "guided": [], "inpaint": []}
    denoise: dict[str, list[float]] = {k: [] for k in samples}
    for obs, rtc in pairs:
        calls = {
            "plain": lambda o=obs: policy.infer(o),
            "guided": lambda o=obs, r=rtc: policy.infer(o, rtc=dataclasses.replace(r, method="guided")),
            "inpaint": lambda o=obs, r=rtc: policy.infer(o, rtc=dataclasses.replace(r, method="inpaint")),
        }
        for _ in range(repeats):
            for name, fn in calls.items():
                samples[name] += timings_ms(fn, 1, warmup=0)
                denoise[name].append(fn()["policy_timing"]["denoise_ms"])
    out: dict[str, Any] = {"pairs": len(pairs), "repeats": repeats}
    for name in samples:
        out[f"{name}_infer_ms_p50"] = round(statistics.median(samples[name]), 3)
        out[f"{name}_denoise_ms_p50"] = round(statistics.median(denoise[name]), 3)
    out["guided_over_plain_infer"] = round(out["guided_infer_ms_p50"] / out["plain_infer_ms_p50"], 2)
    out["guided_over_plain_denoise"] = round(out["guided_denoise_ms_p50"] / out["plain_denoise_ms_p50"], 2)
    out["inpaint_over_plain_infer"] = round(out["inpaint_infer_ms_p50"] / out["plain_infer_ms_p50"], 2)
    return out


def executorch_rtc(policy: InferencePipeline, pte: str, pairs: list, repeats: int, threads: int) -> dict[str, Any]:
    from omni_ros.backends.executorch_runner import load_pte

    program = load_pte(pte, num_threads=threads, num_steps=policy.num_steps)
    out: dict[str, Any] = {"pte": Path(pte).name, "rtc_methods": list(program.rtc_methods)}
    for method in program.rtc_methods:
        diffs = []
        for obs, rtc in pairs:
            request = dataclasses.replace(rtc, method=method)
            diffs.append(np.abs(program.infer(obs, rtc=request)["actions"] - policy.infer(obs, rtc=request)["actions"]))
        out[f"{method}_max_abs_vs_eager_rad"] = float(np.max(diffs))
    out |= guidance_cost(program, pairs, repeats) if "guided" in program.rtc_methods else {}
    return out


def sweep(policy: InferencePipeline, args: argparse.Namespace, base: ControlConfig) -> dict[str, Any]:
    """RTC's settings against the blendings, one latency at a time: {latency: {"blendings": ..., "rtc": [...]}}."""
    out: dict[str, Any] = {}
    fades = args.fades or [None]
    delays = args.delays or [None]
    for latency in args.latencies:
        blendings = {m: run_cell(policy, m, latency, args.episodes, base, None) for m in MODES[:3]}
        best = min(blendings, key=lambda m: blendings[m]["boundary_jump_p95_rad"])
        best_jump = blendings[best]["boundary_jump_p95_rad"]
        best_success = max(c["success_rate"] for c in blendings.values())
        _progress(latency, f"best blending {best}", blendings[best])
        cells = []
        betas = args.betas or [None]
        grid = [("guided", sc, b, f, d) for sc in args.schedules for b in betas for f in fades for d in delays]
        grid += [("inpaint", None, None, f, d) for f in fades for d in delays]
        for method, schedule, beta, fade, delay in grid:
            knobs = {"max_guidance_weight": beta, "switch_fade_s": fade, "inference_delay": delay}
            rtc = dataclasses.replace(base.rtc, schedule=schedule or base.rtc.schedule, **knobs)
            row = run_cell(policy, f"rtc-{method}", latency, args.episodes, dataclasses.replace(base, rtc=rtc), None)
            settings = {"method": method, "schedule": schedule, "beta": beta, "switch_fade_s": fade, "delay": delay}
            ratio = row["boundary_jump_p95_rad"] / best_jump
            met = ratio <= 0.5 and row["success_rate"] >= best_success
            cells.append(settings | {"jump_ratio": round(ratio, 3), "met": met} | row)
            _progress(latency, " ".join(f"{k}={v}" for k, v in settings.items()), row, f"ratio {ratio:.2f}")
        out[f"{latency:g}"] = {"blendings": blendings, "best_other": best, "rtc": cells}
    return out


def _progress(latency: float, label: str, row: dict[str, Any], extra: str = "") -> None:
    print(
        f"latency {latency:.1f} s {label}: success {row['success_rate']:.2f} jump p95 {row['boundary_jump_p95_rad']} "
        f"prefix {row.get('prefix_error_p95_rad')} {extra}",
        file=sys.stderr,
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=50, help="held-out episodes per mode and latency")
    parser.add_argument("--latencies", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.4], help="seconds")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--checkpoint", default=str(ROOT / "checkpoints" / "demo"))
    parser.add_argument("--prefetch", type=float, default=0.75, help="control.prefetch_threshold for every mode")
    parser.add_argument("--schedule", default=RtcConfig.schedule, choices=SCHEDULES)
    parser.add_argument("--beta", type=float, help="max guidance weight (default: the policy's step count)")
    parser.add_argument("--num-steps", type=int, help="denoising steps (default: the checkpoint's)")
    parser.add_argument("--rtc-fade", type=float, help="control.rtc.switch_fade_s (default: the blend window)")
    parser.add_argument("--sweep", action="store_true", help="sweep the RTC settings below instead of the table")
    parser.add_argument("--schedules", nargs="+", default=[RtcConfig.schedule], choices=SCHEDULES)
    parser.add_argument("--betas", type=float, nargs="+", help="--sweep: max guidance weights (default: step count)")
    parser.add_argument("--fades", type=float, nargs="+", help="--sweep: switch_fade_s values (default: blend window)")
    parser.add_argument("--delays", type=int, nargs="+", help="--sweep: fixed inference delays d (default: estimated)")
    parser.add_argument("--cost-repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--pte",
        help="an ExecuTorch program of the same checkpoint exported with --rtc: its guided and inpainting cost, "
        "and how far its chunks are from eager's, on the same recorded requests",
    )
    parser.add_argument("--out", help="also write the JSON here (e.g. bench/results/rtc.json)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    policy = omni_ros.policy.load(args.checkpoint, seed=0, num_steps=args.num_steps)
    base = ControlConfig(
        prefetch_threshold=args.prefetch,
        max_velocity=[],
        position_lower=[-2.9],
        position_upper=[2.9],
        rtc=RtcConfig(schedule=args.schedule, max_guidance_weight=args.beta, switch_fade_s=args.rtc_fade),
    )
    report: dict[str, Any] = {
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads},
        "policy": policy.metadata.model,
        "backend": policy.metadata.backend,
        "horizon": policy.metadata.action_horizon,
        "action_dt_s": policy.metadata.action_dt,
        "num_steps": policy.num_steps,
        "episodes": args.episodes,
        "control": {
            "prefetch_threshold": args.prefetch,
            "blend_window_s": base.blend_window_s,
            "rtc_schedule": args.schedule,
            "rtc_beta": args.beta if args.beta is not None else float(policy.num_steps),
            "rtc_switch_fade_s": base.rtc.fade(base.blend_window_s),
            "rtc_inference_delay": "ceil(max recent latency / action_dt)",
        },
        "results": {},
    }
    pairs: list = []
    start = time.monotonic()
    if args.sweep:
        del report["results"]
        report["sweep"] = sweep(policy, args, base)
        report["seconds"] = round(time.monotonic() - start, 1)
        emit(report, args.out)
        return
    for latency in args.latencies:
        cells = {}
        for mode in args.modes:
            t0 = time.monotonic()
            record = pairs if mode == "rtc-guided" and latency == args.latencies[-1] else None
            cells[mode] = run_cell(policy, mode, latency, args.episodes, base, record)
            row = cells[mode]
            print(
                f"latency {latency:.1f} s {mode:12s} success {row['success_rate']:.2f} "
                f"jump p95 {row['boundary_jump_p95_rad']} rad "
                f"jerk {row['jerk_rms_rad_s3']} prefix {row.get('prefix_error_p95_rad')} "
                f"({time.monotonic() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
        report["results"][f"{latency:g}"] = cells
    report["target_at_0.3s"] = target(report["results"].get("0.3"))
    if pairs and args.cost_repeats > 0:
        report["guidance_cost"] = guidance_cost(policy, pairs, args.cost_repeats)
    if pairs and args.pte:
        report["executorch"] = executorch_rtc(policy, args.pte, pairs, args.cost_repeats, args.threads)
    report["seconds"] = round(time.monotonic() - start, 1)
    emit(report, args.out)


def target(cells: dict[str, Any] | None) -> dict[str, Any] | None:
    """RTC's boundary jump p95 <= 0.5x the best of latest/linear/ensemble, with success not lower."""
    if not cells:
        return None
    others = {m: cells[m] for m in ("latest", "linear", "ensemble") if m in cells}
    if not others:
        return None
    best = min(others, key=lambda m: others[m]["boundary_jump_p95_rad"])
    best_success = max(c["success_rate"] for c in others.values())
    out: dict[str, Any] = {"best_other": best, "best_other_jump_p95_rad": others[best]["boundary_jump_p95_rad"]}
    for mode in ("rtc-guided", "rtc-inpaint"):
        if mode in cells:
            ratio = cells[mode]["boundary_jump_p95_rad"] / others[best]["boundary_jump_p95_rad"]
            ok = ratio <= 0.5 and cells[mode]["success_rate"] >= best_success
            not_lower = cells[mode]["success_rate"] >= best_success
            out[mode] = {"jump_ratio": round(ratio, 3), "success_not_lower": not_lower, "met": ok}
    return out


if __name__ == "__main__":
    main()
