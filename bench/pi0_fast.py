"""omni_ros vs LeRobot 0.6.1 on the very same edge-size pi0-FAST, observation and decode length, in one run.

    .venv/bin/python bench/pi0_fast.py [--threads 1 2] [--runs 3] [--steps 64] [--precisions bf16 int8]
        [--exports xnnpack onnx | --no-export] [--export-precisions int8]
        [--work-dir DIR] [--lerobot-venv DIR] [--out FILE]

LeRobot builds the model (scripts/lerobot_pi0fast_bench.py: bench/vs_lerobot.py's pi0 dims without the expert,
2 cameras at 480x640 -> 224 px, the fixtures' tiny tokenizer, a locally fitted FAST tokenizer, seeded random
weights) and times `predict_action_chunk` with its pre/post-processors; omni_ros loads the same folder
(`omni_ros.policy.load`) and times parse + inputs + the greedy KV-cached decode (`Pi0FastModel.generate`) in a
fresh process per row. Random weights never emit the end marker, so both decode exactly `--steps` tokens (the
generated ids are compared), and the FAST detokenizer is not timed (random tokens are not a FAST chunk: omni_ros
raises where LeRobot returns zeros; decoding a real chunk takes well under a millisecond).

Exported rows: the checkpoint is exported once per run into the work dir (`omni-ros export`: an ExecuTorch XNNPACK
`.pte`, an ONNX folder; `--export-precisions int8` adds an int8-dynamic `.pte`), and each is timed the same way,
tokens only: parse + inputs + the runner's own prefill + greedy `decode_step` loop (`runner.generate`, the
`token_generator` its `sample` detokenizes), with the runtime's threads set to the row's thread count. Every row
says whether its tokens are LeRobot's and eager fp32's (a quantized row may differ: it computes other logits). At
these random weights that is a plumbing check (an 8-step run emitted id 2, the BOS, at every step in every row):
test/test_export_pi0fast.py checks exported tokens where they vary.

Rows: chunk time, time to first token, tokens/s (decode phase) and the ratio to LeRobot. Targets: eager fp32 <=
0.8x LeRobot's chunk time; the fastest int8 row (eager or `.pte`) <= 0.4x, judged on a CPU with an int8 dot
product only (null elsewhere).
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

from common import add_precision_args, cpu_facts, emit

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


def exported_policy(backend: str, artifact: str, threads: int) -> Any:
    """The policy of an exported artifact, its runtime on `threads` threads (as policy.num_threads sets it)."""
    if backend == "xnnpack":
        from omni_ros.backends.executorch_runner import load_pte

        return load_pte(artifact, num_threads=threads)
    from omni_ros.backends.onnx_runner import load_onnx

    return load_onnx(artifact, num_threads=threads)


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch
    from safetensors.numpy import load_file

    import omni_ros.policy

    torch.set_num_threads(args.threads)
    work = Path(args.work_dir)
    meta = json.loads((work / f"{NAME}_inputs.json").read_text())
    tensors = load_file(work / f"{NAME}_inputs.safetensors")
    images = {k.removeprefix("observation.images."): tensors[k] for k in meta["cameras"]}
    obs = {"images": images, "state": tensors["observation.state"], "prompt": meta["prompt"]}
    if args.backend == "eager":
        # As the node and server run it: linears oneDNN-packed (policy.cpu_linear: packed), masked slots compacted,
        # the decode steps on the torch threads the runner's timing chose.
        policy = omni_ros.policy.load(work / NAME, precision=args.precision, cpu_linear="packed")
        eager = policy.runner

        def generate() -> Any:
            return eager.generate(policy.processor.inputs([policy.processor.parse(obs)]))

    else:
        # The runner's own token loop (prefill, then greedy decode_step over its static cache), not detokenized.
        policy = exported_policy(args.backend, args.artifact, args.threads)
        runner = policy.runner

        def generate() -> Any:
            inputs = policy.processor.inputs([policy.processor.parse(obs)], runner.device, runner.dtype)
            return runner.generate(inputs)

    def chunk() -> dict[str, Any]:
        start = time.perf_counter()
        out = generate()
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
    policy.close()
    result: dict[str, Any] = {
        k: round(float(np.median([r[k] for r in rows])), 2)
        for k in ("chunk_ms", "time_to_first_token_ms", "tokens_per_s")
    }
    result.update(tokens=rows[-1]["tokens"], generated=rows[-1]["ids"], precision=policy.metadata.precision)
    if args.backend != "eager":
        result["backend"] = policy.metadata.backend
    return result


# Exported rows: (row name, export target, --quantize); ONNX export takes no --quantize.
EXPORTS = {
    ("xnnpack", "fp32"): ("xnnpack", "none"),
    ("xnnpack", "int8"): ("xnnpack", "int8-dynamic"),
    ("onnx", "fp32"): ("onnx", "none"),
}
# CPU extensions (bench/common.py's cpu_facts names) that give an int8 dot product: the int8 target's condition.
INT8_DOT = ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")


def export_all(work: Path, wanted: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """Export the built checkpoint once per (backend, precision) into `work`/exports: {row: artifact, time}."""
    out_dir = work / "exports"
    out_dir.mkdir(exist_ok=True)
    done: dict[str, dict[str, Any]] = {}
    for backend, precision in wanted:
        target, quantize = EXPORTS[(backend, precision)]
        name = f"{backend}_{precision}"
        artifact = out_dir / (f"{NAME}_{name}.pte" if target == "xnnpack" else f"{NAME}_{name}")
        cmd = [sys.executable, "-m", "omni_ros.cli", "export", "--checkpoint", str(work / NAME), "--out",
               str(artifact), "--target", target, "--quantize", quantize]  # fmt: skip
        print(f"[bench] export {name} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"omni-ros export ({name}) failed:\n{proc.stderr[-4000:]}")
        files = [artifact] if artifact.is_file() else [f for f in artifact.rglob("*") if f.is_file()]
        done[name] = {
            "backend": backend,
            "artifact": str(artifact),
            "export_s": round(time.perf_counter() - start, 1),
            "bytes": sum(f.stat().st_size for f in files),
            "command": " ".join(["omni-ros", *cmd[3:]]),
        }
    return done


def int8_target(threads: dict[str, dict[str, Any]], extensions: list[str]) -> dict[str, Any]:
    """int8 <= 0.4x LeRobot per thread count, on the fastest int8 row; null without an int8 dot product."""
    dot = [e for e in extensions if e in INT8_DOT]
    targets: dict[str, Any] = {}
    for t, row in threads.items():
        ratios = {
            k.removesuffix("_over_lerobot"): v for k, v in row.items() if "int8" in k and k.endswith("_over_lerobot")
        }
        if not ratios:
            continue
        best = min(ratios, key=lambda k: ratios[k])
        targets[f"int8_at_most_0.4x_lerobot_{t}_threads"] = ratios[best] <= 0.4 if dot else None
        targets[f"int8_fastest_row_{t}_threads"] = best
    if targets:
        targets["int8_dot_product"] = dot or "none on this CPU: the int8 target is not judged here"
    return targets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=64, help="tokens decoded per chunk (max_decoding_steps)")
    parser.add_argument("--work-dir", default="/tmp/omni_pi0fast_bench")
    parser.add_argument("--lerobot-venv")
    parser.add_argument("--out")
    parser.add_argument(
        "--exports", nargs="*", choices=["xnnpack", "onnx"], default=["xnnpack", "onnx"],
        help="exported rows: ExecuTorch XNNPACK .pte, ONNX Runtime (default both)",
    )  # fmt: skip
    parser.add_argument("--no-export", action="store_true", help="no exported rows (eager and LeRobot only)")
    parser.add_argument(
        "--export-precisions", nargs="*", choices=["int8"], default=[],
        help="exported rows besides fp32: int8 = an int8-dynamic .pte (xnnpack only; default none)",
    )  # fmt: skip
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="eager", help=argparse.SUPPRESS)
    parser.add_argument("--artifact", help=argparse.SUPPRESS)
    add_precision_args(parser)
    args = parser.parse_args()
    if args.worker:
        args.threads = args.threads[0]
        print(json.dumps(worker(args)))
        return 0
    exports = [] if args.no_export else list(dict.fromkeys(args.exports))
    if args.export_precisions and "xnnpack" not in exports:
        parser.error("--export-precisions int8 is an int8-dynamic .pte: it needs --exports xnnpack")
    wanted = [(b, "fp32") for b in exports] + [("xnnpack", p) for p in args.export_precisions if "xnnpack" in exports]
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    python = str(lerobot_python(args.lerobot_venv))
    script = str(ROOT / "scripts" / "lerobot_pi0fast_bench.py")
    print("[bench] LeRobot builds the edge pi0-FAST ...", file=sys.stderr, flush=True)
    subprocess.run([python, script, "--out", str(work), "--build", "--steps", str(args.steps)], check=True,
                   capture_output=True)  # fmt: skip
    # The checkpoint is rebuilt each run, so are its exports (once, shared by every thread count).
    exported = export_all(work, wanted)
    report: dict[str, Any] = {
        "benchmark": "pi0_fast",
        "policy": f"pi0-FAST edge (2 x 480x640 -> 224 px, SigLIP 384x6, VLM 512x6), {args.steps} tokens per chunk",
        "timed": "parse + inputs + prefill + greedy decode (tokens only, no FAST detokenizer: random weights form "
        "no decodable chunk); exported rows: the runner's own loop over prefill / decode_step (runner.generate)",
        "exports": {k: {f: v for f, v in e.items() if f != "artifact"} for k, e in exported.items()},
        "threads": {},
    }
    for threads in args.threads:
        print(f"[bench] {threads} thread(s): LeRobot ...", file=sys.stderr, flush=True)
        lerobot = run_json([python, script, "--out", str(work), "--threads", str(threads), "--runs", str(args.runs)])
        row: dict[str, Any] = {"lerobot": {k: round(v, 2) for k, v in lerobot.items() if isinstance(v, float)}}
        own = [sys.executable, __file__, "--worker", "--work-dir", str(work), "--threads", str(threads)]
        eager_ids = None
        for precision in ["fp32", *args.precisions]:
            print(f"[bench] {threads} thread(s): omni_ros eager {precision} ...", file=sys.stderr, flush=True)
            ours = run_json([*own, "--runs", str(args.runs), "--precision", precision])
            eager_ids = ours["generated"] if precision == "fp32" else eager_ids
            row[f"omni_{precision}"] = {k: v for k, v in ours.items() if k != "generated"}
            row[f"{precision}_over_lerobot"] = round(ours["chunk_ms"] / lerobot["chunk_ms"], 3)
            row[f"{precision}_same_tokens_as_lerobot"] = ours["generated"] == lerobot["generated"]
        for name, export in exported.items():
            print(f"[bench] {threads} thread(s): omni_ros {name} ...", file=sys.stderr, flush=True)
            cmd = [*own, "--runs", str(args.runs), "--backend", export["backend"], "--artifact", export["artifact"]]
            ours = run_json(cmd)
            row[f"omni_{name}"] = {k: v for k, v in ours.items() if k != "generated"}
            row[f"{name}_over_lerobot"] = round(ours["chunk_ms"] / lerobot["chunk_ms"], 3)
            row[f"{name}_same_tokens_as_lerobot"] = ours["generated"] == lerobot["generated"]
            row[f"{name}_same_tokens_as_eager"] = ours["generated"] == eager_ids
        report["threads"][str(threads)] = row
    report["targets"] = {
        f"eager_at_most_0.8x_lerobot_{t}_threads": r["fp32_over_lerobot"] <= 0.8 for t, r in report["threads"].items()
    }
    report["cpu"] = cpu_facts()
    report["targets"].update(int8_target(report["threads"], report["cpu"].get("extensions", [])))
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
