"""omni_ros vs LeRobot 0.6.1 on the same X-VLA folder: chunk time, stages, peak RSS, real-time margin.

    .venv/bin/python bench/xvla.py [--threads 1 2] [--runs 3] [--tiny] [--fps 30] [--precisions bf16 int8]
        [--int8-kernels auto onednn xnnpack program] [--fp32-layouts packed dense] [--work-dir DIR]
        [--lerobot-venv DIR] [--out FILE]

LeRobot builds a random X-VLA (default: its 0.9 B config over Florence-2-large dims, 2 cameras at 480x640 ->
224 px; --tiny: the fixtures' sizes, to check the script) and saves it with its processors and the fixtures' tiny
BART tokenizer; it times observation -> preprocessor -> predict_action_chunk -> postprocessor in a fresh process
per thread count. omni_ros loads the same folder and times `infer` (fresh process per row). Real-time margin =
32 actions at --fps divided by the chunk time. Targets: eager <= 0.8x LeRobot, int8 <= 0.4x on an int8-dot CPU,
peak RSS <= 1.3x the fp32 weights. Each omni_ros row after fp32 gives its actions' relative L2 distance from
fp32's (`rel_l2_vs_fp32`; every row draws the same seeded noise), against the bounds of 1% (bf16) and 4% (int8).
int8 gets a row per `--int8-kernels` entry (`policy.int8_kernel`: auto, onednn, xnnpack, program; the first load of
xnnpack or program builds its kernels or program into the per-checkpoint cache, in a child process whose memory is
not in the row's peak RSS, and later loads reuse them: `load_s` says which). fp32 gets a row per `--fp32-layouts`
entry (`policy.cpu_linear`: packed, the node's default; dense, MKL's products on plain weights as LeRobot runs
them); the first fp32 row is the reference of `rel_l2_vs_fp32`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts"))

FULL_FLORENCE = {
    "vision_config": {
        "depths": [1, 1, 9, 1],
        "embed_dim": [256, 512, 1024, 2048],
        "num_heads": [8, 16, 32, 64],
        "num_groups": [8, 16, 32, 64],
        "window_size": 12,
        "projection_dim": 1024,
        "drop_path_rate": 0.0,
    },
    "text_config": {"vocab_size": 51289, "d_model": 1024, "encoder_layers": 12, "decoder_layers": 1},
}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def observation(seed: int = 0) -> tuple[dict, dict]:
    import numpy as np

    rng = np.random.default_rng(seed)
    images = {n: rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for n in ("top", "wrist")}
    state = rng.normal(0, 1, 20).astype(np.float32)
    return images, {"state": state, "prompt": "pick up the red cube"}


def lerobot_build(folder: Path, tiny: bool) -> None:
    """(LeRobot venv) a random X-VLA saved to `folder`."""
    import make_xvla_fixtures as fx
    import torch
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.xvla.configuration_xvla import XVLAConfig
    from lerobot.policies.xvla.modeling_xvla import XVLAPolicy
    from lerobot.policies.xvla.processor_xvla import make_xvla_pre_post_processors

    tok = fx.bart_like_tokenizer()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(folder))
    fx.ref._LocalAutoTokenizer.folders[fx.BART_NAME] = folder
    inputs = {f"observation.images.{n}": PolicyFeature(FeatureType.VISUAL, (3, 480, 640)) for n in ("top", "wrist")}
    inputs["observation.state"] = PolicyFeature(FeatureType.STATE, (20,))
    outputs = {"action": PolicyFeature(FeatureType.ACTION, (20,))}
    florence = fx.florence_config(len(tok), False) if tiny else dict(FULL_FLORENCE)
    florence["text_config"] = {**florence["text_config"], "vocab_size": max(len(tok), 400)}
    sizes = {"hidden_size": 32, "depth": 2, "num_heads": 2, "max_len_seq": 256} if tiny else {}
    config = XVLAConfig(
        input_features=inputs,
        output_features=outputs,
        device="cpu",
        florence_config=florence,
        tokenizer_name=fx.BART_NAME,
        resize_imgs_with_padding=(40, 48) if tiny else (224, 224),
        **sizes,
    )
    torch.manual_seed(0)  # the same weights every run: results comparable, the kernel cache reused
    policy = XVLAPolicy(config)
    pre, post = make_xvla_pre_post_processors(config, dataset_stats=None)
    policy.save_pretrained(str(folder))
    pre.save_pretrained(str(folder))
    post.save_pretrained(str(folder))


def lerobot_time(folder: Path, threads: int, runs: int) -> dict[str, Any]:
    import make_xvla_fixtures as fx
    import torch
    from lerobot.policies import factory
    from lerobot.policies.utils import prepare_observation_for_inference
    from lerobot.policies.xvla.modeling_xvla import XVLAPolicy

    torch.set_num_threads(threads)
    fx.ref._LocalAutoTokenizer.folders[fx.BART_NAME] = folder
    policy = XVLAPolicy.from_pretrained(str(folder)).eval()
    pre, post = factory.make_pre_post_processors(policy.config, pretrained_path=str(folder))
    images, rest = observation()
    obs = {f"observation.images.{k}": v for k, v in images.items()} | {"observation.state": rest["state"]}
    times = []
    for i in range(runs + 1):
        start = time.perf_counter()
        frame = prepare_observation_for_inference(dict(obs), torch.device("cpu"), task=rest["prompt"], robot_type="")
        post(policy.predict_action_chunk(pre(frame)))
        if i:
            times.append((time.perf_counter() - start) * 1e3)
    return {"chunk_ms": sorted(times)[len(times) // 2], "peak_rss_mb": peak_rss_mb()}


def omni_time(
    folder: Path, threads: int, runs: int, precision: str, int8_kernel: str, cpu_linear: str
) -> dict[str, Any]:
    import torch
    from common import cpu_facts

    from omni_ros.backends.stage_program import load_checkpoint

    torch.set_num_threads(threads)
    start = time.perf_counter()
    # The linears as the node runs them (policy.cpu_linear: packed unless --fp32-layouts says otherwise; fp32 only,
    # the other precisions swap them), through the node's loader (int8_kernel `program`, which `auto` picks on an
    # x86 CPU with VNNI and no AMX, is served there: the stages exported to one int8 program on its first load).
    pol = load_checkpoint(folder, precision=precision, cpu_linear=cpu_linear, int8_kernel=int8_kernel)
    load_s = time.perf_counter() - start
    images, rest = observation()
    obs = {"images": images, **rest}
    times, stages = [], {}
    for i in range(runs + 1):
        out = pol.infer(obs)
        if i:
            times.append(out["policy_timing"]["infer_ms"])
            stages = {k: out["policy_timing"][k] for k in ("preprocess_ms", "embed_prefix_ms", "denoise_ms")}
    weights_mb = (folder / "model.safetensors").stat().st_size / 2**20
    return {
        "chunk_ms": sorted(times)[len(times) // 2],
        "stages": stages,
        "load_s": round(load_s, 1),
        "peak_rss_mb": peak_rss_mb(),
        "weights_mb": weights_mb,
        "precision_chosen": pol.metadata.precision,
        # The same seeded noise in every row (policy seed 0): the precisions' actions are comparable.
        "actions": out["actions"].tolist(),
        "cpu": cpu_facts(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fps", type=float, default=30.0, help="the dataset's control rate (real-time margin)")
    parser.add_argument("--tiny", action="store_true", help="the fixtures' sizes (checks the script, no timing value)")
    parser.add_argument("--precisions", nargs="*", default=["fp32", "int8"])
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/omni_ros_xvla_bench"))
    parser.add_argument("--lerobot-venv", default=os.environ.get("LEROBOT_VENV", "/work/venv-lerobot"))
    parser.add_argument("--out")
    parser.add_argument("--role", choices=["driver", "lerobot-build", "lerobot-time", "omni-time"], default="driver")
    parser.add_argument(
        "--int8-kernels", nargs="+", default=["auto"], help="policy.int8_kernel of the int8 rows, a row each"
    )
    parser.add_argument(
        "--fp32-layouts",
        nargs="+",
        choices=["packed", "dense"],
        default=["packed"],
        help="policy.cpu_linear of the fp32 rows, a row each (default packed, the node's; dense: MKL's products on "
        "plain weights, as LeRobot runs them)",
    )
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args()
    folder = args.work_dir / ("xvla_tiny" if args.tiny else "xvla_full")
    if args.role == "lerobot-build":
        lerobot_build(folder, args.tiny)
        return 0
    if args.role in ("lerobot-time", "omni-time"):
        t = args.threads[0]
        row = lerobot_time(folder, t, args.runs) if args.role == "lerobot-time" else None
        row = row or omni_time(folder, t, args.runs, args.precision, args.int8_kernels[0], args.fp32_layouts[0])
        print(json.dumps(row))
        return 0
    import numpy as np
    from common import emit

    lerobot = str(Path(args.lerobot_venv) / "bin" / "python")
    common = [__file__, "--work-dir", str(args.work_dir), "--runs", str(args.runs)] + (["--tiny"] if args.tiny else [])
    subprocess.run([lerobot, *common, "--role", "lerobot-build"], check=True)

    def row(python: str, role: str, threads: int, *extra: str) -> dict:
        cmd = [python, *common, "--role", role, "--threads", str(threads), *extra]
        return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])

    rows = []
    for threads in args.threads:
        ref = row(lerobot, "lerobot-time", threads)
        fp32_actions = None
        # (int8_kernel, cpu_linear) of each precision's rows: only int8 has kernels and only fp32 keeps the linears
        per_precision = {
            "int8": [(k, "packed") for k in args.int8_kernels],
            "fp32": [("auto", x) for x in args.fp32_layouts],
        }
        variants = [(p, k, x) for p in args.precisions for k, x in per_precision.get(p, [("auto", "packed")])]
        for precision, kernel, layout in variants:
            extra = ["--precision", precision, "--int8-kernels", kernel, "--fp32-layouts", layout]
            ours = row(sys.executable, "omni-time", threads, *extra)
            actions = np.asarray(ours.pop("actions"))
            if precision == "fp32" and fp32_actions is None:  # the first fp32 row is the reference
                fp32_actions = actions
            elif fp32_actions is not None:
                # The issue's accuracy bounds on full-size weights: relative L2 distance from fp32's chunk.
                ours["rel_l2_vs_fp32"] = float(np.linalg.norm(actions - fp32_actions) / np.linalg.norm(fp32_actions))
            rows.append(
                {
                    "threads": threads,
                    "precision": precision,
                    "int8_kernel": kernel,
                    "cpu_linear": layout,
                    "lerobot_chunk_ms": ref["chunk_ms"],
                    "lerobot_peak_rss_mb": ref["peak_rss_mb"],
                    **ours,
                    "ratio_to_lerobot": ours["chunk_ms"] / ref["chunk_ms"],
                    "realtime_margin": (32 / args.fps * 1e3) / ours["chunk_ms"],
                    "rss_over_weights": ours["peak_rss_mb"] / ours["weights_mb"],
                }
            )
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "cpu"}), flush=True)
    report = {"benchmark": "xvla", "tiny": args.tiny, "fps": args.fps, "rows": rows}
    emit(report, args.out)  # with the command and the CPU
    return 0


if __name__ == "__main__":
    sys.exit(main())
