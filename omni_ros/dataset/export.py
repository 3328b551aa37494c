"""`omni-ros dataset export`: rosbag2 episodes -> one LeRobotDataset v3.0 folder, with a summary.

The folder is written under a temporary name next to `out` and renamed when complete, so an interrupted or
failed export never leaves a folder that looks like a dataset. Every bag is opened and checked (topics and
types, as `omni-ros eval` checks them) before anything is written.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from omni_ros.config import OmniConfig
from omni_ros.dataset.sampling import EpisodeEnd, EpisodeSampler, EpisodeStart, Frame
from omni_ros.dataset.video import VideoSettings
from omni_ros.dataset.writer import DatasetError, DatasetWriter
from omni_ros.eval.bag import Bag
from omni_ros.progress import Progress


@dataclass
class ExportSummary:
    out: Path
    episodes: int = 0
    frames: int = 0
    seconds: float = 0.0  # recorded time covered by the exported frames
    bag_bytes: int = 0
    wall_s: float = 0.0
    dropped: Counter = field(default_factory=Counter)
    skipped_episodes: list[str] = field(default_factory=list)
    tasks: int = 0
    repo_id: str = ""

    def text(self) -> str:
        lines = [
            f"wrote {self.out}: {self.episodes} episode(s), {self.frames} frames, {self.seconds:.1f} s of recording, "
            f"{self.tasks} task(s) in {self.wall_s:.1f} s ({self.frames / max(self.wall_s, 1e-9):.1f} frames/s)"
        ]
        total = sum(self.dropped.values())
        if total:
            lines.append(f"dropped {total} tick(s):")
            lines += [f"  {n:6d}  {reason}" for reason, n in self.dropped.most_common()]
        else:
            lines.append("dropped 0 ticks")
        repo = self.repo_id or f"local/{self.out.name}"
        lines.append(f"load it with LeRobot: LeRobotDataset({repo!r}, root={str(self.out)!r})")
        return "\n".join(lines)


def bag_size(path: str) -> int:
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def prepare_out(out: Path, overwrite: bool) -> Path:
    """The temporary folder to write into; refuses an existing non-empty `out` unless `overwrite`."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise DatasetError(f"output {out} exists and is not empty; choose another folder or pass --overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def publish(tmp: Path, out: Path) -> None:
    """Move the finished folder into place (replacing `out` when overwriting)."""
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


def export_dataset(
    bags: Sequence[str],
    config: OmniConfig,
    out: str | Path,
    fps: int = 30,
    overwrite: bool = False,
    progress: bool = True,
    settings: VideoSettings | None = None,
    robot_type: str | None = None,
    repo_id: str = "",
) -> ExportSummary:
    """Export `bags` into the LeRobotDataset folder `out` (see the module docstring)."""
    if not bags:
        raise DatasetError("no bags given")
    if fps <= 0:
        raise DatasetError(f"--fps must be a positive integer, got {fps}")
    started = time.perf_counter()
    out = Path(out)
    sampler = EpisodeSampler(config, fps)
    opened: list[tuple[Bag, dict[str, str]]] = []
    try:
        for path in bags:
            bag = Bag(path)
            opened.append((bag, {}))
            opened[-1] = (bag, sampler.topics.check(bag))
    except Exception:
        for bag, _ in opened:
            bag.close()
        raise
    summary = ExportSummary(out, bag_bytes=sum(bag_size(b) for b in bags), repo_id=repo_id)
    tmp = prepare_out(out, overwrite)
    writer = DatasetWriter(tmp, fps, sampler.camera_names, sampler.topics.joint_names, settings, robot_type)
    total = sum(bag.message_count(types) for bag, types in opened)
    bar = Progress(total, label="export", enabled=progress)
    counter: Counter = Counter()
    ok = False
    try:
        for bag, types in opened:
            with bag:
                shown = 0
                start: EpisodeStart | None = None
                for event in sampler.read(bag, types, counter):
                    if counter["messages"] - shown >= 64:
                        bar.update(counter["messages"] - shown, episodes=summary.episodes, frames=summary.frames)
                        shown = counter["messages"]
                    if isinstance(event, Frame):
                        try:
                            writer.add_frame(event.images, event.state, event.action, event.prompt)
                        except DatasetError as exc:
                            assert start is not None
                            raise DatasetError(f"bag {bag.name}, episode at {start.start:.3f} s: {exc}") from exc
                        summary.frames += 1
                    elif isinstance(event, EpisodeStart):
                        start = event
                        writer.start_episode()
                    elif isinstance(event, EpisodeEnd):
                        n = writer.end_episode()
                        summary.dropped.update(event.dropped)
                        if n == 0:
                            reasons = "; ".join(f"{r} x{k}" for r, k in event.dropped.most_common(3)) or "no ticks"
                            raise DatasetError(
                                f"bag {bag.name}, episode at {event.start:.3f} s ({event.end - event.start:.2f} s): "
                                f"no frames at {fps} fps ({reasons})"
                            )
                        summary.episodes += 1
                        summary.seconds += n / fps
                bar.update(counter["messages"] - shown)
        writer.finish()
        summary.tasks = len(writer.tasks)
        publish(tmp, out)
        ok = True
    finally:
        bar.close()
        if not ok:
            writer.abort()
            shutil.rmtree(tmp, ignore_errors=True)
    summary.wall_s = time.perf_counter() - started
    return summary
