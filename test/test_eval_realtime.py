"""Real-time mode: the bag played over DDS to a policy node in another process, its output scored."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from omni_ros.config import load_config
from omni_ros.eval.bag import JOINT_STATE, Bag
from omni_ros.eval.realtime import restamp
from omni_ros.eval.schema import validate
from omni_ros.eval.synthetic import T_START, SyntheticSpec, write_synthetic_bag

CONFIG = """
name: realtime_test
policy: {preset: tiny, num_threads: 1}
robot: {joint_names: [j1, j2, j3], dry_run: false}
status: {rate_hz: 2.0}
topics:
  cameras: [{name: base, topic: /cam/base}, {name: wrist, topic: /cam/wrist}]
  joint_states: /joint_states
  prompt: /prompt
  action_chunk: /rt_test/action_chunk
control:
  command_topic: /rt_test/command
eval:
  ground_truth: {topic: /command}
"""


def test_restamp_moves_the_header_stamp_only(tmp_path):
    spec = SyntheticSpec(duration_s=0.1)
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    with Bag(bag) as b:
        *_, raw = next(iter(b.raw([spec.state_topic])))
        moved = restamp(bytes(raw), 12.75)
        before, after = (b.typestore.deserialize_cdr(x, JOINT_STATE) for x in (raw, moved))
    assert len(moved) == len(raw)
    t = lambda m: m.header.stamp.sec + m.header.stamp.nanosec * 1e-9  # noqa: E731
    assert t(after) - t(before) == pytest.approx(12.75, abs=1e-6)
    assert list(after.name) == list(before.name) and np.array_equal(after.position, before.position)


@pytest.fixture
def policy_node(tmp_path, root):
    config = tmp_path / "rt.yaml"
    config.write_text(CONFIG)
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni_ros.cli", "node", "policy", "--config", str(config)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    yield config, proc
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_realtime_against_the_policy_node_process(tmp_path, policy_node):
    from omni_ros.eval.realtime import evaluate_realtime

    config_path, proc = policy_node
    spec = SyntheticSpec(duration_s=2.5)
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    out = tmp_path / "out"
    config = load_config(config_path)
    result = evaluate_realtime([str(bag)], config, out_dir=out, progress=False, discovery_timeout_s=60)
    assert proc.poll() is None, proc.stdout.read()

    doc = json.loads((out / "metrics.json").read_text())
    assert validate(doc) == [] and doc["mode"] == "realtime"
    rt = doc["realtime"]
    assert rt["messages_published"] > 200
    assert rt["chunks_received"] >= 5 and rt["commands_received"] >= 20
    # Published on time: the bag's timing is kept.
    assert rt["lateness_ms"]["p50"] < 50
    o = doc["overall"]
    assert o["aligned_samples"] >= 5 and o["mae"] is not None and o["latency_ms"]["count"] == o["evaluated"]
    assert rt["executed"]["samples"] >= 10 and rt["executed"]["mae"] is not None
    # Chunks answer observations made of the bag's own (restamped and mapped back) inputs.
    t0s = [p.t0 - T_START for e in result.result.episodes for p in e.predictions]
    assert min(t0s) >= -1e-6 and max(t0s) <= spec.duration_s + 1e-6
    assert all(abs(t * 25 - round(t * 25)) < 1e-3 or abs(t * 50 - round(t * 50)) < 1e-3 for t in t0s)
    assert "executed" in (out / "report.html").read_text()


def test_realtime_without_a_node_is_a_clear_error(tmp_path):
    from omni_ros.eval.errors import EvalError
    from omni_ros.eval.realtime import evaluate_realtime

    spec = SyntheticSpec(duration_s=0.2)
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    config = spec.config()
    config.topics.action_chunk = "/nobody/action_chunk"
    with pytest.raises(EvalError, match="no policy node found within 1 s"):
        evaluate_realtime([str(bag)], config, progress=False, discovery_timeout_s=1.0)
