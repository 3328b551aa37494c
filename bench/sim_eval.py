"""Closed-loop success in the simulator, as `omni-ros sim eval` measures it, written as a bench result.

    .venv/bin/python bench/sim_eval.py [--config config/sim.yaml] [--episodes 50] [--out FILE]
    .venv/bin/python bench/sim_eval.py --config config/sim_so101.yaml --threads 1 \
        --out bench/results/sim_so101_eval.json

Runs the command a user runs (`omni-ros sim eval --config ... --episodes N --json ...`, in its own process: the
policy of the config, every held-out layout twice with two prompts, through the real chunk executor, next to
a random-weight policy of the same size) and hands over its report with the command, the wall time and the
CPU it ran on. README's success and prompt-following rates are these files.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import emit

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config/sim.yaml", help="the sim config (its policy is evaluated)")
    parser.add_argument("--episodes", type=int, default=50, help="held-out layouts (each with two prompts)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        report_file = Path(tmp) / "eval.json"
        command = [sys.executable, "-m", "omni_ros.cli", "sim", "eval", "--config", args.config]
        command += ["--episodes", str(args.episodes), "--threads", str(args.threads), "--json", str(report_file)]
        start = time.monotonic()
        subprocess.run(command, cwd=ROOT, check=True)
        seconds = time.monotonic() - start
        evaluation = json.loads(report_file.read_text())
    report = {
        "benchmark": "sim_eval",
        "runs": f"omni-ros sim eval --config {args.config} --episodes {args.episodes} --threads {args.threads}",
        "seconds": round(seconds, 1),
        **evaluation,
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
