"""Demonstration datasets: a folder of compressed .npz shards plus `meta.json`.

    DIR/meta.json          what was collected and how (cameras, chunk horizon and dt, sim config, counts)
    DIR/shard_00000.npz    samples: images_<camera> (N, H, W, 3) uint8 as the camera saw them,
                           state (N, D), actions (N, horizon, D) expert chunk, prompt (N,), episode (N,),
                           target (N,), time (N,), goal (N, D) joint positions the expert heads for

Plain numpy arrays only (no pickles), so a dataset can be read anywhere. A
sample is one observation the way `Policy.infer` takes it and the chunk the
scripted expert answers to it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from omni_ros.errors import OmniRosError

FORMAT = "omni_ros.sim.demos.v1"
META = "meta.json"


class DatasetError(OmniRosError, ValueError):
    """A dataset folder is missing, incomplete or does not fit the model it should train."""


@dataclass
class Sample:
    """One observation (raw dict contract of `Policy.infer`) and the expert's chunk for it."""

    images: dict[str, np.ndarray]
    state: np.ndarray
    prompt: str
    actions: np.ndarray
    episode: int
    target: str
    time: float
    # Joint positions the expert's chunks head for (the prompted block's pose); an auxiliary training target.
    goal: np.ndarray | None = None

    def observation(self) -> dict[str, Any]:
        return {"images": self.images, "state": self.state, "prompt": self.prompt}


@dataclass
class DatasetMeta:
    cameras: list[str]
    state_dim: int
    action_dim: int
    horizon: int
    action_dt: float
    samples: int = 0
    episodes: int = 0
    shards: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **self.__dict__}


class DatasetWriter:
    """Buffers samples and writes a shard every `shard_size` samples; `close()` writes meta.json last."""

    def __init__(self, out: str | Path, meta: DatasetMeta, shard_size: int = 500, append: bool = False) -> None:
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        existing = self.out / META
        if existing.exists() and not append:
            raise DatasetError(f"{self.out} already holds a dataset; choose another --out or pass --append")
        if existing.exists():
            old = read_meta(self.out)
            same = (old.cameras, old.state_dim, old.action_dim, old.horizon, old.action_dt)
            if same != (meta.cameras, meta.state_dim, meta.action_dim, meta.horizon, meta.action_dt):
                raise DatasetError(f"{self.out}: cannot append samples of a different layout ({same})")
            meta.samples, meta.episodes, meta.shards = old.samples, old.episodes, list(old.shards)
            meta.info = {**old.info, "appended": [*old.info.get("appended", []), meta.info]}
        self.meta = meta
        self.shard_size = int(shard_size)
        self._buffer: list[Sample] = []
        self._episodes: set[int] = set()

    def add(self, sample: Sample) -> None:
        if sample.actions.shape != (self.meta.horizon, self.meta.action_dim):
            raise DatasetError(f"chunk shape {sample.actions.shape} != ({self.meta.horizon}, {self.meta.action_dim})")
        self._buffer.append(sample)
        self._episodes.add(sample.episode)
        if len(self._buffer) >= self.shard_size:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        name = f"shard_{len(self.meta.shards):05d}.npz"
        arrays: dict[str, Any] = {  # arrays (Any: np.savez's **kwds would otherwise meet its allow_pickle: bool)
            f"images_{c}": np.stack([s.images[c] for s in self._buffer]) for c in self.meta.cameras
        }
        arrays["state"] = np.stack([s.state for s in self._buffer]).astype(np.float32)
        arrays["actions"] = np.stack([s.actions for s in self._buffer]).astype(np.float32)
        arrays["prompt"] = np.array([s.prompt for s in self._buffer])
        arrays["target"] = np.array([s.target for s in self._buffer])
        arrays["episode"] = np.array([s.episode for s in self._buffer], dtype=np.int64)
        arrays["time"] = np.array([s.time for s in self._buffer], dtype=np.float32)
        if all(s.goal is not None for s in self._buffer):
            arrays["goal"] = np.stack([s.goal for s in self._buffer if s.goal is not None]).astype(np.float32)
        # Write under a temporary name, then rename: a shard listed in meta.json is always complete.
        tmp = self.out / (name + ".tmp.npz")
        np.savez_compressed(tmp, **arrays)
        tmp.rename(self.out / name)
        self.meta.shards.append(name)
        self.meta.samples += len(self._buffer)
        self._buffer = []

    def close(self) -> DatasetMeta:
        self._flush()
        self.meta.episodes += len(self._episodes)
        self._episodes = set()
        (self.out / META).write_text(json.dumps(self.meta.to_dict(), indent=2) + "\n")
        return self.meta


def read_meta(path: str | Path) -> DatasetMeta:
    path = Path(path)
    meta_file = path / META
    if not meta_file.is_file():
        raise DatasetError(f"{path}: no {META} (collect one with `omni-ros sim collect --out {path}`)")
    try:
        data = json.loads(meta_file.read_text())
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{meta_file}: not valid JSON: {exc}") from exc
    if data.pop("format", None) != FORMAT:
        raise DatasetError(f"{meta_file}: not an omni_ros demonstration dataset (format {FORMAT} expected)")
    try:
        return DatasetMeta(**data)
    except TypeError as exc:
        raise DatasetError(f"{meta_file}: invalid: {exc}") from exc


def iter_shards(path: str | Path) -> Iterator[dict[str, np.ndarray]]:
    """The arrays of every shard, in order."""
    path = Path(path)
    meta = read_meta(path)
    for name in meta.shards:
        try:
            with np.load(path / name, allow_pickle=False) as shard:
                yield {k: shard[k] for k in shard.files}
        except (OSError, ValueError) as exc:
            raise DatasetError(f"{path / name}: cannot read shard: {exc}") from exc


def iter_samples(path: str | Path) -> Iterator[Sample]:
    meta = read_meta(path)
    for shard in iter_shards(path):
        for i in range(len(shard["state"])):
            yield Sample(
                images={c: shard[f"images_{c}"][i] for c in meta.cameras},
                state=shard["state"][i],
                prompt=str(shard["prompt"][i]),
                actions=shard["actions"][i],
                episode=int(shard["episode"][i]),
                target=str(shard["target"][i]),
                time=float(shard["time"][i]),
                goal=shard["goal"][i] if "goal" in shard else None,
            )


def check_fits(
    meta: DatasetMeta, camera_names: Sequence[str], state_dim: int, action_dim: int, horizon: int, action_dt: float
) -> None:
    """Raise DatasetError unless the dataset can train a model with these inputs and outputs."""
    problems = []
    if abs(meta.action_dt - action_dt) > 1e-9:
        problems.append(f"actions are {meta.action_dt} s apart, the model's {action_dt} s")
    missing = [c for c in camera_names if c not in meta.cameras]
    if missing:
        problems.append(f"cameras {missing} are not in the data (it has {meta.cameras})")
    if (meta.state_dim, meta.action_dim) != (state_dim, action_dim):
        problems.append(f"state/action dims {meta.state_dim}/{meta.action_dim}, model needs {state_dim}/{action_dim}")
    if meta.horizon < horizon:
        problems.append(f"chunks of {meta.horizon} actions, model needs {horizon}")
    if problems:
        raise DatasetError("dataset does not fit the model: " + "; ".join(problems))
