"""Trajectories in time built from action chunks, and the ways a new chunk takes over from the old.

Everything is a function of time `at(t) -> positions`:

- `ChunkTrajectory`: one chunk, action i at `start + i * dt`, linear between
  actions, holding the first/last action outside its span;
- `Hold`: a constant position;
- `CrossFade`: from an old trajectory to a new one with weights linear in
  time over a window (the `linear` blending mode);
- `Ensemble`: ACT-style temporal ensembling, the weighted mean of every chunk
  that predicts time t, weight exp(-decay * arrival age in steps), each
  chunk faded out over the window before its end so that leaving is smooth;
- `Switch`: the old trajectory until a time, the new one after it (the `rtc`
  mode: the policy sampled the new chunk to continue the old one, so the
  switch needs no blend).

Every function is continuous in t, and a new trajectory enters through a
`CrossFade` from whatever was being commanded, so commands have no jump at a
chunk boundary (except `latest`, which switches at once by design, and `rtc`, whose chunks
are continuous by construction).
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np


class Trajectory(Protocol):
    def at(self, t: float) -> np.ndarray: ...

    def simplify(self, t: float) -> Trajectory:
        """An equivalent trajectory for times >= t, dropping parts that no longer matter."""
        ...


class Hold:
    def __init__(self, position: np.ndarray) -> None:
        self.position = np.asarray(position, dtype=np.float64).copy()

    def at(self, t: float) -> np.ndarray:
        return self.position.copy()

    def simplify(self, t: float) -> Trajectory:
        return self


class ChunkTrajectory:
    """One (H, D) chunk; action i is the position target at `start + i * dt`."""

    def __init__(self, actions: np.ndarray, start: float, dt: float, chunk_id: int = 0) -> None:
        self.actions = np.asarray(actions, dtype=np.float64)
        self.start = float(start)
        self.dt = float(dt)
        self.chunk_id = chunk_id

    @property
    def horizon(self) -> int:
        return int(self.actions.shape[0])

    @property
    def end(self) -> float:
        """Time of the last action."""
        return self.start + (self.horizon - 1) * self.dt

    def remaining(self, t: float) -> int:
        """Actions whose time is still ahead of t."""
        passed = math.floor((t - self.start) / self.dt + 1e-9) + 1
        return int(min(self.horizon, max(0, self.horizon - passed)))

    def at(self, t: float) -> np.ndarray:
        u = (t - self.start) / self.dt
        if u <= 0:
            return self.actions[0].copy()
        if u >= self.horizon - 1:
            return self.actions[-1].copy()
        i = int(u)
        frac = u - i
        return (1.0 - frac) * self.actions[i] + frac * self.actions[i + 1]

    def simplify(self, t: float) -> Trajectory:
        return self


class CrossFade:
    """(1 - a) * old + a * new with a rising linearly from 0 at `t_start` to 1 at `t_start + window`."""

    def __init__(self, old: Trajectory, new: Trajectory, t_start: float, window: float) -> None:
        self.old, self.new = old, new
        self.t_start = float(t_start)
        self.window = max(float(window), 1e-9)

    def weight(self, t: float) -> float:
        return min(1.0, max(0.0, (t - self.t_start) / self.window))

    def at(self, t: float) -> np.ndarray:
        a = self.weight(t)
        if a >= 1.0:
            return self.new.at(t)
        if a <= 0.0:
            return self.old.at(t)
        return (1.0 - a) * self.old.at(t) + a * self.new.at(t)

    def simplify(self, t: float) -> Trajectory:
        if self.weight(t) >= 1.0:
            return self.new.simplify(t)
        self.old = self.old.simplify(t)
        self.new = self.new.simplify(t)
        return self


class Switch:
    """`old` before `t_switch`, `new` from then on."""

    def __init__(self, old: Trajectory, new: Trajectory, t_switch: float) -> None:
        self.old, self.new = old, new
        self.t_switch = float(t_switch)

    def at(self, t: float) -> np.ndarray:
        return self.new.at(t) if t >= self.t_switch - 1e-9 else self.old.at(t)

    def simplify(self, t: float) -> Trajectory:
        if t >= self.t_switch - 1e-9:
            return self.new.simplify(t)
        self.old = self.old.simplify(t)
        return self


class Ensemble:
    """Temporal ensembling over chunks (ACT): older predictions of the same instant weigh more.

    A chunk's weight is exp(-decay * (its arrival - first arrival) / dt), so
    with ACT's decay 0.01 a chunk that arrived 25 steps later weighs 0.78 of
    the older one; a negative decay favours newer chunks. Each chunk's weight
    fades to zero over `fade` seconds before its last action, and after every
    chunk has ended the newest one's last action is held.
    """

    def __init__(self, members: list[tuple[ChunkTrajectory, float]], decay: float, fade: float) -> None:
        if not members:
            raise ValueError("an ensemble needs at least one chunk")
        self.members = members  # (chunk, arrival time), oldest first
        self.decay = float(decay)
        self.fade = max(float(fade), 1e-9)

    @property
    def newest(self) -> ChunkTrajectory:
        return self.members[-1][0]

    def with_chunk(self, chunk: ChunkTrajectory, arrival: float) -> Ensemble:
        """A new ensemble with `chunk` added and chunks that ended before `arrival` dropped."""
        kept = [(c, a) for c, a in self.members if c.end > arrival]
        return Ensemble([*kept, (chunk, arrival)], self.decay, self.fade)

    def at(self, t: float) -> np.ndarray:
        first = self.members[0][1]
        total = 0.0
        acc = None
        for chunk, arrival in self.members:
            taper = min(1.0, max(0.0, (chunk.end - t) / self.fade))
            if taper <= 0.0:
                continue
            w = math.exp(-self.decay * (arrival - first) / chunk.dt) * taper
            value = chunk.at(t) * w
            acc = value if acc is None else acc + value
            total += w
        if total <= 1e-12 or acc is None:
            return self.newest.at(t)
        return acc / total

    def simplify(self, t: float) -> Trajectory:
        kept = [(c, a) for c, a in self.members if c.end > t]
        if not kept:
            return Hold(self.newest.at(t))
        self.members = kept
        return self
