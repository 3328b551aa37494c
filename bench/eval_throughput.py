"""Offline evaluation throughput: observations evaluated per second, and where the time goes.

    .venv/bin/python bench/eval_throughput.py [--presets tiny small] [--seconds 6] [--every 3] [--threads 1]
                                              [--storage mcap] [--compressed] [--out FILE]

Writes a generated 2-camera bag (224x224 rgb8 frames at 30 Hz per camera, joint states and commands at
50 Hz) and replays it offline through the evaluator with each preset (random weights), one after the
other in this process. Reports observations per second and the share of the replay's wall time spent in
bag reading + CDR decoding, observation assembly (image conversion, assembler) and inference. Prints one
JSON document.
"""

from __future__ import annotations

import omni_ros  # noqa: F401  (before torch: its OpenMP thread settings, omni_ros/cpu_threads.py)

# isort: split
import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import emit

from omni_ros.eval.replay import Replayer
from omni_ros.eval.synthetic import SyntheticSpec, write_synthetic_bag
from omni_ros.policy.loading import from_preset


def bench_preset(name: str, bag: Path, spec: SyntheticSpec, every: int) -> dict:
    config = spec.config(every_k_frames=every)
    cams = list(spec.cameras)
    dims = len(spec.joint_names)
    policy = from_preset(name, camera_names=cams, state_dim=dims, action_dim=dims)
    # One call first: the replay measures steady-state inference, not lazy initialisation.
    warm = Replayer(config, policy)
    warm.policy.infer({"images": {c: spec_frame(spec) for c in cams}, "state": spec.state(0.0), "prompt": spec.prompt})
    start = time.perf_counter()
    result = Replayer(config, policy).run([str(bag)])
    wall = time.perf_counter() - start
    t = result.timing
    evaluated = sum(len(e.predictions) for e in result.episodes)
    messages = sum(b.messages for b in result.bags)
    overhead = t.read_s + t.assemble_s
    return {
        "observations": evaluated,
        "messages": messages,
        "wall_s": round(wall, 3),
        "observations_per_s": round(evaluated / wall, 2),
        "messages_per_s": round(messages / wall, 1),
        "share_read_decode": round(t.read_s / t.total_s, 4),
        "share_assembly": round(t.assemble_s / t.total_s, 4),
        "share_decode_and_assembly": round(overhead / t.total_s, 4),
        "share_inference": round(t.infer_s / t.total_s, 4),
        "ms_per_observation": {
            "read_decode": round(1e3 * t.read_s / max(evaluated, 1), 3),
            "assembly": round(1e3 * t.assemble_s / max(evaluated, 1), 3),
            "inference": round(1e3 * t.infer_s / max(evaluated, 1), 3),
        },
        "target_decode_and_assembly_below_10pct": overhead / t.total_s < 0.10,
    }


def spec_frame(spec: SyntheticSpec):
    import numpy as np

    return np.zeros((spec.image_size, spec.image_size, 3), dtype=np.uint8)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--seconds", type=float, default=6.0, help="length of the generated bag")
    parser.add_argument("--every", type=int, default=3, help="an inference every k-th base frame (3: 10 Hz)")
    # One thread by default: on a shared 2-core machine a second torch thread mostly waits for the other user.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--storage", choices=["mcap", "sqlite3"], default="mcap")
    parser.add_argument("--compressed", action="store_true", help="CompressedImage (png) instead of raw Image")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = SyntheticSpec(
        duration_s=args.seconds,
        image_size=224,
        cameras={"base": ("/camera/base/image_raw", 30.0), "wrist": ("/camera/wrist/image_raw", 30.0)},
        compressed=args.compressed,
    )
    report: dict = {
        "benchmark": "eval_throughput",
        "torch": torch.__version__,
        "threads": args.threads,
        "machine": {"cpu": platform.machine(), "python": platform.python_version()},
        "bag": {
            "storage": args.storage,
            "seconds": args.seconds,
            "cameras": 2,
            "image": "224x224 " + ("png CompressedImage" if args.compressed else "rgb8 Image"),
            "camera_hz": 30,
            "joint_state_hz": 50,
            "command_hz": 50,
            "every_k_frames": args.every,
        },
        "presets": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        bag = write_synthetic_bag(Path(tmp) / "bag", spec, storage=args.storage)
        report["bag"]["bytes"] = sum(p.stat().st_size for p in bag.iterdir())
        for name in args.presets:
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            report["presets"][name] = bench_preset(name, bag, spec, args.every)
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
