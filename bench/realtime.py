"""Does a policy run in real time on this CPU? Chunk inference time against the chunk's execution time, per
precision and thread count, and the live ROS 2 loop on the MuJoCo SO-101 with the executor watched for starving.

    .venv/bin/python bench/realtime.py [--checkpoint DIR] [--precisions fp32 bf16 int8] [--threads 1 2]
        [--runs 3] [--fps 30] [--live-seconds 120] [--live-precision auto] [--live-wait-policies passive brief]
        [--live-executors events single] [--compiled bf16 int8] [--live-compile off on] [--live-compiled]
        [--int8-kernel auto|onednn|xnnpack|program ...] [--offline-rtc-method guided|inpaint]
        [--live-int8-kernels xnnpack program] [--live-serve] [--live-idle-poll on off]
        [--live-resume off on] [--live-rtc-method inpaint] [--live-program-processes child inline]
        [--offline-beside-sim] [--gemm-floor smolvla] [--skip-live]
        [--lerobot-python /work/venv-lerobot/bin/python] [--work-dir DIR] [--out bench/results/realtime.json]

Without `--checkpoint`, the full-size SmolVLA of bench/smolvla.py (LeRobot 0.6.1's default config over
SmolVLM2-500M dimensions, random weights, built and saved by LeRobot itself: scripts/lerobot_bench.py in the
LeRobot venv) is made in the work dir once and used.

Offline, each contender in a fresh process, one after the other: `chunk_ms` (observation -> chunk, median of
--runs after 3 warm-up chunks) against `execution_ms` (the chunk's n_action_steps / --fps): `realtime` when the
chunk is computed faster than the previous one is executed, the least a robot needs not to stop between chunks.
`--compiled P ...` adds rows with `policy.compile` on (the vision tower, prefill and denoising step compiled by
TorchInductor; `first_chunk_s` includes the compilation), keyed `{precision}_compiled_{threads}_threads`.
`--offline-beside-sim` times each row a second time, in another fresh process, with the MuJoCo SO-101 node
(config/sim_so101.yaml) running beside it once it renders (`beside_sim`: the chunk, its stages, the simulator's
cores, `chunk_over_alone`): of what the live chunk costs over the offline one, the simulator's share, the rest
being the policy node's own loop and inputs. `--gemm-floor PRESET` times, after each row and in the same run, the
row's linears alone with its kernel at that bench/gemm_kernels.py preset's shapes (`smolvla` for the default
checkpoint), the vision stage on image threads as the product runs it (`gemm_floor`: the stages, one inference's
GEMMs, `chunk_over_floor`, `within_target` for 1.3x); an XNNPACK row is left out (its GEMMs need an export).

Live (`--live-seconds`, 0 or --skip-live to skip): `omni-ros node sim` (the SO-101 in MuJoCo, config/sim_so101.yaml)
and `omni-ros node policy` on the checkpoint, one process each, sharing this machine's cores, threads as
`policy.num_threads: 0` (auto) sets them, `control.blending: rtc`, `--live-precision`, the actions 1 / --fps s
apart (`policy.action_dt`). Listened to over DDS (loopback, its own domain): commands per second, the longest
interval between two commands, the cores each process kept busy (`cores_busy`: CPU seconds over wall seconds, of
the simulator and of the policy), and how often the executor ran out of actions: `motion`, its own counts over
the window from the node's diagnostics (`plan_ran_out`: times the plan's last action passed before the next chunk
came, `held_s`: seconds held so, `resumed_chunks`, ...; a new episode's reset and stops not counted), the seconds
the published commands repeated the one before exactly (`commanded_still_s`: the arm told to stand still, whatever
the executor calls it; with no plan, as at an episode's start, nothing is published), and
`timeline_replay`, the same replayed from the ActionChunk messages (stamp, horizon, dt; blind to the chunks the node
dropped, so only a cross-check); and the node's status detail while the robot held. With
`--live-wait-policies A B`, the live run is repeated once per `policy.omp_wait_policy` (`live` is A's,
`live_by_wait_policy` holds each); without it the node runs the product's default. `--live-executors A B` does the
same per rclpy executor of both nodes (`$OMNI_ROS_EXECUTOR`, omni_ros/ros_env.py; `live_by_executor`).
`--live-compile off on` repeats it per `policy.compile` (`live_by_compile`; a compiled policy's first chunk, the
compilation, comes before the measured window; `--live-compiled` compiles in every other live run),
`--live-resume off on` per `control.resume_where_held` (`live_by_resume`: whether a chunk arriving after the plan
ran out plays on from where the robot stopped or skips what fell due while it held), `--live-rtc-method` sets
`control.rtc.method` (default: the product's, guided; a compiled step serves inpainting only, guided RTC
differentiating through the eager one). Each live run also records the chunks the node refused, by reason
(`chunks_not_executed`, from its log), the states its status reported in the window (`status_states`), and the
compiled stages that served some call eager (`stages_run_eager`, from its log: empty, or the run's compiled figures
are partly the eager stage's).

`--int8-kernel` sets `policy.int8_kernel` for every row and the live run (`program`: the stages exported whole);
given several, each int8 row is run once per kernel (keyed `int8_{kernel}_{threads}_threads`) and the live run
takes the first, or one live run per `--live-int8-kernels` value (`live_by_int8_kernel`). `--offline-rtc-method`
times the offline chunks as a node under `control.blending: rtc` asks for them: each with a real-time-chunking
request continuing the previous chunk (inference delay 5 actions), the policy loaded for that method (`guided`:
an int8 program with its traced guided step; per linear, autograd through the int8 layers).

`--live-serve` runs the live policy in `omni-ros serve` on 127.0.0.1 (its own
process, the same config's policy section, keymap canonical) and the node as its remote client, the server's
cores reported beside the node's (`cores_busy`). In the node an exported program runs in a child process of the
node (`policy.program_process: auto`), whose cores count as the node's; `--live-program-processes child inline`
runs it once in that child and once in the node's own process, where ExecuTorch's hold on the GIL stalls the loop.
`--live-idle-poll on off` runs it once per `policy.cpu_idle_poll` (`live_by_idle_poll`: idle cores polling while the
policy infers, or halting; omni_ros/cpu_idle.py); the machine's default is in `machine.cpu_idle_poll`.

Offline rows only: `--skip-live`; the live runs only: `--precisions` with no value.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from common import add_worker_args, cpu_facts, cpu_seconds, emit, listen, ros_listener, stop

from omni_ros.cpu_threads import WAIT_POLICIES
from omni_ros.ros_env import EXECUTORS

ROOT = Path(__file__).resolve().parent.parent
SO101_JOINTS = 6  # config/sim_so101.yaml's arm: the bench's SmolVLA is built with these state / action dims
FOLDER = "smolvla_full"  # what scripts/lerobot_bench.py --policy smolvla writes
SIM_CONFIG = ROOT / "config" / "sim_so101.yaml"
WARMUP_CHUNKS = 3
# --offline-rtc-method: the inference delay (actions) of each timed request, about what a 2 vCPU robot sees.
RTC_DELAY = 5
NOT_EXECUTED = re.compile(r"chunk \d+ not executed: (.*)")  # the policy node's warning for a refused chunk
# omni_ros/policy/compiled_stages.py's warning when a compiled stage serves a call eager (once per stage).
EAGER_STAGE = re.compile(r"compiled ([a-z ]+): (?:a call differs|a call would need|compilation failed)")


def log(msg: str) -> None:
    print(f"[realtime] {msg}", file=sys.stderr, flush=True)


def observation(meta: Any, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    images = {c: rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for c in meta.camera_names}
    return {"images": images, "state": rng.normal(size=meta.state_dim).astype(np.float32), "prompt": "pick up the cube"}


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    # The product's loader of a checkpoint (the backend factory's): the int8 program kernel included.
    from omni_ros.backends.stage_program import load_checkpoint
    from omni_ros.policy.precision import stacked_linears

    def load(unstacked: bool) -> Any:
        stack = stacked_linears.stack_shared_input_linears
        if unstacked:
            # The A/B policy: every linear its own product, as before the precisions stacked those reading one tensor.
            stacked_linears.stack_shared_input_linears = lambda model, keep: 0
        try:
            return load_checkpoint(
                args.checkpoint,
                precision=args.precision,
                cpu_linear="packed",
                compile=args.compile,
                int8_kernel=args.int8_kernel[0],
                rtc_method=args.offline_rtc_method,
            )
        finally:
            stacked_linears.stack_shared_input_linears = stack

    start = time.perf_counter()
    policies = {"stacked": load(False)}
    load_s = time.perf_counter() - start
    if args.unstacked:
        policies["unstacked"] = load(True)
    policy = policies["stacked"]
    obs = observation(policy.metadata)
    previous = {name: p.infer(obs)["actions"] for name, p in policies.items()}

    def infer(name: str) -> dict[str, Any]:
        # Under RTC each chunk continues the one before it, as the executor asks (the guidance's backward pass
        # is the cost of `guided`).
        rtc = None
        if args.offline_rtc_method:
            from omni_ros.policy.rtc import RtcRequest

            plan = previous[name][RTC_DELAY:]
            rtc = RtcRequest(plan, inference_delay=RTC_DELAY, method=args.offline_rtc_method)
        out = policies[name].infer(obs, rtc=rtc)
        previous[name] = out["actions"]
        return out

    # A robot runs chunk after chunk: warm up until the runner has settled its choices (the denoising steps'
    # threads are timed over the first 26 steps, about three chunks), then time the steady state.
    start = time.perf_counter()
    infer("stacked")
    first_chunk_s = time.perf_counter() - start
    for name in policies:
        for _ in range(WARMUP_CHUNKS - (1 if name == "stacked" else 0)):
            infer(name)
    # With the A/B policy, chunks alternate between the two (in turn, each round in the other order), so a slow
    # spell of this VM lands on both.
    timings: dict[str, list[dict[str, float]]] = {name: [] for name in policies}
    walls: dict[str, list[float]] = {name: [] for name in policies}
    for run in range(args.runs):
        for name in list(policies)[:: 1 if run % 2 == 0 else -1]:
            start = time.perf_counter()
            timings[name].append(infer(name)["policy_timing"])
            walls[name].append(1e3 * (time.perf_counter() - start))

    def summary(name: str) -> tuple[float, dict[str, float]]:
        rows = timings[name]
        stages = {k: round(float(np.median([t[k] for t in rows])), 1) for k in rows[0] if k.endswith("_ms")}
        return float(np.median(walls[name])), stages

    chunk_ms, stages = summary("stacked")
    out = {
        "precision": policy.metadata.precision,
        "load_s": round(load_s, 1),
        "first_chunk_s": round(first_chunk_s, 1),
        "compiled": bool(args.compile),
        "chunk_ms": round(chunk_ms, 1),
        "rtc_method": args.offline_rtc_method,
        "stages_ms": stages,
        "n_action_steps": policy.metadata.action_horizon,
    }
    if args.unstacked:
        apart_ms, apart_stages = summary("unstacked")
        out["unstacked"] = {"chunk_ms": round(apart_ms, 1), "stages_ms": apart_stages, "alternated": True}
        out["unstacked"]["stacked_over_unstacked"] = round(chunk_ms / apart_ms, 3)
        out["unstacked"]["denoise_stacked_over_unstacked"] = round(stages["denoise_ms"] / apart_stages["denoise_ms"], 3)
    return out


def run_worker(
    args: argparse.Namespace,
    precision: str,
    threads: int,
    compiled: bool = False,
    kernel: str = "auto",
    unstacked: bool = False,
) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", "--checkpoint", str(args.checkpoint), "--precision", precision]
    cmd += ["--threads", str(threads), "--runs", str(args.runs)] + (["--compile"] if compiled else [])
    cmd += ["--unstacked"] if unstacked else []
    cmd += ["--int8-kernel", kernel]
    if args.offline_rtc_method:
        cmd += ["--offline-rtc-method", args.offline_rtc_method]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {precision} x {threads} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def beside_sim(row: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`row()` timed with the MuJoCo SO-101 node (config/sim_so101.yaml, its own process) running beside it, once
    it renders: the share of the live run's chunk time the simulator alone costs, without the policy node's loop.
    Returns the row with `sim_cores_busy` (the simulator's CPU seconds over the row's wall seconds)."""
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import Image

    cmd = [sys.executable, "-m", "omni_ros.cli", "node", "sim", "--config", str(SIM_CONFIG)]
    with tempfile.TemporaryFile("w+") as out:
        sim = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        context, node, _, _ = ros_listener("bench_realtime_sim_probe")
        frames: list[object] = []
        node.create_subscription(Image, "/camera/base/image_raw", frames.append, 10)
        spinner = SingleThreadedExecutor(context=context)
        spinner.add_node(node)
        try:
            deadline = time.monotonic() + 120.0
            while not frames and time.monotonic() < deadline and sim.poll() is None:
                spinner.spin_once(timeout_sec=0.1)
            if not frames:
                out.seek(0)
                why = "in 120 s" if sim.poll() is None else f"before it exited (code {sim.returncode})"
                raise RuntimeError(f"the simulator published no camera frame {why}:\n{out.read()[-3000:]}")
            spinner.remove_node(node)  # not listening while the row runs: only the simulator beside it
            before, start = cpu_seconds(sim.pid), time.monotonic()
            result = row()
            result["sim_cores_busy"] = round((cpu_seconds(sim.pid) - before) / (time.monotonic() - start), 2)
        finally:
            stop(spinner, node, context, [sim])
    return result


def gemm_floor(args: argparse.Namespace, row: dict[str, Any], threads: int) -> dict[str, Any]:
    """The row's linears alone, timed now at `--gemm-floor`'s shapes with the kernel the row ran
    (bench/gemm_kernels.py's worker, a fresh process per stage, idle cores polling as the product infers, the vision
    stage on image threads as the product runs it): one inference's GEMMs, a floor under the chunk."""
    import gemm_kernels
    from int8_budget import FLOOR_TARGET, PRECISION_KERNELS

    chosen = str(row["precision"]).split(":")[0].strip()  # "int8 (onednn)", "bf16", ...
    if "(xnnpack)" in chosen or "(program)" in chosen:
        return {"skipped": f"{chosen}: XNNPACK's GEMMs need an export (bench/gemm_kernels.py times them)"}
    kernel = PRECISION_KERNELS[chosen.split()[0]]  # int8_budget's precision -> kernel (int8: oneDNN's)
    shapes, steps = gemm_kernels.stage_shapes(args.gemm_floor)
    worker_args = argparse.Namespace(preset=args.gemm_floor, threads=threads, runs=args.runs, image_threads=True)
    results = {name: gemm_kernels.run_worker(worker_args, name, kernel) for name in shapes}
    if any(r["ms"] is None for r in results.values()):
        return {"skipped": f"{kernel}: {next(r.get('why') for r in results.values() if r['ms'] is None)}"}
    stages = {name: round(r["ms"], 1) for name, r in results.items()}
    floor = sum(ms * (steps if name == "denoise_step" else 1) for name, ms in stages.items())
    return {
        "preset": args.gemm_floor,
        "kernel": kernel,
        "emulated": any(r.get("emulated") for r in results.values()),
        "image_threads": threads > 1,
        "stages_ms": stages,
        "steps": steps,
        "inference_gemm_ms": round(floor, 1),
        "chunk_over_floor": round(row["chunk_ms"] / floor, 3),
        "within_target": row["chunk_ms"] <= FLOOR_TARGET * floor,
    }


def starvation(chunks: list[tuple[float, float, float]], resume: bool = True) -> dict[str, Any]:
    """From (stamp, arrival, covered seconds) per chunk: how often and how long the robot had no action left.

    The executor's rules (omni_ros/control/executor.py), replayed: a chunk's actions end `covered` seconds after
    its observation's stamp. A chunk arriving after the newest plan ended is a starvation: the robot held from the
    plan's end to that arrival, and the chunk plays on from its first action after the plan's end (`resume`:
    `control.resume_where_held`), or without it from its action due at the arrival; a chunk whose every action is
    due runs from its first if it was observed after the plan ended (`control.run_late_chunks`), and is refused if
    not (the robot holds on). Held intervals never overlap, so their sum is at most the run's length.
    """
    events, held = 0, 0.0
    newest_end: float | None = None
    for stamp, arrival, covered in sorted(chunks, key=lambda c: c[1]):
        end = stamp + covered
        if newest_end is None:  # the first chunk: the robot stood still until it came
            newest_end = arrival + covered if arrival > end else end
        elif arrival > newest_end:
            if resume:
                left = end - max(newest_end, stamp)  # this chunk's motion after the plan's end
            elif arrival < end:
                left = end - arrival  # the actions due from its arrival on
            else:
                left = covered if newest_end <= stamp else 0.0  # observed at rest: run from its first action
            if left <= 0:
                continue  # refused: the robot holds on until a chunk that is not
            events += 1
            held += arrival - newest_end
            newest_end = arrival + left
        else:
            newest_end = max(newest_end, end)
    return {"starvations": events, "held_s": round(held, 2)}


def commanded_still(positions: list[tuple[float, tuple[float, ...]]]) -> float:
    """Seconds from each command to the next that repeats it exactly: the arm told to stand still."""
    return round(sum(t1 - t0 for (t0, p0), (t1, p1) in itertools.pairwise(positions) if p0 == p1 and p0), 2)


MOTION_KEYS = ("plan_ran_out", "held_s", "resumed_chunks", "late_chunks_run", "chunks_accepted", "chunks_rejected")


def motion_in_window(reports: list[tuple[float, dict[str, str]]], start: float) -> dict[str, float] | None:
    """The executor's counts (cumulative since the node started) over the window from `start` to the last report:
    the last report minus the last one before `start` (none: the node had counted nothing yet)."""
    before = [values for t, values in reports if t <= start]
    after = [values for t, values in reports if t > start]
    if not after or not all(k in after[-1] for k in MOTION_KEYS):
        return None
    base = before[-1] if before and all(k in before[-1] for k in MOTION_KEYS) else dict.fromkeys(MOTION_KEYS, "0")
    return {k: round(float(after[-1][k]) - float(base[k]), 2) for k in MOTION_KEYS}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float) -> None:
    """Until the server accepts connections on 127.0.0.1:port (it loads the policy first)."""
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"omni-ros serve exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(1.0)
    raise RuntimeError(f"omni-ros serve did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


def live(
    args: argparse.Namespace,
    wait_policy: str | None = None,
    executor: str | None = None,
    compile: str | None = None,
    resume: str = "on",
    program_process: str = "auto",
    int8_kernel: str | None = None,
    idle_poll: str | None = None,
) -> dict[str, Any]:
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.executors import SingleThreadedExecutor
    from trajectory_msgs.msg import JointTrajectory

    from omni_ros.config import load_config
    from omni_ros.control.executor import PLAN_EXHAUSTED
    from omni_ros.msg import ActionChunk, PolicyStatus

    data = yaml.safe_load(SIM_CONFIG.read_text())
    meta_cameras = json.loads((Path(args.checkpoint) / "config.json").read_text()).get("input_features", {})
    state = meta_cameras.get("observation.state", {}).get("shape", [data["sim"]["n_joints"]])
    if int(state[0]) != int(data["sim"]["n_joints"]):
        # Said at once, not after a node fails to configure: the SO-101 publishes n_joints joint states.
        return {"skipped": f"the checkpoint's state has {state[0]} dims, the SO-101 {data['sim']['n_joints']} joints"}
    cameras = [k.removeprefix("observation.images.") for k in meta_cameras if k.startswith("observation.images.")]
    sim_cameras = data["sim"]["cameras"]
    data["policy"] = {"checkpoint": str(Path(args.checkpoint).resolve()), "num_threads": 0}
    data["policy"]["precision"] = args.live_precision
    data["policy"]["int8_kernel"] = int8_kernel or args.int8_kernel[0]
    data["policy"]["program_process"] = program_process
    if wait_policy is not None:
        data["policy"]["omp_wait_policy"] = wait_policy
    if idle_poll is not None:
        data["policy"]["cpu_idle_poll"] = idle_poll
    # The actions play at the rate the offline rows compare against (a LeRobot checkpoint records none).
    data["policy"]["action_dt"] = 1.0 / args.fps
    data["control"] = {**data.get("control", {}), "blending": "rtc"}
    if args.live_rtc_method:
        data["control"]["rtc"] = {**data["control"].get("rtc", {}), "method": args.live_rtc_method}
    compile = compile or ("on" if args.live_compiled else "off")
    data["policy"]["compile"] = compile == "on"
    data["control"]["resume_where_held"] = resume == "on"
    # The checkpoint's cameras on the simulator's, in order (a LeRobot folder names its own).
    data.setdefault("topics", {})["cameras"] = [
        {"name": c, "topic": f"/camera/{s}/image_raw"} for c, s in zip(cameras, sim_cameras, strict=False)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "realtime_so101.yaml"
        cli = [sys.executable, "-m", "omni_ros.cli"]
        names = ["sim", "policy"]
        serve: list[str] = []
        if args.live_serve:
            # The policy in `omni-ros serve` (this very config's policy section), the node a remote client of it
            # on 127.0.0.1: the policy's process then runs no control loop.
            served = Path(tmp) / "serve.yaml"
            served.write_text(yaml.safe_dump(data))
            port = free_port()
            serve = [*cli, "serve", "--config", str(served), "--host", "127.0.0.1", "--port", str(port)]
            serve += ["--keymap", "canonical"]  # our own keys both ways: the cameras by the checkpoint's names
            url = f"ws://127.0.0.1:{port}"
            remote = {"url": url, "deadline_s": 10.0}
            data["policy"] = {"backend": "remote", "remote": remote, "action_dt": data["policy"]["action_dt"]}
            names.append("server")
        path.write_text(yaml.safe_dump(data))
        config = load_config(path)  # checked here, before anything starts
        cmds = [[*cli, "node", "sim", "--config", str(path)], [*cli, "node", "policy", "--config", str(path), "--sim"]]
        logs = [open(Path(tmp) / f"{i}.log", "w") for i in range(len(names))]  # noqa: SIM115 (closed below)
        env = {**os.environ, **({"OMNI_ROS_EXECUTOR": executor} if executor else {})}
        procs = []
        if serve:
            procs.append(subprocess.Popen(serve, cwd=ROOT, stdout=logs[2], stderr=subprocess.STDOUT, env=env))
            try:
                wait_for_port(port, procs[0], 900.0)  # the first load may export the program
            except RuntimeError as exc:
                logs[2].flush()
                raise RuntimeError(f"{exc}:\n{(Path(tmp) / '2.log').read_text()[-3000:]}") from exc
        procs = [
            subprocess.Popen(c, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
            for c, f in zip(cmds, logs, strict=False)
        ] + procs
        context, node, now, stamp = ros_listener("bench_realtime_listener")
        chunks: list[tuple[float, float, float]] = []
        latencies: list[float] = []
        statuses: list[PolicyStatus] = []

        def on_chunk(m: ActionChunk) -> None:
            chunks.append((stamp(m), now(), m.horizon * float(m.dt)))
            latencies.append(float(m.inference_time))

        # Each command's arrival and what it asked of the arm.
        positions: list[tuple[float, tuple[float, ...]]] = []
        node.create_subscription(
            JointTrajectory,
            config.control.command_topic,
            lambda m: positions.append((now(), tuple(m.points[0].positions) if m.points else ())),
            200,
        )
        node.create_subscription(ActionChunk, "/omni_ros/action_chunk", on_chunk, 50)
        node.create_subscription(PolicyStatus, config.status.topic, statuses.append, 10)
        motion: list[tuple[float, dict[str, str]]] = []  # the executor's counts from the node's diagnostics
        node.create_subscription(
            DiagnosticArray,
            config.topics.diagnostics,
            lambda m: motion.extend((now(), {kv.key: kv.value for kv in d.values}) for d in m.status[:1]),
            10,
        )
        window: list[float] = []
        spinner = SingleThreadedExecutor(context=context)
        spinner.add_node(node)
        try:
            log(f"live: waiting for the first command (loading {args.checkpoint}), then {args.live_seconds:g} s")
            cpu_before: list[float] = []

            def on_measure() -> None:
                cpu_before.extend(cpu_seconds(p.pid) for p in procs)
                window.append(now())

            listen(
                spinner,
                lambda: len(chunks) >= 2,
                [positions, chunks, latencies],
                5.0,
                args.live_seconds,
                on_measure=on_measure,
                # A compiled policy's first chunk waits for its compilation (minutes for a full-size SmolVLA).
                start_timeout=900.0 if compile == "on" else 120.0,
            )
            # Cores each process kept busy while recording: what the policy had, with the simulator beside it.
            cpu_share = {
                name: round((cpu_seconds(p.pid) - before) / args.live_seconds, 2)
                for name, p, before in zip(names, procs, cpu_before, strict=True)
            }
        finally:
            stop(spinner, node, context, procs)
            for f in logs:
                f.close()
        texts = [(Path(tmp) / f"{i}.log").read_text() for i in range(len(names))]
    tail = [t[-1500:] for t in texts]
    commands = [t for t, _ in positions]
    intervals = np.diff(commands) if len(commands) > 1 else np.array([args.live_seconds])
    return {
        "seconds": args.live_seconds,
        "precision": statuses[-1].precision if statuses else None,
        "omp_wait_policy": wait_policy or "default",
        "cpu_idle_poll": idle_poll or "default",
        "executor": executor or "default",
        "compiled": compile == "on",
        "resume_where_held": resume == "on",
        "rtc_method": config.control.rtc.method,
        "policy_process": "omni-ros serve (the node its remote client)" if args.live_serve else "the policy node",
        "program_process": config.policy.program_process,
        "commands_per_s": round(len(commands) / args.live_seconds, 2),
        "control_rate_hz": config.robot.control_rate_hz,
        "longest_command_gap_s": round(float(intervals.max()), 3),
        "chunks": len(chunks),
        "chunk_inference_ms_p50": round(1e3 * float(np.median(latencies)), 1) if latencies else None,
        "cores_busy": cpu_share,
        # The executor's own account over the window (its diagnostics, 1-2 Hz: each end within one period):
        # how often the plan ran out and the seconds it held so, episode resets and stops not counted.
        "motion": motion_in_window(motion, window[0]) if window else None,
        # The same replayed from the chunks' stamps and arrivals (starvation()): blind to the chunks the node
        # dropped (a new episode's prompt resets the plan), so it can differ from the executor's count.
        "timeline_replay": starvation(chunks, resume=resume == "on"),
        # What the arm was asked: seconds between commands that repeated the one before exactly (a hold), so any
        # standing still counts, whatever the executor calls it.
        "commanded_still_s": commanded_still(positions),
        # The policy node's own account, from its status detail while the robot held (ActionChunkExecutor.keeping_up).
        # Chunks the executor refused, by reason (numbers dropped so equal reasons group), from the node's log, and
        # the states its status reported: an inference abandoned for stale inputs, or a chunk past its end, is
        # time the robot held that the latency alone does not explain.
        "chunks_not_executed": dict(Counter(re.sub(r"[0-9.]+", "N", m) for m in NOT_EXECUTED.findall(texts[1]))),
        # The compiled stages that served some call eager (a compiled run's figures are the eager stage's there).
        "stages_run_eager": sorted(set(EAGER_STAGE.findall(texts[1]))),
        "status_states": dict(Counter(s.state_name for s in statuses if window and stamp(s) >= window[0])),
        "node_status_while_holding": next((s.detail for s in reversed(statuses) if PLAN_EXHAUSTED in s.detail), None),
        # Each chunk as (observation stamp, arrival, seconds of motion) from the first arrival: the raw record the
        # starvation figures come from, so they can be recomputed.
        "chunk_timeline_s": [
            [round(s - chunks[0][1], 3), round(a - chunks[0][1], 3), round(c, 3)] for s, a, c in chunks
        ],
        "log_tail": None if commands else tail,
    }


def _state_dims(folder: Path) -> int | None:
    try:
        features = json.loads((folder / "config.json").read_text())["input_features"]
        return int(features["observation.state"]["shape"][0])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def ensure_checkpoint(args: argparse.Namespace) -> Path:
    work = Path(args.work_dir)
    folder = work / FOLDER
    dims = _state_dims(folder)
    if dims != SO101_JOINTS:
        # Another bench may have left a folder of other dims here: the live run needs the SO-101's.
        said = "" if dims is None else f" (the one there has {dims} state dims, the SO-101 {SO101_JOINTS} joints)"
        log(f"building the full-size SmolVLA with LeRobot in {folder}{said} ...")
        script = ROOT / "scripts" / "lerobot_bench.py"
        # The SO-101's 6 joints in and out, so the live part can drive the simulator with this very folder.
        cmd = [args.lerobot_python, str(script), "--policy", "smolvla", "--out", str(work), "--runs", "1"]
        cmd += ["--dims", f"{SO101_JOINTS}x{SO101_JOINTS}"]
        subprocess.run(cmd, check=True)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", help="a checkpoint folder (default: LeRobot's full-size SmolVLA, built once)")
    parser.add_argument(
        "--precisions", nargs="*", default=["fp32", "bf16", "int8"], help="offline rows (none: the live run only)"
    )
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fps", type=float, default=30.0, help="control rate the chunk's actions execute at")
    parser.add_argument("--live-seconds", type=float, default=120.0)
    parser.add_argument("--live-precision", default="auto", help="policy.precision of the live run (default auto)")
    parser.add_argument(
        "--live-wait-policies",
        nargs="+",
        choices=WAIT_POLICIES,
        help="repeat the live run once per policy.omp_wait_policy (default: the product's)",
    )
    parser.add_argument(
        "--live-executors",
        nargs="+",
        choices=EXECUTORS,
        help="repeat the live run once per rclpy executor of the nodes (default: the product's)",
    )
    parser.add_argument(
        "--compiled", nargs="*", default=[], help="offline rows at these precisions with policy.compile on too"
    )
    parser.add_argument(
        "--live-compile",
        nargs="+",
        choices=["off", "on"],
        help="repeat the live run once per policy.compile setting (default: off, the product's)",
    )
    parser.add_argument(
        "--live-resume",
        nargs="+",
        choices=["off", "on"],
        help="repeat the live run once per control.resume_where_held setting (default: on, the product's)",
    )
    parser.add_argument(
        "--live-compiled",
        action="store_true",
        help="policy.compile on in every live run that --live-compile does not set (the fastest policy's runs)",
    )
    parser.add_argument(
        "--live-rtc-method", choices=["guided", "inpaint"], help="control.rtc.method of the live run (default guided)"
    )
    parser.add_argument(
        "--int8-kernel",
        nargs="+",
        default=["auto"],
        help="policy.int8_kernel of every int8 row and the live run (default auto; program: the stages exported "
        "whole on the first load); several: each int8 row once per kernel, the live run with the first",
    )
    parser.add_argument(
        "--offline-rtc-method",
        choices=["guided", "inpaint"],
        help="time the offline chunks with a real-time-chunking request each (continuing the previous chunk, "
        "delay 5 actions), the policy loaded for that method; default: plain chunks",
    )
    parser.add_argument(
        "--live-int8-kernels",
        nargs="+",
        choices=["auto", "onednn", "xnnpack", "program"],
        help="one live run per policy.int8_kernel value (live_by_int8_kernel)",
    )
    parser.add_argument(
        "--live-program-processes",
        nargs="+",
        choices=["auto", "child", "inline"],
        help="one live run per policy.program_process value: where an exported program runs (auto: a child "
        "process of the policy node; inline: the node's own process, where ExecuTorch's hold on the GIL stalls "
        "its loop); default one run with auto",
    )
    parser.add_argument(
        "--live-serve",
        action="store_true",
        help="the live run's policy in `omni-ros serve` on 127.0.0.1, the node its remote client (policy.backend: "
        "remote): the policy's process then runs no control loop",
    )
    parser.add_argument(
        "--live-idle-poll",
        nargs="+",
        choices=["auto", "on", "off"],
        help="one live run per policy.cpu_idle_poll value (live_by_idle_poll): idle cores kept polling while the "
        "policy infers (/dev/cpu_dma_latency), or sleeping",
    )
    parser.add_argument(
        "--offline-beside-sim",
        action="store_true",
        help="time each offline row again with the MuJoCo SO-101 node running beside it (its own process, "
        "config/sim_so101.yaml): `beside_sim` in the row, what the live run's simulator alone costs the policy",
    )
    parser.add_argument(
        "--gemm-floor",
        metavar="PRESET",
        help="after each offline row, its linears alone at this bench/gemm_kernels.py preset's shapes (smolvla: the "
        "default checkpoint's) with the row's kernel, in the same run: `gemm_floor` in the row, the chunk over it",
    )
    parser.add_argument(
        "--offline-unstacked",
        action="store_true",
        help="beside each bf16 / int8 offline row's policy, the same one with every linear its own product (not the "
        "stacked q / k / v and gate / up of omni_ros/policy/precision/stacked_linears.py), in the same process, "
        "chunks alternating between the two: `unstacked` in the row",
    )
    parser.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--unstacked", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--lerobot-python", default=str(Path(os.environ.get("LEROBOT_VENV", "/work/venv-lerobot"))
                        / "bin" / "python"))  # fmt: skip
    parser.add_argument("--work-dir", default="/tmp/omni_realtime")
    parser.add_argument("--out", help="also write the JSON here")
    add_worker_args(parser)
    args = parser.parse_args()
    if args.worker:
        args.threads = args.threads[0]
        print(json.dumps(worker(args)))
        return 0
    args.checkpoint = str(Path(args.checkpoint) if args.checkpoint else ensure_checkpoint(args))
    report: dict[str, Any] = {
        "benchmark": "realtime",
        "checkpoint": args.checkpoint if args.checkpoint != str(Path(args.work_dir) / FOLDER) else "smolvla_full",
        "fps": args.fps,
        "runs": args.runs,
        "machine": cpu_facts(),
        "offline": {},
    }
    rows = [(p, False) for p in args.precisions] + [(p, True) for p in args.compiled]
    kernels = args.int8_kernel
    rows = [(p, c, k) for p, c in rows for k in (kernels if p == "int8" else kernels[:1])]
    report["offline_rtc_method"] = args.offline_rtc_method
    for threads in args.threads:
        for precision, compiled, kernel in rows:
            named = f" ({kernel})" if precision == "int8" else ""
            log(f"{precision}{' compiled' if compiled else ''}{named} at {threads} thread(s) ...")
            unstacked = args.offline_unstacked and precision in ("bf16", "int8")
            row = run_worker(args, precision, threads, compiled, kernel, unstacked=unstacked)
            if args.offline_beside_sim:
                log("  again, the simulator node running beside it ...")
                near = beside_sim(partial(run_worker, args, precision, threads, compiled, kernel))
                row["beside_sim"] = {k: near[k] for k in ("chunk_ms", "stages_ms", "sim_cores_busy")}
                row["beside_sim"]["chunk_over_alone"] = round(near["chunk_ms"] / row["chunk_ms"], 3)
            if args.gemm_floor:
                log(f"  its GEMMs alone ({args.gemm_floor} shapes) ...")
                row["gemm_floor"] = gemm_floor(args, row, threads)
            execution_ms = 1e3 * row["n_action_steps"] / args.fps
            row["execution_ms"] = round(execution_ms, 1)
            row["chunk_over_execution"] = round(row["chunk_ms"] / execution_ms, 3)
            row["realtime"] = row["chunk_ms"] < execution_ms
            named = f"_{kernel}" if precision == "int8" and len(kernels) > 1 else ""
            report["offline"][f"{precision}{named}{'_compiled' if compiled else ''}_{threads}_threads"] = row
            log(f"  {row['chunk_ms']:.0f} ms per chunk vs {execution_ms:.0f} ms of motion ({row['precision']})")
            if "beside_sim" in row:
                log(f"  {row['beside_sim']['chunk_ms']:.0f} ms with the simulator beside it")
    if not args.skip_live and args.live_seconds > 0:
        # One live run per variant asked for (the first is `live`), else one with the product's defaults.
        variants = [("wait_policy", p) for p in args.live_wait_policies or []]
        variants += [("executor", e) for e in args.live_executors or []]
        variants += [("compile", c) for c in args.live_compile or []]
        variants += [("resume", r) for r in args.live_resume or []]
        variants += [("program_process", r) for r in args.live_program_processes or []]
        variants += [("int8_kernel", k) for k in args.live_int8_kernels or []]
        variants += [("idle_poll", k) for k in args.live_idle_poll or []]
        runs = {(kind, value): live(args, **{kind: value}) for kind, value in variants or [("wait_policy", None)]}
        report["live"] = next(iter(runs.values()))
        kinds = ("wait_policy", "executor", "compile", "resume", "program_process", "int8_kernel", "idle_poll")
        for kind, key in ((k, f"live_by_{k}") for k in kinds):
            if any(k == kind for k, _ in variants):
                report[key] = {value: run for (k, value), run in runs.items() if k == kind}
        for run in runs.values():
            log(f"live: {json.dumps({k: v for k, v in run.items() if k not in ('log_tail', 'chunk_timeline_s')})}")
    report["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
