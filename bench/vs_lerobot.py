"""omni_ros vs LeRobot on the very same pi0 weights, observation and noise, side by side in one run.

    .venv/bin/python bench/vs_lerobot.py [--threads 1 2] [--runs 5] [--work-dir DIR] [--no-int8]
        [--precisions bf16 int8] [--compiled bf16 int8] [--wait-policies passive brief] [--lerobot-venv DIR]
        [--out FILE]

The edge-size pi0 (2 cameras at 480x640 -> 224 px tiles, SigLIP 384 x 6, VLM 512 x 6, expert 256 x 6,
horizon 50, 10 steps) is built with seeded random weights by LeRobot 0.6.1 itself and saved with its
`save_pretrained` (`scripts/lerobot_bench.py`, run in the LeRobot venv that `make reference-fixtures`
makes: .venv-lerobot or $LEROBOT_VENV). For each thread count, one after the other in fresh processes:
LeRobot's observation -> chunk (its pre-processor, `predict_action_chunk`, post-processor), omni_ros eager
(`omni_ros.policy.load` on the same folder, with the linears oneDNN-packed as the node and server run them,
`policy.cpu_linear: packed`, and with torch's plain nn.Linear, `dense`) and the same folder exported to
ExecuTorch XNNPACK int8, and eager again with each `policy.precision` of `--precisions` (bf16 GEMMs, int8 GEMMs:
no export) and with each of `--compiled` with `policy.compile` on (the vision tower, prefill and denoising step
compiled by TorchInductor; cold_start_s includes the compilation), once per `--wait-policies` entry, each set
against LeRobot run under the same OpenMP wait policy (the product's default, PASSIVE, sleeps at once; `brief`
spins ~0.3 ms first: on a 2-vCPU VM that decides whether a second thread pays for the bf16 / int8 chunks' many
small ops). Prints one JSON document: medians,
per-stage times, ratios to LeRobot, the actions' agreement (same noise; the precisions' relative L2 distance from
fp32's) and the targets (eager <= 0.8x LeRobot's time, int8 <= 0.4x, bf16 <= 0.6x).
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

from common import add_precision_args, cpu_facts, emit, median_ms

from omni_ros.cpu_threads import DEFAULT_WAIT_POLICY, WAIT_POLICIES, wait_policy_env

ROOT = Path(__file__).resolve().parent.parent
NAME = "pi0_edge"


def lerobot_python(venv: str | None) -> Path:
    venv_dir = Path(venv or os.environ.get("LEROBOT_VENV") or ROOT / ".venv-lerobot")
    python = venv_dir / "bin" / "python"
    if not python.is_file():
        sys.exit(f"no LeRobot venv at {venv_dir}: run `make reference-fixtures` (it makes one) or pass --lerobot-venv")
    return python


def run_json(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def inputs(work: Path) -> tuple[dict[str, Any], Any]:
    """The observation (our camera names) and the noise LeRobot used."""
    from safetensors.numpy import load_file

    meta = json.loads((work / f"{NAME}_inputs.json").read_text())
    tensors = load_file(work / f"{NAME}_inputs.safetensors")
    images = {k.removeprefix("observation.images."): tensors[k] for k in meta["cameras"]}
    return {"images": images, "state": tensors["observation.state"], "prompt": meta["prompt"]}, tensors["noise"][0]


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One implementation in this fresh process: cold start, median latency, stages, first actions."""
    t0 = time.perf_counter()
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work_dir)
    obs, noise = inputs(work)
    start = time.perf_counter()
    if args.worker == "eager":
        # The product's loader of a checkpoint (the backend factory's): the int8 program kernel included.
        from omni_ros.backends.stage_program import load_checkpoint

        policy = load_checkpoint(
            work / NAME,
            cpu_linear=args.cpu_linear,
            precision=args.precision,
            int8_kernel=args.int8_kernel,
            compile=args.compile,
        )
    else:
        from omni_ros.backends.executorch_runner import load_pte

        policy = load_pte(args.pte, num_threads=args.threads)
    load_s = time.perf_counter() - start
    first = policy.infer(obs, noise=noise)
    cold = time.perf_counter() - t0
    timings: list[dict[str, float]] = []

    def once() -> None:
        timings.append(policy.infer(obs, noise=noise)["policy_timing"])

    result = {
        "cold_start_s": round(cold, 2),
        "load_s": round(load_s, 2),
        "latency_ms": median_ms(once, args.runs, warmup=1),
        "stages_ms": {k: round(float(np.median([t[k] for t in timings])), 1) for k in timings[0] if k.endswith("_ms")},
        "actions": np.asarray(first["actions"]).tolist(),
        "peak_rss_mb": peak_rss_mb(),
        "precision": policy.metadata.precision,
    }
    return result


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--work-dir", default="/tmp/omni_vs_lerobot", help="LeRobot's saved policy and inputs")
    parser.add_argument("--lerobot-venv", help="the LeRobot venv (default .venv-lerobot or $LEROBOT_VENV)")
    parser.add_argument("--no-int8", action="store_true", help="skip the ExecuTorch int8 export and run")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--worker", choices=["eager", "pte"], help=argparse.SUPPRESS)
    parser.add_argument("--pte", help=argparse.SUPPRESS)
    parser.add_argument("--cpu-linear", default="packed", help=argparse.SUPPRESS)
    add_precision_args(parser)
    parser.add_argument("--int8-kernel", default="auto", help="policy.int8_kernel of the int8 row (default auto)")
    parser.add_argument(
        "--compiled",
        nargs="*",
        default=[],
        help="rows at these policy.precision values with policy.compile on (keys int8_compiled, ...; default none)",
    )
    parser.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--wait-policies",
        nargs="+",
        choices=WAIT_POLICIES,
        help=f"run the precision rows under each policy.omp_wait_policy (default: the product's, "
        f"{DEFAULT_WAIT_POLICY}); another policy's rows and targets carry its name (int8_brief_over_lerobot)",
    )
    args = parser.parse_args()
    if args.worker:
        args.threads = args.threads[0]
        print(json.dumps(worker(args)))
        return 0

    import numpy as np

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    python = lerobot_python(args.lerobot_venv)
    bench_script = str(ROOT / "scripts" / "lerobot_bench.py")
    report: dict[str, Any] = {
        "benchmark": "vs_lerobot",
        "policy": "pi0 edge (2 x 480x640 cameras -> 224 px, SigLIP 384x6, VLM 512x6, expert 256x6, H 50, 10 steps)",
        "machine": cpu_facts(),
        "threads": {},
    }
    pte = work / f"{NAME}_int8.pte"
    wait_policies = args.wait_policies or [DEFAULT_WAIT_POLICY]
    for threads in args.threads:
        print(f"[bench] {threads} thread(s): LeRobot ...", file=sys.stderr, flush=True)
        lerobot_cmd = [str(python), bench_script, "--policy", "pi0", "--threads", str(threads),
                       "--out", str(work), "--runs", str(args.runs)]  # fmt: skip
        lerobot = run_json(lerobot_cmd)
        # Each wait policy's rows are set against LeRobot run under the same policy.
        lerobot_ms = {DEFAULT_WAIT_POLICY: lerobot["latency_ms"]}
        for wait_policy in [w for w in wait_policies if w != DEFAULT_WAIT_POLICY]:
            print(f"[bench] {threads} thread(s): LeRobot, wait policy {wait_policy} ...", file=sys.stderr, flush=True)
            lerobot_ms[wait_policy] = run_json(lerobot_cmd, env=wait_policy_env(wait_policy))["latency_ms"]
        if not args.no_int8 and not pte.exists():
            print("[bench] exporting the LeRobot folder to XNNPACK int8 ...", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "omni_ros.cli", "export", "--checkpoint", str(work / NAME),
                            "--quantize", "int8-dynamic", "--out", str(pte),
                            "--methods", "encode_images", "prefill", "denoise_step"], check=True, cwd=ROOT)  # fmt: skip
        own = [sys.executable, __file__, "--work-dir", str(work), "--threads", str(threads), "--runs", str(args.runs)]
        print(f"[bench] {threads} thread(s): omni_ros eager ...", file=sys.stderr, flush=True)
        eager = run_json([*own, "--worker", "eager"])
        print(f"[bench] {threads} thread(s): omni_ros eager, dense linears ...", file=sys.stderr, flush=True)
        dense = run_json([*own, "--worker", "eager", "--cpu-linear", "dense"])
        row: dict[str, Any] = {
            "lerobot_ms": round(lerobot["latency_ms"], 1),
            "lerobot_stages_ms": {k: round(v["median_ms"], 1) for k, v in lerobot["stages"].items()},
            "lerobot_cold_start_s": round(lerobot["cold_start"]["total_s"], 2),
            "lerobot_peak_rss_mb": round(lerobot["peak_rss_mb"], 1),
            "omni_eager": {k: v for k, v in eager.items() if k != "actions"},
            "eager_over_lerobot": round(eager["latency_ms"] / lerobot["latency_ms"], 3),
            "omni_eager_dense": {k: v for k, v in dense.items() if k != "actions"},
            "eager_dense_over_lerobot": round(dense["latency_ms"] / lerobot["latency_ms"], 3),
            # Same weights, observation and noise: the first action row must agree (LeRobot stores that row).
            "eager_first_row_max_abs_vs_lerobot": float(
                np.abs(np.asarray(eager["actions"][0]) - np.asarray(lerobot["actions_first_row"])).max()
            ),
        }
        reference = np.asarray(eager["actions"])
        rows = [(p, False) for p in args.precisions] + [(p, True) for p in args.compiled]
        for wait_policy, (precision, compiled) in [(w, r) for w in wait_policies for r in rows]:
            # The product's default wait policy keeps the plain keys; another one suffixes them ("int8_brief").
            name = f"{precision}_compiled" if compiled else precision
            key = name if wait_policy == DEFAULT_WAIT_POLICY else f"{name}_{wait_policy}"
            print(f"[bench] {threads} thread(s): omni_ros eager, {key} ...", file=sys.stderr, flush=True)
            cmd = [*own, "--worker", "eager", "--precision", precision, "--int8-kernel", args.int8_kernel]
            cmd += ["--compile"] if compiled else []
            quantized = run_json(cmd, env=wait_policy_env(wait_policy))
            row[f"omni_{key}"] = {k: v for k, v in quantized.items() if k != "actions"}
            if wait_policy != DEFAULT_WAIT_POLICY:
                row[f"lerobot_ms_{wait_policy}"] = round(lerobot_ms[wait_policy], 1)
            row[f"{key}_over_lerobot"] = round(quantized["latency_ms"] / lerobot_ms[wait_policy], 3)
            diff = np.asarray(quantized["actions"]) - reference
            row[f"{key}_rel_l2_vs_fp32"] = round(float(np.linalg.norm(diff) / np.linalg.norm(reference)), 5)
        if not args.no_int8:
            print(f"[bench] {threads} thread(s): omni_ros ExecuTorch int8 ...", file=sys.stderr, flush=True)
            int8 = run_json([*own, "--worker", "pte", "--pte", str(pte)])
            row["omni_pte_int8"] = {k: v for k, v in int8.items() if k != "actions"}
            row["pte_int8_over_lerobot"] = round(int8["latency_ms"] / lerobot["latency_ms"], 3)
            row["int8_max_abs_vs_eager"] = float(
                np.abs(np.asarray(int8["actions"]) - np.asarray(eager["actions"])).max()
            )
        report["threads"][str(threads)] = row
    report["targets"] = {
        f"eager_at_most_0.8x_lerobot_{t}_threads": r["eager_over_lerobot"] <= 0.8 for t, r in report["threads"].items()
    }
    budgets = {"int8": (0.4, 0.04), "bf16": (0.6, 0.01)}  # the time ratio and relative L2 bounds
    suffixes = ["" if w == DEFAULT_WAIT_POLICY else f"_{w}" for w in wait_policies]
    for t, r in report["threads"].items():
        for (precision, (ratio, rel)), variant, suffix in [
            (b, v, s) for b in budgets.items() for v in ("", "_compiled") for s in suffixes
        ]:
            key = precision + variant + suffix
            if f"{key}_over_lerobot" in r:
                report["targets"][f"{precision}{variant}_at_most_{ratio}x_lerobot_{t}_threads{suffix}"] = (
                    r[f"{key}_over_lerobot"] <= ratio
                )
                report["targets"][f"{precision}{variant}_within_{rel}_rel_l2_{t}_threads{suffix}"] = (
                    r[f"{key}_rel_l2_vs_fp32"] <= rel
                )
        if "pte_int8_over_lerobot" in r:
            report["targets"][f"pte_int8_at_most_0.4x_lerobot_{t}_threads"] = r["pte_int8_over_lerobot"] <= 0.4
    report["machine"]["load_average_after"] = os.getloadavg()
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
