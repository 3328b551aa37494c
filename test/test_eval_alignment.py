"""Time alignment: out-of-order stamps, missing frames, different camera rates, instants, episodes, sources."""

from __future__ import annotations

import numpy as np
import pytest

from omni_ros.eval.bag import JOINT_TRAJECTORY
from omni_ros.eval.evaluate import evaluate
from omni_ros.eval.groundtruth import GroundTruthCollector, Track
from omni_ros.eval.metrics import Prediction, chunk_boundary_jump
from omni_ros.eval.synthetic import T_START, ConstantPolicy, OraclePolicy, SyntheticSpec, write_synthetic_bag


def run(tmp_path, spec, policy=None, storage="mcap", **overrides):
    bag = write_synthetic_bag(tmp_path / f"bag{len(list(tmp_path.iterdir()))}", spec, storage=storage)
    policy = policy or OraclePolicy(spec)
    return evaluate([str(bag)], spec.config(**overrides), policy=policy, progress=False), policy


# ----- the track ------------------------------------------------------------------------------------------------


def test_track_interpolates_and_refuses_gaps_and_outside():
    track = Track(np.array([0.0, 0.1, 0.2, 1.0, 1.1]), np.array([[0.0], [1.0], [2.0], [5.0], [6.0]]), max_gap_s=0.25)
    values, valid = track.sample(np.array([-0.01, 0.0, 0.05, 0.2, 0.5, 1.0, 1.05, 1.2]))
    assert valid.tolist() == [False, True, True, True, False, True, True, False]
    assert values[valid, 0] == pytest.approx([0.0, 0.5, 2.0, 5.0, 5.5])


def test_track_sorts_out_of_order_stamps_and_keeps_the_later_duplicate():
    track = Track(np.array([0.2, 0.0, 0.1, 0.1]), np.array([[2.0], [0.0], [9.0], [1.0]]), max_gap_s=1.0)
    assert track.times.tolist() == [0.0, 0.1, 0.2]
    assert track.values[:, 0].tolist() == [0.0, 1.0, 2.0]


class _Traj:
    """A JointTrajectory-shaped object (the collector reads attributes only)."""

    def __init__(self, stamp, names, points):
        sec = int(stamp)
        self.header = type("H", (), {"stamp": type("T", (), {"sec": sec, "nanosec": round((stamp - sec) * 1e9)})})
        self.joint_names = names
        self.points = [
            type("P", (), {"positions": p, "time_from_start": type("D", (), {"sec": 0, "nanosec": round(tfs * 1e9)})})
            for p, tfs in points
        ]


def test_ground_truth_reorders_joints_and_rejects_bad_commands():
    gt = GroundTruthCollector(["a", "b"], JOINT_TRAJECTORY)
    gt.add(_Traj(10.0, ["b", "a", "c"], [([2.0, 1.0, 7.0], 0.02)]), 10.001)
    gt.add(_Traj(10.02, ["a"], [([1.0], 0.02)]), 10.021)  # lacks b
    gt.add(_Traj(10.04, ["a", "b"], [([float("nan"), 1.0], 0.02)]), 10.041)
    track = gt.track()
    assert track.times.tolist() == [10.0] and track.values.tolist() == [[1.0, 2.0]]
    assert sum(gt.rejected.values()) == 2


def test_ground_truth_all_points_later_trajectory_wins():
    gt = GroundTruthCollector(["a"], JOINT_TRAJECTORY, trajectory_points="all")
    gt.add(_Traj(1.0, ["a"], [([1.0], 0.1), ([2.0], 0.2), ([3.0], 0.3)]), 1.0)
    gt.add(_Traj(1.25, ["a"], [([10.0], 0.1)]), 1.25)
    track = gt.track()
    assert track.times == pytest.approx([1.1, 1.2, 1.35])
    assert track.values[:, 0].tolist() == [1.0, 2.0, 10.0]


def test_chunk_boundary_jump_compares_at_the_new_chunks_time():
    old = Prediction(0.0, 0.0, np.array([[0.0], [1.0], [2.0], [3.0]]), 0.1, 0.0)
    assert chunk_boundary_jump(old, Prediction(0.15, 0.15, np.array([[2.0], [0.0]]), 0.1, 0.0)) == pytest.approx(0.5)
    assert chunk_boundary_jump(old, Prediction(0.5, 0.5, np.array([[2.0], [0.0]]), 0.1, 0.0)) is None


# ----- stamps and frames ----------------------------------------------------------------------------------------


def test_out_of_order_frames_are_dropped_like_the_node_does(tmp_path):
    spec = SyntheticSpec(duration_s=1.2, out_of_order_frames={"base": [0.4, 0.8], "wrist": [0.6]})
    result, _ = run(tmp_path, spec)
    o = result.document["overall"]
    assert o["dropped_out_of_order"] == 3
    # Dropped trigger frames are not instants; the dropped wrist frame leaves the older one in use.
    assert o["instants"] == len(spec.frame_times("base")) - 2
    assert o["skipped"]["total"] == 0
    assert o["mae"] < 1e-5


def test_missing_frames_make_instants_stale_with_the_reason(tmp_path):
    gap = [round(0.4 + 0.04 * k, 2) for k in range(20)]  # wrist frames 0.40 .. 1.16 missing
    spec = SyntheticSpec(duration_s=2.0, drop_frames={"wrist": gap})
    result, _ = run(tmp_path, spec)
    o = result.document["overall"]
    taus = spec.frame_times("base")
    # Held wrist frame from 0.36; stale once older than camera_stale_s (0.5 s) until a frame arrives at 1.2.
    stale = int(np.sum((taus - 0.36 > 0.5 + 1e-9) & (taus < 1.2 - 1e-9)))
    assert stale == 8
    assert o["skipped"]["reasons"] == {"camera 'wrist' is stale": stale}
    assert o["evaluated"] == len(taus) - stale
    assert o["mae"] < 1e-5


def test_different_camera_rates_anchor_chunks_at_the_oldest_input(tmp_path):
    spec = SyntheticSpec(duration_s=1.5, cameras={"base": ("/cam/base", 30.0), "wrist": ("/cam/wrist", 10.0)})
    result, policy = run(tmp_path, spec)
    o = result.document["overall"]
    assert o["evaluated"] == len(spec.frame_times("base"))
    t0s = [p.t0 - T_START for p in result.result.episodes[0].predictions]
    assert t0s == pytest.approx(policy.stamps, abs=1e-6)
    # Most observations are anchored at the slower camera's frame, not at the trigger frame.
    assert sum(abs(t * 10 - round(t * 10)) < 1e-6 for t in t0s) >= len(t0s) // 2
    assert o["mae"] < 2e-4


def test_every_k_frames_and_fixed_rate_instants(tmp_path):
    spec = SyntheticSpec(duration_s=2.0)
    by_frame, _ = run(tmp_path, spec, every_k_frames=5)
    assert by_frame.document["overall"]["instants"] == 11  # frames 0, 5, ..., 50 of 51

    by_rate, _ = run(tmp_path, spec, rate_hz=10.0)
    o = by_rate.document["overall"]
    # 0.0 .. 2.5 s (commands run 0.5 s past the last frame); the last state is at 2.0 s, stale after 2.25 s.
    assert o["instants"] == 26
    assert o["skipped"]["reasons"] == {"joint state is stale": 3}
    assert o["mae"] < 1e-4


def test_compressed_images(tmp_path):
    spec = SyntheticSpec(duration_s=0.6, compressed=True)
    result, _ = run(tmp_path, spec, storage="sqlite3")
    o = result.document["overall"]
    assert o["evaluated"] == len(spec.frame_times("base")) and o["mae"] < 1e-5


# ----- ground-truth sources ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["joint_state", "array"])
def test_joint_state_and_array_commands(tmp_path, kind):
    spec = SyntheticSpec(duration_s=0.8, command_kind=kind)
    result, _ = run(tmp_path, spec)
    o = result.document["overall"]
    assert o["aligned_samples"] == len(spec.frame_times("base")) and o["mae"] < 1e-5


def test_future_joint_states_at_an_offset(tmp_path):
    spec = SyntheticSpec(duration_s=1.5)
    offset = 0.1
    gt = {"source": "joint_states", "offset_s": offset}
    config = spec.config()
    config.eval.ground_truth.source = gt["source"]
    config.eval.ground_truth.offset_s = offset
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    ahead = evaluate([str(bag)], config, policy=OraclePolicy(spec, offset_s=offset), progress=False).document
    now = evaluate([str(bag)], config, policy=OraclePolicy(spec), progress=False).document
    assert ahead["overall"]["mae"] < 1e-5
    assert now["overall"]["mae"] > 100 * ahead["overall"]["mae"] + 1e-3
    assert ahead["settings"]["ground_truth"] == {"source": "joint_states", "topic": "/joint_states", "offset_s": 0.1}
    # The track ends at the last state minus the offset (1.4 s): later instants are not extrapolated.
    taus = spec.frame_times("base")
    assert ahead["overall"]["evaluated"] == len(taus)
    assert ahead["overall"]["aligned_samples"] == int(np.sum(taus <= 1.4 + 1e-9))


# ----- episodes -----------------------------------------------------------------------------------------------------


def test_each_bag_is_an_episode_and_metrics_pool_exactly(tmp_path):
    specs = [SyntheticSpec(duration_s=0.6), SyntheticSpec(duration_s=1.0, offset=[0.3, 0.0, 0.0])]
    bags = [str(write_synthetic_bag(tmp_path / f"b{i}", s)) for i, s in enumerate(specs)]
    policy = ConstantPolicy(specs[0], [0.0, 0.0, 0.0])
    doc = evaluate(bags, specs[0].config(), policy=policy, progress=False).document
    eps = doc["episodes"]
    assert [e["bag"] for e in eps] == bags and doc["overall"]["episodes"] == 2
    n = [e["scored_values"] for e in eps]
    pooled = sum(e["mse"] * k for e, k in zip(eps, n, strict=True)) / sum(n)
    assert doc["overall"]["mse"] == pytest.approx(pooled, rel=1e-9)
    assert eps[0]["mse"] != pytest.approx(eps[1]["mse"])
