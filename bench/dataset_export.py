"""`omni-ros dataset export` throughput: recorded seconds, frames and bag megabytes exported per wall second.

    .venv/bin/python bench/dataset_export.py [--seconds 20] [--threads 1 2] [--out FILE]

Records the planar sim (scripted expert, one episode of --seconds, no early end) with two 480x640 rgb8 cameras at
30 Hz and joint states / commands at 50 Hz into an mcap bag, then exports it at 30 fps once per encoder thread
count (SVT-AV1 `lp`, LeRobot's encoder settings), one after the other in fresh processes. Target: faster than real
time on 2 cores (a minute of recording exports in under a minute): real_time_factor = wall / recorded < 1.
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import cpu_facts, emit

ROOT = Path(__file__).resolve().parent.parent
CONFIG = """
name: dataset_bench
policy: {checkpoint: null, preset: tiny}
robot: {joint_names: [joint_1, joint_2, joint_3], control_rate_hz: 50.0, dry_run: false}
control: {position_lower: [-2.9], position_upper: [2.9]}
sim: {image_width: 640, image_height: 480, camera_rate_hz: 30.0, joint_state_rate_hz: 50.0, success_radius: 0.0}
"""


def omni(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "omni_ros.cli", *args], check=True, cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="recorded time (one episode)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "c.yaml").write_text(CONFIG)
        bag = tmp / "bag"
        t0 = time.perf_counter()
        omni("bag", "record-sim", "--episodes", "1", "--duration", str(args.seconds), "--config", str(tmp / "c.yaml"),
             "--out", str(bag), "-q")  # fmt: skip
        record_s = time.perf_counter() - t0
        bag_mb = sum(f.stat().st_size for f in bag.rglob("*") if f.is_file()) / 1e6
        runs = []
        for threads in args.threads:
            out = tmp / f"ds{threads}"
            start = time.perf_counter()
            omni("dataset", "export", str(bag), "--out", str(out), "--fps", "30", "--threads", str(threads), "-q")
            wall = time.perf_counter() - start
            info = json.loads((out / "meta" / "info.json").read_text())
            frames = info["total_frames"]
            recorded = frames / info["fps"]
            video_mb = sum(f.stat().st_size for f in (out / "videos").rglob("*.mp4")) / 1e6
            runs.append(
                {
                    "encoder_threads": threads,
                    "wall_s": round(wall, 2),
                    "frames": frames,
                    "recorded_s": round(recorded, 2),
                    "frames_per_s": round(frames / wall, 1),
                    "camera_frames_per_s": round(2 * frames / wall, 1),
                    "bag_mb_per_s": round(bag_mb / wall, 1),
                    "real_time_factor": round(wall / recorded, 3),
                    "video_mb": round(video_mb, 2),
                }
            )
    emit(
        {
            "benchmark": "dataset_export",
            "command": "bench/dataset_export.py " + " ".join(sys.argv[1:]),
            "cameras": "2 x 480x640 rgb8 at 30 Hz (planar sim render), joint states + commands 50 Hz, mcap",
            "bag_mb": round(bag_mb, 1),
            "record_s": round(record_s, 1),
            "machine": cpu_facts(),
            "python_process_per_export": True,
            "os_cpu_count": os.cpu_count(),
            "runs": runs,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
