"""Export time with torch's node provenance shared against copied (omni_ros/lowering.py `provenance_shared`).

    .venv/bin/python bench/lowering.py [--cases tiny_fp32 tiny_int8 CHECKPOINT_DIR ...] [--rounds 2]
        [--out bench/results/lowering.json]

Each export runs in a fresh process (nothing cached between arms), the two arms alternating round by round: the
product's exporter as it is (`shared`), and the same exporter with the context switched off (`copied`, torch's
own deep copies). Cases: `tiny_fp32` (the tiny preset, every method, float32), `tiny_int8` (its staged methods,
int8-dynamic), or a checkpoint folder (its staged methods, int8-dynamic: what the int8 program kernel exports on
first load). Reports each arm's seconds, the ratio of medians, and whether the two arms wrote the same bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import emit

ARMS = ("shared", "copied")


def log(msg: str) -> None:
    print(f"[lowering] {msg}", file=sys.stderr, flush=True)


def _child(case: str, arm: str, out: Path) -> None:
    """One export of `case` in this process; prints its seconds as JSON."""
    import omni_ros.export.exporter as exporter

    if arm == "copied":
        exporter.provenance_shared = contextlib.nullcontext  # type: ignore[assignment]
    start = time.perf_counter()
    if case in ("tiny_fp32", "tiny_int8"):
        kwargs: dict[str, Any] = {"state_dim": 3, "action_dim": 3, "quantize": "none"}
        if case == "tiny_int8":
            kwargs.update(quantize="int8-dynamic", methods=("encode_images", "prefill", "denoise_step"))
        exporter.export_preset("tiny", out, **kwargs)
    else:
        from omni_ros.policy import layouts
        from omni_ros.policy.families import stage_plan

        staged = stage_plan(layouts.read(Path(case)).family).staged
        exporter.export_checkpoint(case, out, quantize="int8-dynamic", methods=tuple(staged))
    print(json.dumps({"seconds": time.perf_counter() - start}))


def _run(case: str, arm: str, folder: Path) -> tuple[float, str]:
    out = folder / f"{arm}.pte"
    proc = subprocess.run(
        [sys.executable, __file__, "--child", case, arm, str(out)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"export of {case} ({arm}) failed:\n{proc.stderr[-3000:]}")
    seconds = json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]
    return seconds, hashlib.sha256(out.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=["tiny_fp32", "tiny_int8"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], args.child[1], Path(args.child[2]))
        return
    results = {}
    for case in args.cases:
        seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
        digests: dict[str, set[str]] = {arm: set() for arm in ARMS}
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
                    s, digest = _run(case, arm, Path(tmp))
                    seconds[arm].append(round(s, 2))
                    digests[arm].add(digest)
                    log(f"{case} round {r + 1}/{args.rounds}, {arm}: {s:.1f} s")
        medians = {arm: statistics.median(v) for arm, v in seconds.items()}
        results[case] = {
            "seconds": seconds,
            "median_s": medians,
            "shared_over_copied": round(medians["shared"] / medians["copied"], 3),
            "same_bytes": len(digests["shared"] | digests["copied"]) == 1,
        }
    emit({"rounds": args.rounds, "cases": results}, args.out)


if __name__ == "__main__":
    main()
