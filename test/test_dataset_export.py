"""`omni-ros dataset export` against what LeRobot 0.6.1 read from the same export (test/fixtures/dataset/, made by
`make reference-fixtures`), against the bag itself, and `omni-ros eval --dataset` on a dataset LeRobot wrote.

The sim recording is deterministic (same config, seed and duration: same bag), so the export made here is the
one LeRobot loaded when the fixture was made. No LeRobot import: the suite runs without its venv.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.export_child import export_in_child
from omni_ros.cli import main
from omni_ros.config import load_config
from omni_ros.dataset import stats as st
from omni_ros.dataset.reader import DatasetFolder
from omni_ros.dataset.replay_source import dataset_config, opener
from omni_ros.eval.bag import Bag
from omni_ros.eval.evaluate import evaluate, load_eval_policy
from omni_ros.eval.record_sim import record_sim
from omni_ros.eval.recorded import read_recorded_config
from omni_ros.eval.schema import validate

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "test" / "fixtures" / "dataset"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
FPS = EXPECTED["recording"]["fps"]
# AV1 (crf 30, yuv420p) on 96x64 drawings with sharp colored edges: LeRobot's decode of the fixture's export was
# 2.0-2.4 grey levels from the raw frames on average (max 95 on edges); the mean is what we bound.
CODEC_MEAN_ABS = 4.0
# Our stats against LeRobot's on the same inputs: 0 difference when the fixture was made. Joint values (state,
# action) get 1e-6: a float32 ulp of a value another CPU's simulator (or numpy's SIMD sin/cos) computes a hair
# differently; everything else (pixels, indices, timestamps) is exact arithmetic on identical inputs: 1e-12.
STATS_ATOL = 1e-6
EXACT_ATOL = 1e-12


def atol(feature: str) -> float:
    return STATS_ATOL if feature in ("observation.state", "action") else EXACT_ATOL


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("dataset")
    config = load_config(FIXTURE / "sim_small.yaml")
    config.robot.dry_run = False
    rec = EXPECTED["recording"]
    record_sim(config, root / "bag", rec["episodes"], duration_s=rec["duration_s"])
    recorded = read_recorded_config(str(root / "bag"))
    assert recorded is not None
    # In a fresh process, killed if it overruns (helpers/export_child.py says why).
    summary = export_in_child([str(root / "bag")], recorded.config, root / "ds", fps=FPS, progress=False)
    return root / "bag", root / "ds", summary


def test_export_reads_in_lerobot_as_the_reference_says(exported):
    _, ds, summary = exported
    folder = DatasetFolder(ds)
    info = json.loads((ds / "meta" / "info.json").read_text())
    assert summary.frames == info["total_frames"] == EXPECTED["total_frames"]
    assert summary.episodes == info["total_episodes"] == EXPECTED["total_episodes"]
    assert info["fps"] == EXPECTED["fps"]
    features = {k: {"dtype": v["dtype"], "shape": v["shape"], "names": v["names"]} for k, v in info["features"].items()}
    assert features == EXPECTED["features"]
    assert [folder.tasks[i] for i in sorted(folder.tasks)] == EXPECTED["tasks"]
    lengths = [{"length": e.length, "from": e.start, "to": e.start + e.length} for e in folder.episodes]
    assert lengths == EXPECTED["episodes"]
    data = folder.data()
    frames = np.load(FIXTURE / "expected_frames.npz")
    # Same recording: identical on the machine that made the fixture; STATS_ATOL leaves room for another CPU's
    # last-bit differences in the simulator's trigonometry (numpy picks SIMD sin/cos by CPU).
    np.testing.assert_allclose(data["state"], frames["state"], rtol=0, atol=STATS_ATOL)
    np.testing.assert_allclose(data["action"], frames["action"], rtol=0, atol=STATS_ATOL)


def test_stats_equal_lerobots_own(exported):
    """LeRobot's writer computed these stats from the same raw frames; ours must match (atol() per feature)."""
    _, ds, _ = exported
    ours = json.loads((ds / "meta" / "stats.json").read_text())
    theirs = EXPECTED["lerobot_stats"]
    assert set(ours) == set(theirs)
    for key, stats in theirs.items():
        assert set(ours[key]) == set(stats), key
        for stat, value in stats.items():
            np.testing.assert_allclose(ours[key][stat], value, rtol=0, atol=atol(key), err_msg=f"{key}/{stat}")


def test_stats_equal_lerobots_on_a_long_episode_of_large_frames():
    """Over 100 frames (LeRobot samples ~100 for image stats) and 320 px wide (it strides by 2): LeRobot's
    compute_episode_stats on the same formula-made inputs (scripts/make_dataset_fixtures.py), within atol()."""
    length, height, width = 150, 240, 320
    i = np.arange(length)[:, None, None, None]
    y = np.arange(height)[None, :, None, None]
    x = np.arange(width)[None, None, :, None]
    c = np.arange(3)[None, None, None, :]
    images = ((i * 13 + y * 3 + x * 7 + c * 50 + (x * y) % 17) % 256).astype(np.uint8)
    t = np.arange(length)[:, None]
    vectors = (np.sin(0.1 * t * (np.arange(4)[None, :] + 1)) + 0.01 * np.arange(4)[None, :]).astype(np.float32)
    picked = [st.downsample(images[k]) for k in st.image_sample_indices(length)]
    assert len(picked) == 100 and picked[0].shape == (120, 160, 3)
    ours = {"observation.images.cam": st.image_stats(picked), "observation.state": st.vector_stats(vectors)}
    for key, stats in EXPECTED["stats_case"].items():
        assert set(stats) == set(ours[key])
        for stat, value in stats.items():
            np.testing.assert_allclose(ours[key][stat], value, rtol=0, atol=atol(key), err_msg=f"{key}/{stat}")


def test_decoded_frames_match_lerobots_decode(exported):
    _, ds, _ = exported
    folder = DatasetFolder(ds)
    frames = np.load(FIXTURE / "expected_frames.npz")
    wanted = EXPECTED["decoded_indices"]
    decoded: dict[str, list[np.ndarray]] = {c: [] for c in folder.cameras}
    for ep in folder.episodes:
        for k, frame in enumerate(folder.frames(ep.index)):
            if ep.start + k in wanted:
                for cam in folder.cameras:
                    decoded[cam].append(frame.images[cam])
    for cam in folder.cameras:
        ours = np.stack(decoded[cam]).astype(np.int16)
        lerobot = frames[f"decoded.observation.images.{cam}"].astype(np.int16)
        assert ours.shape == lerobot.shape
        # Both decode the same AV1 stream (PyAV here, LeRobot's PyAV fallback there): within 1 grey level mean.
        assert np.abs(ours - lerobot).mean() <= 1.0, cam


def _bag_tracks(bag_path: Path):
    """The bag's raw streams, read without the exporter: base-camera frames, joint states, commands (by stamp)."""
    streams: dict[str, list] = {"base": [], "wrist": [], "state": [], "command": []}
    with Bag(bag_path) as bag:
        episodes = json.loads(bag.custom_data["omni_ros.episodes"])
        topics = [
            "/camera/base/image_raw",
            "/camera/wrist/image_raw",
            "/joint_states",
            "/arm_controller/joint_trajectory",
        ]
        for topic, _, msg in bag.read(topics):
            stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
            if topic.startswith("/camera/"):
                rgb = np.frombuffer(bytes(msg.data), np.uint8).reshape(msg.height, msg.width, 3)
                streams["base" if "base" in topic else "wrist"].append((stamp, rgb))
            elif topic == "/joint_states":
                streams["state"].append((stamp, np.asarray(msg.position, np.float32)))
            else:
                streams["command"].append((stamp, np.asarray(msg.points[0].positions, np.float32)))
    return episodes, streams


def test_frames_are_the_bags_values_at_the_sampled_times(exported):
    """Independently of the exporter: ticks t0 + n / fps on the base camera, nearest frame, latest joint state and
    command at that frame's stamp (joint names are already in robot order in this bag)."""
    bag, ds, _ = exported
    episodes, streams = _bag_tracks(bag)
    folder = DatasetFolder(ds)
    data = folder.data()
    base_t = np.array([t for t, _ in streams["base"]])
    state_t = np.array([t for t, _ in streams["state"]])
    cmd_t = np.array([t for t, _ in streams["command"]])
    checked = 0
    for ep, meta in zip(folder.episodes, episodes, strict=True):
        t0 = base_t[base_t >= meta["start"] - 1e-6][0]
        frames = list(folder.frames(ep.index))
        for n, frame in enumerate(frames):
            tick = t0 + n / FPS
            k = int(np.argmin(np.abs(base_t - tick)))
            assert abs(base_t[k] - tick) <= 0.5 / FPS + 1e-9
            stamp = base_t[k]
            expected_state = streams["state"][int(np.searchsorted(state_t, stamp, side="right")) - 1][1]
            expected_action = streams["command"][int(np.searchsorted(cmd_t, stamp, side="right")) - 1][1]
            np.testing.assert_array_equal(data["state"][ep.start + n], expected_state)
            np.testing.assert_array_equal(data["action"][ep.start + n], expected_action)
            if n in (0, len(frames) // 2):
                error = np.abs(frame.images["base"].astype(np.int16) - streams["base"][k][1].astype(np.int16))
                assert error.mean() < CODEC_MEAN_ABS
            checked += 1
    assert checked == EXPECTED["total_frames"]


def test_eval_dataset_on_lerobots_own_dataset(tmp_path):
    """`omni-ros eval --dataset` on the tiny dataset LeRobot 0.6.1 wrote, with the shipped demo policy."""
    out = tmp_path / "eval"
    argv = ["eval", "--dataset", str(FIXTURE / "lerobot_tiny"), "--config", str(ROOT / "config" / "eval_sim.yaml")]
    assert main([*argv, "--out", str(out), "--episodes", "0", "2", "-q"]) == 0
    doc = json.loads((out / "metrics.json").read_text())
    assert validate(doc) == []
    assert doc["overall"]["episodes"] == 2
    assert doc["overall"]["evaluated"] == 2 * 60 // 3  # every 3rd frame (config/eval_sim.yaml), 60 per episode
    # The demo policy follows the recorded expert far better than holding still (docs/eval.md: 0.04 vs 0.24).
    assert doc["overall"]["mae"] < 0.5 * doc["overall"]["baseline_hold"]["mae"]
    assert (out / "report.html").is_file()


def test_replay_of_the_export_equals_replay_of_the_bag(exported):
    """Every frame an instant, both ways: the same observations (states identical) give the same actions, up to what
    the video codec changed in the pixels (measured with the demo policy: max |diff| 0.080 rad, mean of the per-chunk
    maxima 0.025; bounds 0.15 and 0.05)."""
    bag, ds, _ = exported
    recorded = read_recorded_config(str(bag))
    assert recorded is not None
    config = recorded.config
    config.eval.every_k_frames = 1
    config.eval.rate_hz = 0.0
    policy = load_eval_policy(config)
    from_bag = evaluate([str(bag)], config, policy=policy, progress=False).result
    dconfig = dataset_config(config, DatasetFolder(ds))
    from_ds = evaluate([str(ds)], dconfig, policy=policy, progress=False, opener=opener(dconfig, None)).result
    assert len(from_bag.episodes) == len(from_ds.episodes) == EXPECTED["total_episodes"]
    worst: list[float] = []
    for eb, ed in zip(from_bag.episodes, from_ds.episodes, strict=True):
        # The bag's first instant of an episode comes before the wrist camera's first frame (skipped there); the
        # export waited for it. After that, instant k of the bag is frame k + 1 of the dataset.
        assert eb.skipped.total() == 1 and ed.skipped.total() == 0
        assert len(ed.predictions) == len(eb.predictions) + 1
        for pb, pd in zip(eb.predictions, ed.predictions[1:], strict=True):
            np.testing.assert_array_equal(pb.state, pd.state)
            worst.append(float(np.abs(pb.actions - pd.actions).max()))
    assert max(worst) < 0.15 and float(np.mean(worst)) < 0.05, (max(worst), float(np.mean(worst)))
