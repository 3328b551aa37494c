"""A checkpoint folder run through the node and the evaluator, as the family test files share it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def one_camera_node(checkpoint: Path, joints: list[str], **policy: Any) -> Callable[[Any], None]:
    """A policy-harness `configure` for a one-camera ("top") checkpoint with these joints (and policy fields)."""

    def configure(cfg) -> None:
        from omni_ros.config import CameraTopic

        cfg.policy.checkpoint, cfg.policy.preset = str(checkpoint), "tiny"
        for key, value in policy.items():
            setattr(cfg.policy, key, value)
        cfg.robot.joint_names = list(joints)
        cfg.topics.cameras = [CameraTopic("top", "/camera/top/image_raw")]

    return configure


def replay_metrics(tmp_path: Path, checkpoint: Path, spec) -> dict:
    """`omni-ros eval` of a synthetic bag (`spec`) through `checkpoint`: its metrics.json, schema-checked."""
    from omni_ros.eval.evaluate import evaluate
    from omni_ros.eval.schema import validate
    from omni_ros.eval.synthetic import write_synthetic_bag

    bag = write_synthetic_bag(tmp_path / "bag", spec)
    config = spec.config()
    config.policy.checkpoint = str(checkpoint)
    evaluate([bag], config, out_dir=tmp_path / "out", progress=False)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert validate(metrics) == []
    return metrics
