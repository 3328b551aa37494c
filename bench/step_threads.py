"""The denoising steps on one torch thread against all of them, per precision, side by side.

    .venv/bin/python bench/step_threads.py --checkpoint DIR [--threads 2] [--precisions fp32 bf16 int8]
        [--rounds 5] [--compiled] [--wait-policy passive|brief|active] [--idle-poll auto|on|off]
        [--out bench/results/step_threads.json]

The product times both on a policy's first chunks and keeps the faster (omni_ros.cpu_threads.StepThreads, every
CPU runner with more than one torch thread). This shows what that choice is worth: for each precision, one fresh
process (torch's OpenMP settings as the product sets them: passive waiting unless the environment says
otherwise), one policy, chunks in alternating rounds with the steps pinned to one thread and to `--threads`,
medians per stage. A LeRobot pi0 / pi0.5 / SmolVLA folder: bench/vs_lerobot.py's edge pi0 (/tmp/omni_vs_lerobot/
pi0_edge) or bench/smolvla.py's.

`--compiled` measures the compiled step (`policy.compile`), whose threads the product sets without timing them
(one under passive waiting, all of them where idle workers spin: omni_ros/policy/torch_runner.py): a compiled
graph keeps the thread count it was compiled for, so each arm is its own fresh process (one thread first, then
`--threads`), each compiling on its first chunk (`first_chunk_s`), then `--rounds` chunks; `denoise_ratio` is the
second arm's median denoising time over the first's. `--wait-policy` runs the workers under that
`policy.omp_wait_policy` (default: the product's, passive), `--idle-poll` under that `policy.cpu_idle_poll`
(default auto: idle cores polling while inferring where /dev/cpu_dma_latency is writable; omni_ros/cpu_idle.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from common import add_worker_args, cpu_facts, emit
from xnnpack_glue import _alternate, _observation

from omni_ros.cpu_threads import DEFAULT_WAIT_POLICY, configure, set_wait_policy


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import omni_ros.policy
    from omni_ros.cpu_threads import StepThreads

    configure(idle_poll=args.idle_poll)
    threads = args.threads
    torch.set_num_threads(threads)
    load = omni_ros.policy.load
    policy = load(args.checkpoint, precision=args.precision, cpu_linear="packed", compile=args.compiled)
    obs = _observation(policy.metadata)
    runner = policy.runner
    if args.compiled:
        # Before the first chunk, which compiles the step on the threads it runs on.
        runner.step_threads = StepThreads((args.steps_on,))
        start = time.perf_counter()
        policy.infer(obs)
        first_chunk_s = round(time.perf_counter() - start, 1)
        name = f"steps_on_{args.steps_on}_torch_thread" + ("s" if args.steps_on > 1 else "")
        arm = {name: lambda: policy.infer(obs)["policy_timing"]}
        return {"precision": policy.metadata.precision, "first_chunk_s": first_chunk_s, **_alternate(arm, args.rounds)}

    def steps_on(n: int) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            runner.step_threads = StepThreads((n,))
            return policy.infer(obs)["policy_timing"]

        return run

    arms = {"steps_on_1_torch_thread": steps_on(1), f"steps_on_{threads}_torch_threads": steps_on(threads)}
    return {"precision": policy.metadata.precision, **_alternate(arms, args.rounds)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a LeRobot pi0 / pi0.5 / SmolVLA folder")
    parser.add_argument("--threads", type=int, default=2, help="torch's threads outside the steps (and the B arm)")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "int8"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compiled", action="store_true", help="the compiled step (policy.compile), an arm a process")
    # Not "runtime": a worker importing omni_ros would set the product's default where the environment is unset.
    parser.add_argument("--wait-policy", choices=("passive", "brief", "active"), default=DEFAULT_WAIT_POLICY)
    parser.add_argument(
        "--idle-poll", choices=("auto", "on", "off"), default="auto", help="policy.cpu_idle_poll of the workers"
    )
    parser.add_argument("--out", help="also write the JSON here")
    add_worker_args(parser)
    parser.add_argument("--steps-on", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return 0
    set_wait_policy(args.wait_policy)  # the workers inherit it; the report's machine facts read it here
    report: dict[str, Any] = {"benchmark": "step_threads", "threads": args.threads, "rounds": args.rounds}
    report["compiled"], report["omp_wait_policy"] = args.compiled, args.wait_policy
    report["precisions"] = {}
    for precision in args.precisions:
        cmd = [sys.executable, __file__, "--worker", "--checkpoint", args.checkpoint, "--precision", precision]
        cmd += ["--threads", str(args.threads), "--rounds", str(args.rounds), "--idle-poll", args.idle_poll]
        if not args.compiled:
            report["precisions"][precision] = _run_worker(cmd, precision)
            continue
        row: dict[str, Any] = {}
        for steps_on in (1, args.threads):
            arm = _run_worker([*cmd, "--compiled", "--steps-on", str(steps_on)], precision)
            row.setdefault("precision", arm.pop("precision"))
            row[f"first_chunk_s_steps_on_{steps_on}"] = arm.pop("first_chunk_s")
            row.update(arm)
        one, many = (row[name]["denoise_ms"] for name in row if name.startswith("steps_on_"))
        row["denoise_ratio"] = round(many / one, 3)
        report["precisions"][precision] = row
    configure(idle_poll=args.idle_poll)  # the machine facts say what the workers had
    report["machine"] = cpu_facts()
    emit(report, args.out)
    return 0


def _run_worker(cmd: list[str], precision: str) -> dict[str, Any]:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{precision} worker failed:\n{done.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
