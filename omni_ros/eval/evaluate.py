"""`omni-ros eval` end to end: bags + config (+ policy) -> metrics.json, report.html and a text summary."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omni_ros.config import OmniConfig
from omni_ros.eval.errors import EvalError, NoSamplesError
from omni_ros.eval.replay import Replayer, ReplayResult
from omni_ros.eval.report import summary_text, write_report
from omni_ros.eval.results import build_document
from omni_ros.eval.schema import check
from omni_ros.policy.base import Policy
from omni_ros.progress import Progress


@dataclass
class Evaluation:
    document: dict[str, Any]
    result: ReplayResult
    summary: str
    out_dir: Path | None


def load_eval_policy(config: OmniConfig) -> Policy:
    """The policy the node would run, shaped to the robot's joints and the evaluated cameras."""
    from omni_ros.backends.factory import load_policy
    from omni_ros.eval.replay import TopicMap

    tm = TopicMap.from_config(config)
    joints = len(config.robot.joint_names)
    return load_policy(config.policy, camera_names=[n for n, _ in tm.cameras], state_dim=joints, action_dim=joints)


def no_samples_message(result: ReplayResult, bags: Sequence[str]) -> str:
    """Why nothing was scored, naming bags and topics."""
    from collections import Counter

    skipped: Counter = Counter()
    for ep in result.episodes:
        skipped.update(ep.skipped)
    evaluated = sum(len(e.predictions) for e in result.episodes)
    instants = sum(e.instants for e in result.episodes)
    gt = sum(len(e.track) for e in result.episodes if e.track is not None)
    parts = [f"no aligned samples in {', '.join(str(b) for b in bags)}: {instants} instants, {evaluated} evaluated"]
    if skipped:
        parts.append("skipped: " + "; ".join(f"{r} x{n}" for r, n in skipped.most_common(3)))
        if any("stale" in r for r in skipped):
            parts.append("(if header stamps and log times are on different clocks, set eval.use_header_stamps: false)")
    parts.append(f"{gt} ground-truth samples")
    if evaluated and gt:
        parts.append("(no prediction's action times fall within the recorded ground truth)")
    return "; ".join(parts)


def evaluate(
    bags: Sequence[str],
    config: OmniConfig,
    out_dir: str | Path | None = None,
    policy: Policy | None = None,
    progress: bool = True,
    opener: Callable[[str], Any] | None = None,
) -> Evaluation:
    """Replay `bags` offline through the assembler and `policy` (default: the configured one) and score it.

    `opener` opens each path (default: rosbag2; omni_ros.dataset.replay_source for LeRobot datasets)."""
    if not bags:
        raise EvalError("no bags given")
    if out_dir is not None:
        out_dir = _prepare_out(out_dir)
    if policy is None:
        policy = load_eval_policy(config)
    replayer = Replayer(config, policy, progress=(lambda n: Progress(n)) if progress else None, opener=opener)
    result = replayer.run(bags)
    if sum(e.scores.samples for e in result.episodes if e.scores is not None) == 0:
        raise NoSamplesError(no_samples_message(result, bags))
    doc = build_document(result, config, policy.metadata, mode="offline")
    return _finish(doc, result, config, out_dir)


def _prepare_out(out_dir: str | Path) -> Path:
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EvalError(f"cannot create output directory {out}: {exc}") from exc
    return out


def _finish(
    doc: dict[str, Any],
    result: ReplayResult,
    config: OmniConfig,
    out_dir: Path | None,
    executed: dict | None = None,
) -> Evaluation:
    check(doc)
    if out_dir is not None:
        (out_dir / "metrics.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        write_report(
            out_dir / "report.html",
            doc,
            result,
            plot_episodes=config.eval.plot_episodes,
            frames=config.eval.report_frames,
            executed=executed,
        )
    return Evaluation(doc, result, summary_text(doc, out_dir), out_dir)
