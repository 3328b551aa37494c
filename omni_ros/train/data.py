"""A demonstration dataset held in memory as model-ready tiles.

Each stored camera frame goes through `make_observation` once, at load time:
the same validation and resize-with-pad the policy runs at inference, so the
model trains on exactly what it will see.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omni_ros.observation import Observation, ObservationSpec, make_observation
from omni_ros.policy.pi0.configuration import ModelConfig
from omni_ros.sim.dataset import DatasetMeta, check_fits, iter_shards, read_meta


@dataclass
class TileDataset:
    meta: DatasetMeta
    tiles: dict[str, np.ndarray]  # camera -> (N, S, S, 3) uint8
    states: np.ndarray  # (N, state_dim) float32
    actions: np.ndarray  # (N, horizon, action_dim) float32
    prompts: list[str]
    episodes: np.ndarray  # (N,) int64
    goals: np.ndarray | None = None  # (N, action_dim) float32, when every dataset recorded them

    def __len__(self) -> int:
        return len(self.prompts)

    def observations(self, indices: np.ndarray) -> list[Observation]:
        return [
            Observation(
                images={c: t[i] for c, t in self.tiles.items()},
                image_masks=dict.fromkeys(self.tiles, True),
                state=self.states[i],
                prompt=self.prompts[i],
            )
            for i in indices
        ]


def load_tiles(
    paths: list[str | Path], cfg: ModelConfig, on_shard: Callable[[int, int], None] | None = None
) -> TileDataset:
    """Load one or more dataset folders for a model of config `cfg` (chunks cut to its horizon)."""
    spec = ObservationSpec(tuple(cfg.camera_names), cfg.state_dim, cfg.vision.image_size)
    tiles: dict[str, list[np.ndarray]] = {c: [] for c in cfg.camera_names}
    states, actions, prompts, episodes, goals = [], [], [], [], []
    metas = [read_meta(p) for p in paths]
    for meta in metas:
        check_fits(meta, cfg.camera_names, cfg.state_dim, cfg.action_dim, cfg.action_horizon, cfg.action_dt)
    total = sum(len(m.shards) for m in metas)
    done = 0
    for path in paths:
        for shard in iter_shards(path):
            for i in range(len(shard["state"])):
                raw = {
                    "images": {c: shard[f"images_{c}"][i] for c in cfg.camera_names},
                    "state": shard["state"][i],
                    "prompt": str(shard["prompt"][i]),
                }
                obs = make_observation(spec, raw)
                for c in cfg.camera_names:
                    tiles[c].append(obs.images[c])
                states.append(obs.state)
                prompts.append(obs.prompt)
            actions.append(shard["actions"][:, : cfg.action_horizon])
            episodes.append(shard["episode"])
            goals.append(shard.get("goal"))
            done += 1
            if on_shard is not None:
                on_shard(done, total)
    if not prompts:
        raise ValueError(f"no samples in {[str(p) for p in paths]}")
    return TileDataset(
        meta=metas[0],
        tiles={c: np.stack(v) for c, v in tiles.items()},
        states=np.stack(states).astype(np.float32),
        actions=np.concatenate(actions).astype(np.float32),
        prompts=prompts,
        episodes=np.concatenate(episodes),
        goals=None
        if any(g is None for g in goals)
        else np.concatenate([g for g in goals if g is not None]).astype(np.float32),
    )
