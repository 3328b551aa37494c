"""Observations to calibrate a quantized export on: the simulator, a recorded dataset, or random tensors.

    auto       (the default) sim when the model fits the simulated arm, else spec; the export says which
    sim        the simulated arm (`omni_ros.sim`): rendered camera images, joint states and task prompts
               from episodes of different seeds, the arm moved to varied poses
    spec       drawn from the model's own spec, for a model no recorded data fits (the built-in presets): the
               simulator's rendered frames as its cameras (in turn), states drawn from its norm stats (mean +- std,
               or between its quantiles), the simulator's task prompts
    DIR        a demonstration dataset folder (`omni-ros sim collect`, shards + meta.json): recorded observations
    random     uniform pixels, prompts of random words, states drawn as for spec (only for plumbing tests:
               ranges will not match data)

Observations go through the model family's own processor (parsing, tiling, the tokenizer, the norm stats), so
the activation ranges are measured on exactly what the model sees at run time. A checkpoint serving several
embodiments (X-VLA's domains) is calibrated across them: observation i is for domain i mod the checkpoint's count.
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

SOURCES = ("auto", "sim", "spec", "random")


class CalibrationError(OmniRosError, ValueError):
    """The calibration source cannot give observations for this model."""


def sim_mismatch(cfg: ChunkConfig) -> str | None:
    """Why the simulated arm cannot stand in for this model's robot (None: it can)."""
    from omni_ros.sim.config import SimConfig

    sim = SimConfig()
    missing = [c for c in cfg.camera_names if c not in sim.cameras]
    if missing or cfg.state_dim != sim.n_joints:
        return (
            f"the simulator has cameras {sim.cameras} and {sim.n_joints} joints, the model needs "
            f"cameras {list(cfg.camera_names)} and state_dim {cfg.state_dim}"
        )
    return None


def resolve_source(source: str, cfg: ChunkConfig) -> tuple[str, str]:
    """(the source to use, why) for `source`; `auto` is sim when the model fits the simulated arm, else spec."""
    if source != "auto":
        return source, ""
    mismatch = sim_mismatch(cfg)
    if mismatch is None:
        return "sim", ""
    return "spec", f"{mismatch}: calibrating on observations drawn from the model's own spec"


def _sim_frames(samples: int, seed: int) -> list[dict[str, Any]]:
    """`samples` observations of the simulated arm: one episode per sample, the arm moved to a random pose."""
    from omni_ros.sim.config import SimConfig
    from omni_ros.sim.env import SimEnv

    sim = SimConfig()
    env = SimEnv(sim)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(samples):
        env.reset(seed=seed + i)
        # Somewhere between the start pose and a reach: the arm and its shadow move through the images.
        env.command(env.state + rng.uniform(-0.8, 0.8, size=sim.n_joints))
        env.step(float(rng.uniform(0.1, 0.6)))
        out.append(env.observe())
    return out


def sim_observations(cfg: ChunkConfig, samples: int, seed: int = 0) -> list[dict[str, Any]]:
    """`samples` observations of the simulated arm (cameras and joints must be the model's)."""
    mismatch = sim_mismatch(cfg)
    if mismatch is not None:
        raise CalibrationError(
            f"--calibration sim: {mismatch}; calibrate on recorded observations instead (--calibration DATASET_DIR), "
            "or on observations drawn from the model's spec (--calibration spec)"
        )
    out = _sim_frames(samples, seed)
    for obs in out:
        obs["images"] = {c: obs["images"][c] for c in cfg.camera_names}
    return out


def spec_observations(
    cfg: ChunkConfig, samples: int, norm_stats: NormStats | None = None, seed: int = 0
) -> list[dict[str, Any]]:
    """`samples` observations shaped by the model's spec, for a model no recorded data fits.

    Images are the simulator's rendered frames (real scene statistics, not noise), its cameras given to the model's
    in turn; states are drawn where the norm stats say the robot's are (mean +- std, or between the 1st and 99th
    percentiles), so the normalized state the model sees spans its usual range; prompts are the simulator's tasks.
    """
    rng = np.random.default_rng(seed)
    out = []
    for obs in _sim_frames(samples, seed):
        frames = list(obs["images"].values())
        obs["images"] = {c: frames[i % len(frames)] for i, c in enumerate(cfg.camera_names)}
        obs["state"] = _state(cfg, norm_stats, rng)
        out.append(obs)
    return out


def _state(cfg: ChunkConfig, norm_stats: NormStats | None, rng: np.random.Generator) -> np.ndarray:
    """A state where the norm stats say the robot's are (between its quantiles or min / max, else mean +- std)."""
    stats = norm_stats or NormStats.identity(cfg.state_dim, cfg.action_dim)
    if stats.state_mode == "quantile" and stats.state_q01 is not None and stats.state_q99 is not None:
        state = rng.uniform(stats.state_q01, stats.state_q99)
    elif stats.state_mode == "min_max" and stats.state_min is not None and stats.state_max is not None:
        state = rng.uniform(stats.state_min, stats.state_max)
    else:
        state = np.asarray(stats.state_mean) + np.asarray(stats.state_std) * rng.uniform(-1.0, 1.0, cfg.state_dim)
    return state.astype(np.float32)


_WORDS = ("pick", "place", "the", "red", "blue", "cube", "bowl", "open", "drawer", "into", "left", "towel", "fold")


def random_observations(
    cfg: ChunkConfig, samples: int, norm_stats: NormStats | None = None, seed: int = 0
) -> list[dict[str, Any]]:
    """`samples` observations of uniform pixels (224 x 224 frames), prompts of 1-12 random words, and states drawn
    as `spec_observations` draws them: any family's processor takes them."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(samples):
        images = {c: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for c in cfg.camera_names}
        prompt = " ".join(rng.choice(_WORDS, size=int(rng.integers(1, 13))))
        out.append({"images": images, "state": _state(cfg, norm_stats, rng), "prompt": prompt})
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


def calibration_observations(
    source: str, cfg: ChunkConfig, samples: int, seed: int = 0, norm_stats: NormStats | None = None
) -> list[dict]:
    """Raw observations from `source` (auto, sim, spec, random or a dataset folder)."""
    if samples < 1:
        raise CalibrationError("calibration needs at least one sample")
    source, _ = resolve_source(source, cfg)
    if source == "random":
        return random_observations(cfg, samples, norm_stats, seed)
    if source == "sim":
        return sim_observations(cfg, samples, seed)
    if source == "spec":
        return spec_observations(cfg, samples, norm_stats, seed)
    if not Path(source).is_dir():
        raise CalibrationError(f"--calibration {source!r}: not auto, sim, spec, random or a dataset folder")
    return dataset_observations(source, cfg, samples)


def observation_inputs(
    cfg: ChunkConfig, tokenizer: Any, norm_stats: NormStats, observations: list[dict[str, Any]]
) -> list[ModelInputs]:
    """Each observation through the family's processor, as the policy runs it: model inputs of batch 1."""
    from omni_ros.policy import families

    processor = families.get(cfg.family).build_processor(cfg, norm_stats, tokenizer)
    cpu = torch.device("cpu")
    domains = int(getattr(cfg, "num_domains", 1))
    if domains > 1:
        observations = [{**obs, "domain_id": i % domains} for i, obs in enumerate(observations)]
    return [processor.inputs([processor.parse(obs)], cpu, torch.float32) for obs in observations]
