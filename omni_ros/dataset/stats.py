"""Feature statistics as LeRobot 0.6.1 computes them (lerobot/datasets/compute_stats.py), without importing it.

Policies normalize with these numbers, so they must be LeRobot's own, not merely similar ones:

- per episode, every numeric feature: min, max, mean, std and the quantiles q01, q10, q50, q90, q99 over the
  episode's frames. Mean and std come from the mean and the mean of squares in float32 (std = sqrt(max(0,
  E[x^2] - E[x]^2)), not numpy's std); quantiles are read off a 5000-bin histogram spanning [min, max] with
  linear interpolation inside the bin (an approximation LeRobot chose; we reproduce it, approximation and all).
- images: about 100 frames spread evenly over the episode (more for long episodes), strided down when a side
  is >= 300 px, stats per channel over all pixels, divided by 255, shaped (3, 1, 1).
- the dataset: episode stats merged one episode at a time in recording order (count-weighted means,
  parallel-variance std, quantiles count-weighted), as LeRobot merges each saved episode into meta/stats.json.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_KEYS = tuple(f"q{int(q * 100):02d}" for q in QUANTILES)
HISTOGRAM_BINS = 5000

Stats = dict[str, np.ndarray]


def _quantile(hist: np.ndarray, edges: np.ndarray, target: float) -> np.floating:
    cumsum = np.cumsum(hist)
    k = int(np.searchsorted(cumsum, target))
    if k == 0:
        return edges[0]
    if k >= len(cumsum):
        return edges[-1]
    before = cumsum[k - 1]
    inside = cumsum[k] - before
    if inside == 0:
        return edges[k]
    return edges[k] + (target - before) / inside * (edges[k + 1] - edges[k])


def vector_stats(samples: np.ndarray) -> Stats:
    """Stats of (N, D) samples over N (one value per column); count N."""
    x = np.asarray(samples)
    x = x.reshape(len(x), -1)
    x = x.astype(np.result_type(x.dtype, np.float32), copy=False)
    n, dims = x.shape
    if n < 2:  # LeRobot's fallback: plain numpy stats, every quantile = the mean
        mean = np.mean(x, axis=0)
        out = {"min": np.min(x, axis=0), "max": np.max(x, axis=0), "mean": mean, "std": np.std(x, axis=0)}
        out.update({k: mean.copy() for k in QUANTILE_KEYS})
        out["count"] = np.array([n])
        return out
    lo, hi = np.min(x, axis=0), np.max(x, axis=0)
    mean = np.mean(x, axis=0)
    mean_sq = np.mean(x**2, axis=0)
    std = np.sqrt(np.maximum(0, mean_sq - mean**2))
    quantiles: list[list[np.floating]] = [[] for _ in QUANTILES]
    for d in range(dims):
        edges = np.linspace(lo[d] - 1e-10, hi[d] + 1e-10, HISTOGRAM_BINS + 1)
        hist = np.zeros(HISTOGRAM_BINS) + np.histogram(x[:, d], bins=edges)[0]
        for i, q in enumerate(QUANTILES):
            quantiles[i].append(_quantile(hist, edges, q * n))
    out = {"min": lo.copy(), "max": hi.copy(), "mean": mean.copy(), "std": std, "count": np.array([n])}
    for key, values in zip(QUANTILE_KEYS, quantiles, strict=True):
        out[key] = np.array(values)
    return out


def scalar_stats(values: np.ndarray) -> Stats:
    """Stats of a per-frame scalar column (timestamp, indices): every entry shaped (1,)."""
    return {k: np.reshape(v, (1,)) if k != "count" else v for k, v in vector_stats(np.reshape(values, (-1, 1))).items()}


def image_sample_indices(length: int) -> list[int]:
    """Which of an episode's `length` frames enter the image stats (LeRobot's sample_indices)."""
    count = length if length < 100 else max(100, min(int(length**0.75), 10_000))
    return np.round(np.linspace(0, length - 1, count)).astype(int).tolist()


def downsample(image_hwc: np.ndarray) -> np.ndarray:
    """The strided thumbnail LeRobot takes of a large frame before its image stats (HWC)."""
    height, width = image_hwc.shape[:2]
    if max(width, height) < 300:
        return image_hwc
    step = int(width / 150) if width > height else int(height / 150)
    return image_hwc[::step, ::step]


def image_stats(frames: Sequence[np.ndarray]) -> Stats:
    """Per-channel stats of sampled HWC uint8 frames (already picked and downsampled), /255, shaped (C, 1, 1)."""
    stacked = np.stack([np.asarray(f) for f in frames])  # (N, H, W, C)
    channels = stacked.shape[-1]
    stats = vector_stats(stacked.reshape(-1, channels))
    out: Stats = {}
    for key, value in stats.items():
        out[key] = value if key == "count" else (value.reshape(1, -1, 1, 1) / 255.0).squeeze(0)
    out["count"] = np.array([len(stacked)])
    return out


def merge(a: Stats, b: Stats) -> Stats:
    """Two stats of one feature as one (LeRobot's aggregate_feature_stats of [a, b])."""
    parts = (a, b)
    means = np.stack([p["mean"] for p in parts])
    variances = np.stack([p["std"] ** 2 for p in parts])
    counts = np.stack([p["count"] for p in parts])
    total = counts.sum(axis=0)
    while counts.ndim < means.ndim:
        counts = np.expand_dims(counts, axis=-1)
    mean = (means * counts).sum(axis=0) / total
    variance = ((variances + (means - mean) ** 2) * counts).sum(axis=0) / total
    out = {
        "min": np.min(np.stack([p["min"] for p in parts]), axis=0),
        "max": np.max(np.stack([p["max"] for p in parts]), axis=0),
        "mean": mean,
        "std": np.sqrt(variance),
        "count": total,
    }
    for key in QUANTILE_KEYS:
        if key in a and key in b:
            out[key] = (np.stack([p[key] for p in parts]) * counts).sum(axis=0) / total
    return out


def merge_episode(dataset: dict[str, Stats] | None, episode: dict[str, Stats]) -> dict[str, Stats]:
    """The dataset's stats after one more episode (LeRobot merges each saved episode in turn)."""
    if dataset is None:
        return {k: dict(v) for k, v in episode.items()}
    keys = set(dataset) | set(episode)
    return {
        k: merge(dataset[k], episode[k]) if k in dataset and k in episode else dict(dataset.get(k) or episode[k])
        for k in keys
    }


def to_json(stats: dict[str, Stats]) -> dict[str, dict[str, list]]:
    """meta/stats.json's form: nested lists."""
    return {k: {s: np.asarray(v).tolist() for s, v in feature.items()} for k, feature in stats.items()}
