"""Training and inference speed of the `demo` preset on this machine, as JSON.

    .venv/bin/python bench/demo_training.py [--steps 20] [--batch 32] [--out bench/results/demo_training.json]

Measures, side by side in one run: one flow-matching training step with 1 and
with 2 torch threads (denormals flushed, as `omni-ros train` does), the same
step without flushing denormals, and one closed-loop inference (5 Euler steps)
of the demo model. On an idle CPU two threads are faster; on a CPU that other
processes also use, two OpenMP threads wait on each other at every parallel
region and one thread can be several times faster.
"""

from __future__ import annotations

import omni_ros  # noqa: F401  (before torch: its OpenMP thread settings, omni_ros/cpu_threads.py)

# isort: split
import argparse
from pathlib import Path

import numpy as np
import torch
from common import emit, median_ms

from omni_ros.observation import Observation
from omni_ros.policy.loading import from_preset
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.pi0.modeling import Pi0Model, count_parameters
from omni_ros.policy.pi0.presets import preset
from omni_ros.policy.train import Trainer


def step_ms(threads: int, flush: bool, steps: int, batch: int) -> float:
    torch.set_num_threads(threads)
    torch.set_flush_denormal(flush)
    cfg = preset("demo")
    torch.manual_seed(0)
    trainer = Trainer(Pi0Model(cfg), NormStats.identity(3, 3), lr=1e-3)
    rng = np.random.default_rng(0)
    s = cfg.vision.image_size
    obs = [
        Observation(
            {c: rng.integers(0, 255, (s, s, 3), dtype=np.uint8) for c in cfg.camera_names},
            dict.fromkeys(cfg.camera_names, True),
            rng.normal(size=3).astype(np.float32),
            "put the gripper on the yellow block",
        )
        for _ in range(batch)
    ]
    inputs = trainer.batch(obs, rng.normal(size=(batch, cfg.action_horizon, 3)).astype(np.float32))
    # Warm-up of 3: Adam moments shrink into denormals after a few steps.
    return median_ms(lambda: trainer.step(inputs), steps, warmup=3)


def infer_ms(runs: int) -> float:
    torch.set_num_threads(1)
    policy = from_preset("demo")
    rng = np.random.default_rng(0)
    obs = {
        "images": {c: rng.integers(0, 255, (224, 224, 3), dtype=np.uint8) for c in ("base", "wrist")},
        "state": np.zeros(3, np.float32),
        "prompt": "reach the red block",
    }
    return median_ms(lambda: policy.infer(obs), runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    with torch.device("meta"):
        params = count_parameters(Pi0Model(preset("demo")))["total"]
    result = {
        "preset": "demo",
        "parameters": params,
        "batch": args.batch,
        "train_step_ms_1_thread": step_ms(1, True, args.steps, args.batch),
        "train_step_ms_2_threads": step_ms(2, True, args.steps, args.batch),
        "train_step_ms_1_thread_denormals_kept": step_ms(1, False, args.steps, args.batch),
        "infer_ms_1_thread": infer_ms(3 * args.steps),
        "load_average_1min": float(Path("/proc/loadavg").read_text().split()[0]),
    }
    emit(result, args.out)


if __name__ == "__main__":
    main()
