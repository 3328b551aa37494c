"""Observations to calibrate a quantized export on: the simulator, a recorded dataset, or random tensors.

    sim        the simulated arm (`omni_ros.sim`): rendered camera images, joint states and task prompts
               from episodes of different seeds, the arm moved to varied poses
    DIR        a demonstration dataset folder (`omni-ros sim collect`, shards + meta.json): recorded observations
    random     uniform pixels, random prompts and states (only for plumbing tests: ranges will not match data)

Observations go through the model family's own processor (parsing, tiling, the tokenizer, the norm stats), so
the activation ranges are measured on exactly what the model sees at run time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from omni_ros.errors import OmniRosError
from omni_ros.policy.family_base import ChunkConfig
from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.normalize import NormStats

SOURCES = ("sim", "random")


class CalibrationError(OmniRosError, ValueError):
    """The calibration source cannot give observations for this model."""


def sim_observations(cfg: ChunkConfig, samples: int, seed: int = 0) -> list[dict[str, Any]]:
    """`samples` observations of the simulated arm: one episode per sample, the arm moved to a random pose."""
    from omni_ros.sim.config import SimConfig
    from omni_ros.sim.env import SimEnv

    sim = SimConfig()
    missing = [c for c in cfg.camera_names if c not in sim.cameras]
    if missing or cfg.state_dim != sim.n_joints:
        raise CalibrationError(
            f"--calibration sim: the simulator has cameras {sim.cameras} and {sim.n_joints} joints, the model needs "
            f"cameras {list(cfg.camera_names)} and state_dim {cfg.state_dim}; calibrate on recorded observations "
            "instead (--calibration DATASET_DIR)"
        )
    env = SimEnv(sim)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(samples):
        env.reset(seed=seed + i)
        # Somewhere between the start pose and a reach: the arm and its shadow move through the images.
        env.command(env.state + rng.uniform(-0.8, 0.8, size=sim.n_joints))
        env.step(float(rng.uniform(0.1, 0.6)))
        obs = env.observe()
        obs["images"] = {c: obs["images"][c] for c in cfg.camera_names}
        out.append(obs)
    return out


def dataset_observations(path: str | Path, cfg: ChunkConfig, samples: int) -> list[dict[str, Any]]:
    """`samples` observations spread evenly over a recorded dataset."""
    from omni_ros.sim.dataset import DatasetError, iter_samples, read_meta

    try:
        meta = read_meta(path)
    except DatasetError as exc:
        raise CalibrationError(f"--calibration {path}: {exc}") from exc
    missing = [c for c in cfg.camera_names if c not in meta.cameras]
    if missing or meta.state_dim != cfg.state_dim:
        raise CalibrationError(
            f"--calibration {path}: the dataset has cameras {meta.cameras} and state_dim {meta.state_dim}, the model "
            f"needs cameras {list(cfg.camera_names)} and state_dim {cfg.state_dim}"
        )
    if meta.samples < 1:
        raise CalibrationError(f"--calibration {path}: the dataset holds no samples")
    wanted = set(np.linspace(0, meta.samples - 1, min(samples, meta.samples)).round().astype(int).tolist())
    out = []
    for i, sample in enumerate(iter_samples(path)):
        if i in wanted:
            obs = sample.observation()
            obs["images"] = {c: obs["images"][c] for c in cfg.camera_names}
            out.append(obs)
        if len(out) == len(wanted):
            break
    return out


def calibration_observations(source: str, cfg: ChunkConfig, samples: int, seed: int = 0) -> list[dict] | None:
    """Raw observations from `source` (sim, random or a dataset folder); None for random."""
    if samples < 1:
        raise CalibrationError("calibration needs at least one sample")
    if source == "random":
        return None
    if source == "sim":
        return sim_observations(cfg, samples, seed)
    if not Path(source).is_dir():
        raise CalibrationError(f"--calibration {source!r}: not 'sim', 'random' or a dataset folder")
    return dataset_observations(source, cfg, samples)


def observation_inputs(
    cfg: ChunkConfig, tokenizer: Any, norm_stats: NormStats, observations: list[dict[str, Any]]
) -> list[ModelInputs]:
    """Each observation through the family's processor, as the policy runs it: model inputs of batch 1."""
    from omni_ros.policy import families

    processor = families.get(cfg.family).build_processor(cfg, norm_stats, tokenizer)
    cpu = torch.device("cpu")
    return [processor.inputs([processor.parse(obs)], cpu, torch.float32) for obs in observations]
