"""Eager torch vs ONNX Runtime (CPU EP) vs ExecuTorch XNNPACK fp32 / int8 on one CPU, in one run; then the HTP.

    .venv/bin/python bench/onnx_backends.py [--preset small] [--threads 2] [--runs 10] [--work-dir DIR] [--out FILE]

CPU part: the preset (seeded random weights) exported to an ONNX folder and to XNNPACK fp32 / int8-dynamic `.pte`
files (all reused from --work-dir when already there), each backend measured in its own fresh process one after the
other: cold start (construct + first inference), per-stage medians, end-to-end (observation -> action chunk) medians
of the staged and the fused graphs, peak RSS, and the chunk's distance from eager (same weights, same noise).

HTP part: the preset shaped for the simulated arm (3 joints, so the simulator can calibrate it), exported with
--target qnn-onnx (16a8w, staged graphs), then on onnxruntime-qnn's x86 HTP emulator: where the operators run, the
time to compile each graph for the SoC and to load it from the compiled cache, and the accuracy against eager on
simulator observations the calibration did not see. The emulator's speed is that of a CPU emulating the HTP and
says nothing about the NPU's: it is reported as such, never compared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import backends
import numpy as np
from common import emit, median_ms

ARM = {"state_dim": 3, "action_dim": 3}


def onnx_worker(args: argparse.Namespace) -> dict[str, Any]:
    """ONNX Runtime's CPU EP in this (fresh) process."""
    import torch

    from omni_ros.backends.onnx_runner import load_onnx

    torch.set_num_threads(args.threads[0])
    start = time.perf_counter()
    policy = load_onnx(args.onnx, providers=["cpu"], num_threads=args.threads[0], mode="staged")
    obs = backends.observation(policy.metadata.camera_names, policy.metadata.state_dim)
    first = policy.infer(obs)
    result: dict[str, Any] = {"cold_start_ms": round((time.perf_counter() - start) * 1e3, 1)}
    # Each graph timed on the very inputs one inference gave it (the family's stage plan chains them).
    runner, recorded = policy.runner, record_calls(policy, obs)
    repeats = {"denoise_step": 3}
    result["methods_ms"] = {
        m: median_ms(lambda m=m: runner._call(m, recorded[m]), args.runs * repeats.get(m, 1)) for m in recorded
    }
    staged = median_ms(lambda: policy.infer(obs), args.runs)
    policy.close()
    fused = load_onnx(args.onnx, providers=["cpu"], num_threads=args.threads[0], mode="fused")
    fused_actions = fused.infer(obs)["actions"]
    result["fused_matches_staged_max_abs"] = float(np.abs(fused_actions - first["actions"]).max())
    result["end_to_end_ms"] = {"staged": staged, "fused": median_ms(lambda: fused.infer(obs), args.runs)}
    sample = record_calls(fused, obs)["sample"]
    result["methods_ms"]["sample"] = median_ms(lambda: fused.runner._call("sample", sample), args.runs)
    result["peak_rss_mb"] = backends.peak_rss_mb()
    result["actions"] = first["actions"].tolist()
    return result


def record_calls(policy, obs: dict[str, Any]) -> dict[str, list]:
    """The inputs of the first call of each graph during one inference of `policy` (an ONNX runner)."""
    runner, recorded = policy.runner, {}
    call = runner._call

    def recording(method: str, tensors: list) -> list:
        recorded.setdefault(method, list(tensors))
        return call(method, tensors)

    runner._call = recording
    try:
        policy.infer(obs)
    finally:
        del runner._call  # back to the class's method
    return recorded


def run_onnx_worker(args: argparse.Namespace, threads: int, folder: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", "onnx", "--onnx", str(folder), "--threads", str(threads)]
    cmd += ["--runs", str(args.runs)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"onnx worker failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def export_cpu_models(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The ONNX folder and the two .pte files of the preset, exported unless already there."""
    from omni_ros.export.exporter import export_preset
    from omni_ros.export.sidecar import read_onnx_sidecar, read_sidecar

    exports: dict[str, Any] = {}
    folder = work / f"{args.preset}_onnx"
    try:
        reused = read_onnx_sidecar(folder).model.name == args.preset
    except Exception:
        reused = False
    if not reused:
        result = export_preset(args.preset, folder, target="onnx")
        exports["onnx_fp32"] = {
            "export_s": round(result.seconds, 1),
            **{k: round(v, 1) for k, v in result.timings.items()},
        }
        exports["onnx_fp32"]["exporter_peak_rss_mb"] = backends.peak_rss_mb()
    else:
        exports["onnx_fp32"] = {"reused": str(folder)}
    sidecar = read_onnx_sidecar(folder)
    exports["onnx_fp32"]["mb"] = round(sum(d["bytes"] for d in sidecar.files.values()) / 1e6, 2)
    exports["onnx_fp32"]["nodes"] = {m: r["nodes"] for m, r in sidecar.delegation.items()}
    for variant, recipe in backends.RECIPES.items():
        pte = work / f"{args.preset}_{variant}.pte"
        try:
            reused = read_sidecar(pte).model.name == args.preset and read_sidecar(pte).quantize == recipe
        except Exception:
            reused = False
        if not reused:
            result = export_preset(args.preset, pte, quantize=recipe)
            exports[variant] = {"export_s": round(result.seconds, 1)}
        else:
            exports[variant] = {"reused": str(pte)}
        exports[variant]["pte_mb"] = round(pte.stat().st_size / 1e6, 2)
    return exports


def htp_part(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The preset for the simulated arm on the HTP emulator: export, placement, compile/load, accuracy."""
    import torch

    from omni_ros.backends.onnx_runner import OnnxRunner, load_onnx
    from omni_ros.export.calibration import sim_observations
    from omni_ros.export.exporter import export_preset
    from omni_ros.export.ort_session import CACHE_MANIFEST, context_file
    from omni_ros.export.qnn import QnnOptions
    from omni_ros.export.sidecar import read_onnx_sidecar
    from omni_ros.policy.loading import from_preset
    from omni_ros.policy.pi0.presets import preset

    torch.set_num_threads(args.threads[0])
    folder = work / f"{args.preset}_arm_qnn16"
    staged = ("encode_images", "prefill", "denoise_step")
    qnn = QnnOptions(soc=args.soc, precision="16a8w", calibration_samples=args.calibration_samples)
    result = export_preset(args.preset, folder, target="qnn-onnx", methods=staged, qnn=qnn, calibration="sim", **ARM)
    sidecar = read_onnx_sidecar(folder)
    manifest = json.loads((folder / CACHE_MANIFEST).read_text())
    out: dict[str, Any] = {
        "note": "x86 HTP emulator (onnxruntime-qnn): placement, accuracy and compile/load times are the HTP's; its "
        "speed is a CPU emulating the HTP and says nothing about the NPU",
        "soc": args.soc,
        "precision": "16a8w",
        "export_s": round(result.seconds, 1),
        "export_timings_s": {k: round(v, 2) for k, v in result.timings.items()},
        "placement": {m: sidecar.delegation[m]["placement"] for m in staged},
        "qdq_nodes": {m: sidecar.delegation[m]["nodes"] for m in staged},
        "compile_s": {m: round(manifest["methods"][m]["compile_s"], 2) for m in staged},
    }
    start = time.perf_counter()
    runner = OnnxRunner(folder, providers=["qnn-htp"])
    out["load_from_cache_s"] = round(time.perf_counter() - start, 3)
    assert runner.cache_status == dict.fromkeys(staged, "loaded"), runner.cache_status
    runner.close()
    (folder / context_file("prefill")).unlink()
    start = time.perf_counter()
    runner = OnnxRunner(folder, providers=["qnn-htp"])
    out["load_compiling_prefill_s"] = round(time.perf_counter() - start, 3)
    runner.close()
    reference = from_preset(args.preset, **ARM)
    htp = load_onnx(folder, providers=["qnn-htp"])
    diffs, rel, scale = [], [], 0.0
    stage_ms: dict[str, list[float]] = {"embed_prefix_ms": [], "prefill_ms": [], "denoise_ms": []}
    for obs in sim_observations(preset(args.preset, **ARM), args.accuracy_samples, seed=1000):
        expected = reference.infer(obs)["actions"]
        got = htp.infer(obs)
        for key in stage_ms:
            stage_ms[key].append(got["policy_timing"][key])
        diffs.append(float(np.abs(got["actions"] - expected).max()))
        rel.append(float(np.linalg.norm(got["actions"] - expected) / np.linalg.norm(expected)))
        scale = max(scale, float(np.abs(expected).max()))
    out["accuracy_vs_eager"] = {
        "observations": len(diffs),
        "max_abs": round(max(diffs), 5),
        "mean_max_abs": round(float(np.mean(diffs)), 5),
        "relative_l2_mean": round(float(np.mean(rel)), 5),
        "eager_max_abs_action": round(scale, 3),
    }
    out["emulator_stage_ms_median"] = {k: round(float(np.median(v)), 1) for k, v in stage_ms.items()}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--threads", type=int, nargs="+", default=[2], help="thread counts to compare at")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--soc", default="SM8650", help="the SoC the HTP graphs are compiled for")
    parser.add_argument("--calibration-samples", type=int, default=16)
    parser.add_argument("--accuracy-samples", type=int, default=4)
    parser.add_argument("--skip-htp", action="store_true", help="only the CPU part")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--work-dir", default="/tmp/omni_ros_bench_backends", help="exports, reused when there")
    # A worker measures one ONNX folder in a fresh process.
    parser.add_argument("--onnx", help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=["onnx"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "onnx":
        return print(json.dumps(onnx_worker(args))) or 0
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    exports = export_cpu_models(args, work)
    by_threads = {}
    for threads in args.threads:
        results = {"eager": backends.run_worker("eager", args, threads)}
        results["onnxruntime_cpu_fp32"] = run_onnx_worker(args, threads, work / f"{args.preset}_onnx")
        for variant in backends.RECIPES:
            results[variant] = backends.run_worker("pte", args, threads, work / f"{args.preset}_{variant}.pte")
        by_threads[f"threads_{threads}"] = backends.compare(results)
    flags = Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0] if Path("/proc/cpuinfo").exists() else ""
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "avx512": "avx512f" in flags}
    machine["load_average"] = [round(x, 2) for x in os.getloadavg()]
    report = {
        "benchmark": "onnx_backends",
        **{k: getattr(args, k) for k in ("preset", "threads", "runs")},
        "machine": machine,
        "targets": {"onnxruntime_cpu_fp32_speedup_vs_eager": 1.0},
        "exports": exports,
        "results": by_threads,
    }
    if not args.skip_htp:
        report["htp_emulator"] = htp_part(args, work)
    report["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
