"""The metrics document (`metrics.json`, schema in schema.py) from a replay's episodes."""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Sequence
from typing import Any

from omni_ros.config import OmniConfig
from omni_ros.eval.metrics import Scores, scores_to_dict, skipped_to_dict
from omni_ros.eval.replay import Episode, ReplayResult, TopicMap
from omni_ros.eval.schema import SCHEMA_NAME, SCHEMA_VERSION
from omni_ros.policy.base import PolicyMetadata


def block(episodes: Sequence[Episode], joint_names: Sequence[str]) -> dict[str, Any]:
    """Counts and error metrics over `episodes`, pooled (every scored value weighs the same)."""
    scores = Scores(len(joint_names))
    skipped: Counter = Counter()
    image_errors: Counter = Counter()
    rejected: Counter = Counter()
    for ep in episodes:
        if ep.scores is not None:
            scores.merge(ep.scores)
        skipped.update(ep.skipped)
        image_errors.update(ep.image_errors)
        rejected.update(ep.gt.rejected)
    return {
        "instants": sum(e.instants for e in episodes),
        "evaluated": sum(len(e.predictions) for e in episodes),
        "skipped": skipped_to_dict(skipped),
        "dropped_out_of_order": sum(e.dropped_out_of_order for e in episodes),
        "image_errors": dict(image_errors),
        "ground_truth_rejected": dict(rejected),
        **scores_to_dict(scores, joint_names),
    }


def settings(config: OmniConfig) -> dict[str, Any]:
    tm = TopicMap.from_config(config)
    ev = config.eval
    if ev.rate_hz > 0:
        instants = f"every {1.0 / ev.rate_hz:g} s ({ev.rate_hz:g} Hz)"
    else:
        instants = f"every {ev.every_k_frames} frame(s) of camera '{tm.trigger_camera}'"
    splits = ["bag"]
    if ev.episode_gap_s > 0:
        splits.append(f"gap > {ev.episode_gap_s:g} s")
    if ev.episode_marker_topic:
        splits.append(f"marker {ev.episode_marker_topic}")
    gt = ev.ground_truth
    control = config.control
    return {
        "cameras": {name: topic for name, topic in tm.cameras},
        "joint_states": tm.joint_states,
        "prompt": tm.prompt_topic if tm.read_prompt_topic else f"fixed: {tm.default_prompt}",
        "ground_truth": {
            "source": gt.source,
            "topic": tm.ground_truth,
            "offset_s": gt.offset_s if gt.source == "joint_states" else 0.0,
        },
        "instants": instants,
        "episode_split": ", ".join(splits),
        "stale_s": {
            "camera": control.camera_stale_s,
            "state": control.state_stale_s,
            "prompt": control.prompt_stale_s,
        },
    }


def build_document(
    result: ReplayResult,
    config: OmniConfig,
    metadata: PolicyMetadata,
    mode: str = "offline",
    realtime: dict[str, Any] | None = None,
) -> dict[str, Any]:
    joints = result.joint_names
    starts = {b.path: b.start_time for b in result.bags}
    episodes = []
    for ep in result.episodes:
        episodes.append(
            {
                "index": ep.index,
                "bag": ep.bag,
                "start_s": round(ep.start - starts.get(ep.bag, ep.start), 6),
                "duration_s": round(ep.duration_s, 6),
                "prompt": ep.prompt,
                **block([ep], joints),
            }
        )
    return {
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mode": mode,
        # What the robot sees of the policy (schema v2); the sampler's noise shape is not part of it.
        "policy": {k: v for k, v in metadata.to_dict().items() if k != "noise_shape"},
        "joint_names": list(joints),
        "settings": settings(config),
        "bags": [b.to_dict() for b in result.bags],
        "timing": result.timing.to_dict(),
        "overall": {"episodes": len(result.episodes), **block(result.episodes, joints)},
        "episodes": episodes,
        "realtime": realtime,
    }
