"""`omni-ros train`: fit a policy to demonstrations with the flow-matching `Trainer`.

The output folder is a normal checkpoint (config.json + model.safetensors,
loadable by `policy.checkpoint`) plus `train_state.pt` (optimizer, step, RNG
states) and `train_log.jsonl`. Both are rewritten every `checkpoint_every`
steps, so an interrupted run continues with `--resume` where it stopped,
drawing the same batches and noise it would have drawn.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omni_ros.errors import OmniRosError
from omni_ros.policy.layouts.omni import load_checkpoint, save_checkpoint
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.pi0.configuration import ModelConfig
from omni_ros.policy.pi0.modeling import Pi0Model, count_parameters
from omni_ros.policy.pi0.presets import preset, seeded_model
from omni_ros.policy.pi0.processing import fit_norm_stats
from omni_ros.policy.train import Trainer
from omni_ros.progress import Progress
from omni_ros.train.config import TrainConfig
from omni_ros.train.data import TileDataset, load_tiles
from omni_ros.typed_config import to_dict

STATE_FILE = "train_state.pt"
LOG_FILE = "train_log.jsonl"


class TrainError(OmniRosError, RuntimeError):
    """Training cannot start or continue as asked."""


@dataclass
class TrainResult:
    out: Path
    steps: int
    first_loss: float | None
    last_loss: float | None
    seconds: float


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up to `lr`, then cosine decay to `final_lr_fraction` * lr at `steps`."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.final_lr_fraction
    return cfg.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def _model_config(cfg: TrainConfig) -> ModelConfig:
    if cfg.init_checkpoint:
        from omni_ros.policy.layouts.omni import read_checkpoint_config

        return read_checkpoint_config(cfg.init_checkpoint)[0]
    base = preset(cfg.preset)
    if not cfg.model:
        return base
    return ModelConfig.from_dict(_merge(base.to_dict(), cfg.model), source="model (train config)")


def _merge(base: dict, overrides: dict) -> dict:
    out = dict(base)
    for key, value in overrides.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _fresh_model(cfg: TrainConfig, model_cfg: ModelConfig) -> tuple[Pi0Model, NormStats | None]:
    """A seeded new model, or the `init_checkpoint` one with the normalization its weights were trained with."""
    if cfg.init_checkpoint:
        model, stats, _ = load_checkpoint(cfg.init_checkpoint)
        return model, stats
    return seeded_model(model_cfg, cfg.seed), None


def train(
    cfg: TrainConfig,
    data: list[str | Path],
    out: str | Path,
    resume: bool = False,
    log: Any = print,
    dataset: TileDataset | None = None,
    stop_after: int | None = None,
) -> TrainResult:
    """Train (or continue training) into `out`; returns where it ended.

    `stop_after` ends this run at that step, checkpointed, as if interrupted (continue with `resume`).
    """
    from omni_ros.policy.torch_runner import resolve_device

    out = Path(out)
    device = resolve_device(cfg.device)
    if device.type == "cpu" and cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    # Adam's second moments of tiny gradients can become denormal floats, which CPUs compute very slowly
    # (seen once as 30% of a step in AdamW's sqrt); flushing them to zero changes nothing measurable here.
    torch.set_flush_denormal(True)
    state_file = out / STATE_FILE
    if resume and not state_file.is_file():
        raise TrainError(f"--resume: {state_file} not found (nothing to resume; drop --resume to start fresh)")
    if not resume and state_file.is_file():
        raise TrainError(f"{out} holds a training run already; pass --resume to continue it or choose another --out")

    if resume:
        model, norm_stats, _ = load_checkpoint(out)
        model_cfg = model.cfg
        saved = torch.load(state_file, map_location="cpu", weights_only=True)
    else:
        model_cfg = _model_config(cfg)
    if dataset is None:
        bars: dict[str, Progress] = {}

        def on_shard(done: int, total: int) -> None:
            bars.setdefault("load", Progress(total, "load data", every=max(1, total // 10))).update(1)

        dataset = load_tiles(list(data), model_cfg, on_shard)
    log(
        f"data: {len(dataset)} samples from {len(set(dataset.episodes.tolist()))} episodes, "
        f"tiles {model_cfg.vision.image_size}px x {list(dataset.tiles)}"
    )

    if not resume:
        model, norm_stats = _fresh_model(cfg, model_cfg)
        norm_stats = norm_stats or fit_norm_stats(model_cfg, dataset.states, dataset.actions)
        saved = None
    model = model.to(device)
    if cfg.goal_weight > 0 and dataset.goals is None:
        raise TrainError("goal_weight > 0 needs datasets that recorded goals (collect them again with this version)")
    trainer = Trainer(
        model,
        norm_stats,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        grad_clip=cfg.grad_clip,
        seed=cfg.seed,
        goal_weight=cfg.goal_weight,
    )
    sampler = torch.Generator().manual_seed(cfg.seed + 1)
    if saved is not None:
        trainer.optimizer.load_state_dict(saved["optimizer"])
        trainer.generator.set_state(saved["generator"])
        sampler.set_state(saved["sampler"])
        trainer.steps = int(saved["step"])
    params = count_parameters(model)["total"]
    log(f"model: {model_cfg.name}, {params / 1e6:.2f}M parameters, on {device}; steps {trainer.steps}->{cfg.steps}")

    def save(loss: float | None) -> None:
        extra = {
            "trained_steps": trainer.steps,
            "last_loss": loss,
            "train_config": to_dict(cfg),
            "data": {"samples": len(dataset), "info": dataset.meta.info},
        }
        save_checkpoint(out, model, norm_stats, extra=extra)
        state = {
            "step": trainer.steps,
            "optimizer": trainer.optimizer.state_dict(),
            "generator": trainer.generator.get_state(),
            "sampler": sampler.get_state(),
        }
        tmp = out / (STATE_FILE + ".tmp")
        torch.save(state, tmp)
        tmp.replace(state_file)

    out.mkdir(parents=True, exist_ok=True)
    bar = Progress(cfg.steps, "train", every=cfg.log_every)
    bar.resume_from(trainer.steps)
    start = time.monotonic()
    first = last = None
    window: list[float] = []
    with (out / LOG_FILE).open("a") as log_file:
        end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
        while trainer.steps < end:
            lr = learning_rate(cfg, trainer.steps)
            for group in trainer.optimizer.param_groups:
                group["lr"] = lr
            idx = torch.randint(len(dataset), (cfg.batch_size,), generator=sampler).numpy()
            observations = dataset.observations(idx)
            if cfg.state_noise > 0:
                scale = torch.rand(len(idx), 1, generator=sampler) * cfg.state_noise
                noise = (torch.randn(len(idx), dataset.states.shape[1], generator=sampler) * scale).numpy()
                for obs, n in zip(observations, noise, strict=True):
                    obs.state = obs.state + n.astype(np.float32)
            goals = dataset.goals[idx] if dataset.goals is not None else None
            batch = trainer.batch(observations, dataset.actions[idx], goals)
            loss = trainer.step(batch)
            if not math.isfinite(loss):
                raise TrainError(f"loss became {loss} at step {trainer.steps}; lower lr or check the data")
            first = loss if first is None else first
            window.append(loss)
            if trainer.steps % cfg.log_every == 0 or trainer.steps == cfg.steps:
                last = float(np.mean(window))
                window = []
                elapsed = time.monotonic() - start
                log_file.write(json.dumps({"step": trainer.steps, "loss": last, "lr": lr, "time_s": elapsed}) + "\n")
                log_file.flush()
            bar.update(1, loss=float(np.mean(window)) if window else (last or loss), lr=lr)
            if trainer.steps % cfg.checkpoint_every == 0 or trainer.steps == end:
                save(last)
    return TrainResult(out, trainer.steps, first, last, time.monotonic() - start)
