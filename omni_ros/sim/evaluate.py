"""Closed-loop evaluation of a policy on the reach task, and videos of its episodes.

Every episode runs through `run_episode`, i.e. through the real
`ActionChunkExecutor` with simulated inference latency. Per policy:

- success rate: the prompted block reached within the episode (10 s);
- prompt following: the same seed (same table, same start pose) run again
  with a prompt naming a *different* block, which must then be reached;
- time to success, and how often the arm ended on a wrong block instead.

Seeds default to 1,000,000 and up, far from the collection seeds (0 and up).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from omni_ros.control.config import ControlConfig
from omni_ros.sim.config import SimConfig
from omni_ros.sim.engines import SimRobot, make_env
from omni_ros.sim.rollout import ChunkPolicy, EpisodeResult, run_episode

HELD_OUT_SEED = 1_000_000


@dataclass
class EvalOptions:
    episodes: int = 50
    seed: int = HELD_OUT_SEED
    # Simulated inference latency (s): the chunk for an observation arrives this much later.
    latency: float = 0.1
    prompt_following: bool = True
    # Episodes (first seeds) whose frames are kept for a video, and every how many control ticks.
    video_episodes: int = 0
    record_every: int = 5


@dataclass
class EpisodeRecord:
    seed: int
    prompt: str
    target: str
    success: bool
    time_to_success: float | None
    final_distance: float
    # The block the tool point ended closest to, if within the success radius.
    ended_on: str | None
    alternate: bool = False

    @classmethod
    def of(cls, env: SimRobot, result: EpisodeResult, alternate: bool) -> EpisodeRecord:
        ended_on = env.ended_on()
        return cls(
            result.seed,
            result.prompt,
            result.target,
            result.success,
            result.time_to_success,
            result.final_distance,
            ended_on,
            alternate,
        )


@dataclass
class PolicyScore:
    name: str
    episodes: int
    success_rate: float
    prompt_following_rate: float | None
    both_prompts_rate: float | None
    wrong_block_rate: float
    mean_time_to_success: float | None
    median_time_to_success: float | None
    records: list[EpisodeRecord] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("records")
        return data


@dataclass
class VideoClip:
    prompt: str
    success: bool
    frames: list[dict[str, np.ndarray]]


def alternate_target(env: SimRobot, seed: int) -> str | None:
    """For prompt following: a block other than the one the seed's own prompt names (deterministic)."""
    env.reset(seed)
    assert env.scene is not None and env.task is not None  # set by reset()
    others = [c for c in env.scene.colors if c != env.task.target]
    return others[seed % len(others)] if others else None


def evaluate(
    name: str,
    policy: ChunkPolicy,
    sim: SimConfig,
    options: EvalOptions,
    action_dt: float,
    control: ControlConfig | None = None,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
    env: SimRobot | None = None,
) -> tuple[PolicyScore, list[VideoClip]]:
    """Score `policy` on `options.episodes` seeds; `env` (default: a new one of `sim`) lets a scripted
    policy look at the scene it is in."""
    env = env or make_env(sim)
    records: list[EpisodeRecord] = []
    clips: list[VideoClip] = []
    for k in range(options.episodes):
        seed = options.seed + k
        runs: list[str | None] = [None]
        if options.prompt_following:
            alt = alternate_target(env, seed)
            if alt is not None:
                runs.append(alt)
        for target in runs:
            record_every = options.record_every if k < options.video_episodes else 0
            result = run_episode(
                env,
                policy,
                seed,
                control=control,
                chunk_dt=action_dt,
                latency=options.latency,
                target=target,
                record_every=record_every,
            )
            if record_every:
                # A few still frames at the end so the outcome is visible.
                result.frames.extend([env.render()] * 4)
                clips.append(VideoClip(result.prompt, result.success, result.frames))
            record = EpisodeRecord.of(env, result, alternate=target is not None)
            records.append(record)
            if on_episode is not None:
                on_episode(record)
    return score(name, records), clips


def score(name: str, records: Sequence[EpisodeRecord]) -> PolicyScore:
    main = [r for r in records if not r.alternate]
    alt = [r for r in records if r.alternate]
    times = [r.time_to_success for r in main if r.success and r.time_to_success is not None]
    main_ok = {r.seed for r in main if r.success}
    return PolicyScore(
        name=name,
        episodes=len(main),
        success_rate=_rate(r.success for r in main),
        prompt_following_rate=_rate(r.success for r in alt) if alt else None,
        both_prompts_rate=_rate(r.success and r.seed in main_ok for r in alt) if alt else None,
        wrong_block_rate=_rate(r.ended_on is not None and r.ended_on != r.target for r in records),
        mean_time_to_success=float(np.mean(times)) if times else None,
        median_time_to_success=float(np.median(times)) if times else None,
        records=list(records),
    )


def _rate(values: Any) -> float:
    values = list(values)
    return float(np.mean(values)) if values else 0.0


def compose_frame(frame: dict[str, np.ndarray], prompt: str, status: str, ok: bool) -> np.ndarray:
    """Cameras side by side (RGB) under a caption with the prompt and the episode's outcome."""
    tiles = [frame[c] for c in sorted(frame, key=lambda c: c != "base")]
    height = max(t.shape[0] for t in tiles)
    row = np.hstack([cv2.resize(t, (t.shape[1] * height // t.shape[0], height)) for t in tiles])
    caption = np.full((28, row.shape[1], 3), 20, np.uint8)
    cv2.putText(caption, f'"{prompt}"', (6, 19), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (240, 240, 240), 1, cv2.LINE_AA)
    color = (90, 220, 90) if ok else (230, 200, 80)
    size = cv2.getTextSize(status, cv2.FONT_HERSHEY_SIMPLEX, 0.5, 1)[0]
    cv2.putText(caption, status, (row.shape[1] - size[0] - 6, 19), cv2.FONT_HERSHEY_SIMPLEX, 0.5, color, 1, cv2.LINE_AA)
    return np.vstack([caption, row])


def write_video(clips: Sequence[VideoClip], path: str | Path, fps: float = 10.0, scale: float = 1.0) -> Path:
    """GIF (or .webp / .png animation) with OpenCV's animation writer; .mp4 / .avi with VideoWriter."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = []
    for clip in clips:
        for i, frame in enumerate(clip.frames):
            last = i >= len(clip.frames) - 4
            status = ("reached" if clip.success else "not reached") if last else "running"
            rgb = compose_frame(frame, clip.prompt, status, clip.success and last)
            if scale != 1.0:
                rgb = cv2.resize(rgb, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
            frames.append(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    if not frames:
        raise ValueError("no frames to write")
    if path.suffix.lower() in (".mp4", ".avi"):
        fourcc = cv2.VideoWriter.fourcc(*("mp4v" if path.suffix.lower() == ".mp4" else "MJPG"))
        h, w = frames[0].shape[:2]
        writer = cv2.VideoWriter(str(path), fourcc, fps, (w, h))
        if not writer.isOpened():
            raise OSError(f"OpenCV cannot write {path}")
        for f in frames:
            writer.write(f)
        writer.release()
    else:
        animation = cv2.Animation()
        animation.frames = frames
        animation.durations = [round(1000 / fps)] * len(frames)
        animation.loop_count = 0
        if not cv2.imwriteanimation(str(path), animation):
            raise OSError(f"OpenCV cannot write an animation to {path} (use .gif, .webp, .png or .mp4)")
    return path


def action_error(policy: Callable[[dict[str, Any]], np.ndarray], samples: Sequence[Any]) -> dict[str, float]:
    """Offline: mean absolute joint error (rad) of the policy's chunks vs the expert's, next to holding still."""
    errors, hold = [], []
    for sample in samples:
        predicted = policy(sample.observation())
        h = min(len(predicted), len(sample.actions))
        errors.append(np.abs(predicted[:h] - sample.actions[:h]).mean())
        hold.append(np.abs(sample.state[None, :] - sample.actions[:h]).mean())
    return {
        "samples": len(errors),
        "policy_mae_rad": float(np.mean(errors)),
        "hold_still_mae_rad": float(np.mean(hold)),
    }
