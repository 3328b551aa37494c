"""The table and its colored blocks, laid out at random per seed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from omni_ros.sim.config import COLORS

TABLE_RGB = (196, 170, 130)
FLOOR_RGB = (60, 60, 66)

# Table top in metres; the arm's base sits at the origin, near the table's front edge.
TABLE_X = (-0.55, 0.55)
TABLE_Y = (-0.12, 0.75)


@dataclass(frozen=True)
class Block:
    color: str
    xy: tuple[float, float]
    yaw: float
    size: float

    @property
    def rgb(self) -> tuple[int, int, int]:
        return COLORS[self.color]

    def corners(self) -> np.ndarray:
        """(4, 2) corners in metres, counter-clockwise."""
        half = self.size / 2
        local = np.array([[-half, -half], [half, -half], [half, half], [-half, half]])
        c, s = math.cos(self.yaw), math.sin(self.yaw)
        return local @ np.array([[c, s], [-s, c]]) + np.asarray(self.xy)


@dataclass(frozen=True)
class Scene:
    blocks: tuple[Block, ...]

    def block(self, color: str) -> Block:
        for b in self.blocks:
            if b.color == color:
                return b
        raise KeyError(f"no {color} block on the table; blocks: {[b.color for b in self.blocks]}")

    @property
    def colors(self) -> list[str]:
        return [b.color for b in self.blocks]


def sample_scene(
    rng: np.random.Generator,
    colors: Sequence[str],
    n_blocks: int,
    block_size: float = 0.05,
    reach: float = 0.7,
    min_separation: float = 0.14,
) -> Scene:
    """Place `n_blocks` blocks of distinct colors where the arm can reach them, apart from each other.

    Blocks sit in a ring in front of the base (40-85% of the reach, 25-155
    degrees), so every block is reachable yet none sits on the base.
    """
    unknown = [c for c in colors if c not in COLORS]
    if unknown:
        raise ValueError(f"unknown block colors {unknown}; known: {sorted(COLORS)}")
    if not 1 <= n_blocks <= len(colors):
        raise ValueError(f"n_blocks must be between 1 and {len(colors)} (the number of colors), got {n_blocks}")
    chosen = rng.choice(len(colors), size=n_blocks, replace=False)
    positions: list[np.ndarray] = []
    for _ in range(10_000):
        if len(positions) == n_blocks:
            break
        r = rng.uniform(0.4, 0.85) * reach
        theta = rng.uniform(math.radians(25), math.radians(155))
        p = np.array([r * math.cos(theta), r * math.sin(theta)])
        inside = TABLE_X[0] + block_size < p[0] < TABLE_X[1] - block_size and p[1] < TABLE_Y[1] - block_size
        if inside and all(np.linalg.norm(p - q) >= min_separation for q in positions):
            positions.append(p)
    if len(positions) < n_blocks:
        raise ValueError(f"cannot place {n_blocks} blocks {min_separation} m apart within reach {reach} m")
    blocks = tuple(
        Block(colors[int(i)], (float(p[0]), float(p[1])), float(rng.uniform(0, math.pi / 2)), block_size)
        for i, p in zip(chosen, positions, strict=True)
    )
    return Scene(blocks)
