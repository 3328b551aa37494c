"""omni_ros vs LeRobot 0.6.1 on the very same edge-size pi0-FAST, observation and decode length, in one run.

    .venv/bin/python bench/pi0_fast.py [--threads 1 2] [--runs 3] [--steps 64] [--precisions bf16 int8]
        [--work-dir DIR] [--lerobot-venv DIR] [--out FILE]

LeRobot builds the model (scripts/lerobot_pi0fast_bench.py: bench/vs_lerobot.py's pi0 dims without the expert,
2 cameras at 480x640 -> 224 px, the fixtures' tiny tokenizer, a locally fitted FAST tokenizer, seeded random
weights) and times `predict_action_chunk` with its pre/post-processors; omni_ros loads the same folder
(`omni_ros.policy.load`) and times parse + inputs + the greedy KV-cached decode (`Pi0FastModel.generate`) in a
fresh process per row. Random weights never emit the end marker, so both decode exactly `--steps` tokens (the
generated ids are compared), and the FAST detokenizer is not timed (random tokens are not a FAST chunk: omni_ros
raises where LeRobot returns zeros; decoding a real chunk takes well under a millisecond). Rows: chunk time, time
to first token, tokens/s (decode phase) and the ratio to LeRobot; target eager <= 0.8x LeRobot's chunk time.
Not measured here yet: exported (.pte / ONNX) decoding (docs/pi0_fast.md#exported-executorch-xnnpack-onnx-runtime).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import add_precision_args, emit

ROOT = Path(__file__).resolve().parent.parent
NAME = "pi0fast_edge"


def lerobot_python(venv: str | None) -> Path:
    venv_dir = Path(venv or os.environ.get("LEROBOT_VENV") or ROOT / ".venv-lerobot")
    python = venv_dir / "bin" / "python"
    if not python.is_file():
        sys.exit(f"no LeRobot venv at {venv_dir}: run `make reference-fixtures` (it makes one) or pass --lerobot-venv")
    return python


def run_json(cmd: list[str]) -> dict[str, Any]:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch
    from safetensors.numpy import load_file

    import omni_ros.policy
    from omni_ros.policy.torch_runner import compact

    torch.set_num_threads(args.threads)
    work = Path(args.work_dir)
    meta = json.loads((work / f"{NAME}_inputs.json").read_text())
    tensors = load_file(work / f"{NAME}_inputs.safetensors")
    images = {k.removeprefix("observation.images."): tensors[k] for k in meta["cameras"]}
    obs = {"images": images, "state": tensors["observation.state"], "prompt": meta["prompt"]}
    # As the node and server run it: linears oneDNN-packed (policy.cpu_linear: packed), masked slots compacted.
    policy = omni_ros.policy.load(work / NAME, precision=args.precision, cpu_linear="packed")
    model = policy.runner.model

    def chunk() -> dict[str, Any]:
        start = time.perf_counter()
        inputs = policy.processor.inputs([policy.processor.parse(obs)])
        with torch.inference_mode():
            out = model.generate(compact(inputs))
        end = time.perf_counter()
        n = out.tokens.shape[1]
        return {
            "chunk_ms": (end - start) * 1e3,
            "time_to_first_token_ms": (end - start) * 1e3 - out.decode_ms,
            "tokens_per_s": (n - 1) / (out.decode_ms / 1e3) if n > 1 else 0.0,
            "tokens": n,
            "ids": out.tokens[0].tolist(),
        }

    chunk()  # warm-up
    rows = [chunk() for _ in range(args.runs)]
    result: dict[str, Any] = {
        k: round(float(np.median([r[k] for r in rows])), 2)
        for k in ("chunk_ms", "time_to_first_token_ms", "tokens_per_s")
    }
    result.update(tokens=rows[-1]["tokens"], generated=rows[-1]["ids"], precision=policy.metadata.precision)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=64, help="tokens decoded per chunk (max_decoding_steps)")
    parser.add_argument("--work-dir", default="/tmp/omni_pi0fast_bench")
    parser.add_argument("--lerobot-venv")
    parser.add_argument("--out")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    add_precision_args(parser)
    args = parser.parse_args()
    if args.worker:
        args.threads = args.threads[0]
        print(json.dumps(worker(args)))
        return 0
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    python = str(lerobot_python(args.lerobot_venv))
    script = str(ROOT / "scripts" / "lerobot_pi0fast_bench.py")
    print("[bench] LeRobot builds the edge pi0-FAST ...", file=sys.stderr, flush=True)
    subprocess.run([python, script, "--out", str(work), "--build", "--steps", str(args.steps)], check=True,
                   capture_output=True)  # fmt: skip
    report: dict[str, Any] = {
        "benchmark": "pi0_fast",
        "policy": f"pi0-FAST edge (2 x 480x640 -> 224 px, SigLIP 384x6, VLM 512x6), {args.steps} tokens per chunk",
        "threads": {},
    }
    for threads in args.threads:
        print(f"[bench] {threads} thread(s): LeRobot ...", file=sys.stderr, flush=True)
        lerobot = run_json([python, script, "--out", str(work), "--threads", str(threads), "--runs", str(args.runs)])
        row: dict[str, Any] = {"lerobot": {k: round(v, 2) for k, v in lerobot.items() if isinstance(v, float)}}
        own = [sys.executable, __file__, "--worker", "--work-dir", str(work), "--threads", str(threads)]
        for precision in ["fp32", *args.precisions]:
            print(f"[bench] {threads} thread(s): omni_ros eager {precision} ...", file=sys.stderr, flush=True)
            ours = run_json([*own, "--runs", str(args.runs), "--precision", precision])
            row[f"omni_{precision}"] = {k: v for k, v in ours.items() if k != "generated"}
            row[f"{precision}_over_lerobot"] = round(ours["chunk_ms"] / lerobot["chunk_ms"], 3)
            row[f"{precision}_same_tokens_as_lerobot"] = ours["generated"] == lerobot["generated"]
        report["threads"][str(threads)] = row
    report["targets"] = {
        f"eager_at_most_0.8x_lerobot_{t}_threads": r["fp32_over_lerobot"] <= 0.8 for t, r in report["threads"].items()
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
