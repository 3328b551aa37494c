"""The denoising steps on one torch thread against all of them, per precision, side by side.

    .venv/bin/python bench/step_threads.py --checkpoint DIR [--threads 2] [--precisions fp32 bf16 int8]
        [--rounds 5] [--out bench/results/step_threads.json]

The product times both on a policy's first chunks and keeps the faster (omni_ros.cpu_threads.StepThreads, every
CPU runner with more than one torch thread). This shows what that choice is worth: for each precision, one fresh
process (torch's OpenMP settings as the product sets them: passive waiting unless the environment says
otherwise), one policy, chunks in alternating rounds with the steps pinned to one thread and to `--threads`,
medians per stage. A LeRobot pi0 / pi0.5 / SmolVLA folder: bench/vs_lerobot.py's edge pi0 (/tmp/omni_vs_lerobot/
pi0_edge) or bench/smolvla.py's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from common import add_worker_args, cpu_facts, emit
from xnnpack_glue import _alternate, _observation


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import omni_ros.policy
    from omni_ros.cpu_threads import StepThreads

    threads = args.threads
    torch.set_num_threads(threads)
    policy = omni_ros.policy.load(args.checkpoint, precision=args.precision, cpu_linear="packed")
    obs = _observation(policy.metadata)
    runner = policy.runner

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
    parser.add_argument("--out", help="also write the JSON here")
    add_worker_args(parser)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return 0
    report: dict[str, Any] = {"benchmark": "step_threads", "threads": args.threads, "rounds": args.rounds}
    report["precisions"] = {}
    for precision in args.precisions:
        cmd = [sys.executable, __file__, "--worker", "--checkpoint", args.checkpoint, "--precision", precision]
        cmd += ["--threads", str(args.threads), "--rounds", str(args.rounds)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{precision} worker failed:\n{done.stderr[-3000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(row), file=sys.stderr, flush=True)
        report["precisions"][precision] = row
    report["machine"] = cpu_facts()
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
