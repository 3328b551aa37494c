"""`omni-ros dataset export` on synthetic bags: resampling, the action source, and bad input (one clear error each,
nothing half-written left behind); `eval --dataset` on a dataset of another version."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.export_child import export_in_child
from omni_ros.cli import main
from omni_ros.config import CONFIG_DIR, load_config
from omni_ros.dataset.reader import DatasetFolder
from omni_ros.dataset.writer import DatasetError
from omni_ros.eval.bagwrite import BagWriter
from omni_ros.eval.errors import TopicError

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "dataset"
NAMES = ["joint_1", "joint_2", "joint_3"]


def write_bag(path: Path, episodes: list[dict]) -> Path:
    """Episodes of 1 s at 30 Hz (cameras, joint states, commands; the prompt first): config/eval_sim.yaml's topics.

    Each dict may set `wrist: False` (no wrist frames), `resize_at: i` (the base camera grows from frame i) and
    `jpeg: True` (the base camera as CompressedImage)."""
    rng = np.random.default_rng(0)
    with BagWriter(path) as bag:
        for k, ep in enumerate(episodes):
            start = 100.0 + 5.0 * k
            bag.string("/omni_ros/prompt", f"task {k}", start)
            for i in range(30):
                t = start + i / 30
                q = np.full(3, 0.01 * i + k)
                bag.joint_state("/joint_states", NAMES, q, t)
                bag.trajectory("/arm_controller/joint_trajectory", NAMES, [q + 0.1], t)
                width = 48 if i >= ep.get("resize_at", 10**9) else 32
                base = rng.integers(0, 255, (24, width, 3), np.uint8)
                if ep.get("jpeg"):
                    bag.compressed("/camera/base/image_raw", base, t, t + 1e-3)
                else:
                    bag.image("/camera/base/image_raw", base, t, t + 1e-3)
                if ep.get("wrist", True):
                    bag.image("/camera/wrist/image_raw", rng.integers(0, 255, (24, 32, 3), np.uint8), t, t + 1e-3)
    return path


@pytest.fixture
def config():
    return load_config(CONFIG_DIR / "eval_sim.yaml")


def nothing_left(out: Path) -> bool:
    return not out.exists() and not list(out.parent.glob(f".{out.name}.partial-*"))


@pytest.mark.parametrize("jpeg", [False, True])
def test_a_good_synthetic_bag_exports(tmp_path, config, jpeg):
    """Two episodes split by the prompt topic; the base camera raw or JPEG (CompressedImage)."""
    bag = write_bag(tmp_path / "bag", [{"jpeg": jpeg}, {"jpeg": jpeg}])
    summary = export_in_child([str(bag)], config, tmp_path / "ds", progress=False)
    assert (summary.episodes, summary.frames) == (2, 60)
    assert sum(summary.dropped.values()) == 0
    folder = DatasetFolder(tmp_path / "ds")
    assert folder.tasks == {0: "task 0", 1: "task 1"}
    assert [f.images["base"].shape for f in folder.frames(1)][:1] == [(24, 32, 3)]


def test_a_bag_without_the_configured_topics(tmp_path, config):
    bag = write_bag(tmp_path / "bag", [{}])
    config.eval.cameras[1].topic = "/camera/side/image_raw"
    with pytest.raises(TopicError, match=r"no topic '/camera/side/image_raw' \(camera 'wrist'\); topics in the bag"):
        export_in_child([str(bag)], config, tmp_path / "ds", progress=False)
    assert nothing_left(tmp_path / "ds")


def test_an_episode_with_no_frames_at_the_fps(tmp_path, config):
    bag = write_bag(tmp_path / "bag", [{}, {"wrist": False}])
    with pytest.raises(DatasetError, match=r"episode at 105\.000 s .*no frames at 30 fps \(no frame yet from camera "):
        export_in_child([str(bag)], config, tmp_path / "ds", progress=False)
    assert nothing_left(tmp_path / "ds")


def test_a_camera_whose_size_changes_mid_episode(tmp_path, config):
    bag = write_bag(tmp_path / "bag", [{"resize_at": 12}])
    with pytest.raises(DatasetError, match=r"camera 'base' changed size from 32x24 to 48x24 \(frame 12 of the episode"):
        export_in_child([str(bag)], config, tmp_path / "ds", progress=False)
    assert nothing_left(tmp_path / "ds")


def test_an_existing_output_folder_is_refused_unless_overwrite(tmp_path, config, capsys):
    bag = write_bag(tmp_path / "bag", [{}])
    out = tmp_path / "ds"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    argv = ["dataset", "export", str(bag), "--config", str(CONFIG_DIR / "eval_sim.yaml"), "--out", str(out), "-q"]
    assert main(argv) == 2
    assert "exists and is not empty; choose another folder or pass --overwrite" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine"
    # The export itself in a child process, as the command runs (helpers/export_child.py says why).
    cmd = [sys.executable, "-m", "omni_ros.cli", *argv, "--overwrite"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (out / "notes.txt").exists() and (out / "meta" / "info.json").is_file()
    assert not list(tmp_path.glob(".ds.*"))


def test_a_dataset_of_another_version(tmp_path, capsys):
    old = tmp_path / "old"
    shutil.copytree(FIXTURE / "lerobot_tiny", old)
    info = json.loads((old / "meta" / "info.json").read_text())
    info["codebase_version"] = "v2.1"
    (old / "meta" / "info.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=r"is LeRobotDataset v2\.1; omni_ros reads v3\.0"):
        DatasetFolder(old)
    argv = ["eval", "--dataset", str(old), "--config", str(CONFIG_DIR / "eval_sim.yaml"), "--out", str(tmp_path / "e")]
    assert main([*argv, "-q"]) == 2
    assert "v2.1" in capsys.readouterr().err


def test_action_from_the_next_joint_state_when_the_config_says_so(tmp_path, config):
    """eval.ground_truth.source: joint_states -> a frame's action is the first joint state after its stamp."""
    bag = write_bag(tmp_path / "bag", [{}])
    config.eval.ground_truth.source = "joint_states"
    summary = export_in_child([str(bag)], config, tmp_path / "ds", progress=False)
    data = DatasetFolder(tmp_path / "ds").data()
    # Joint states come with every frame here, so frame i's action is frame i + 1's state; the last has no next one.
    assert summary.frames == 29
    assert summary.dropped == {"no joint state within 0.25 s after the frame (action source)": 1}
    np.testing.assert_array_equal(data["action"][:-1], data["state"][1:])


@pytest.mark.parametrize(("fps", "frames", "no_frame"), [(15, 15, 0), (60, 30, 29)])
def test_resampling_on_the_trigger_camera(tmp_path, config, fps, frames, no_frame):
    """A 30 Hz camera at --fps 15 gives every other frame; at --fps 60 every other tick has no frame (dropped)."""
    bag = write_bag(tmp_path / "bag", [{}])
    summary = export_in_child([str(bag)], config, tmp_path / "ds", fps=fps, progress=False)
    assert summary.frames == frames
    assert summary.dropped.get("no trigger-camera frame within half a period of the tick", 0) == no_frame
    state = DatasetFolder(tmp_path / "ds").data()["state"]
    recorded = 0.01 * np.arange(30)  # write_bag's joint positions at frame i
    step = 2 if fps == 15 else 1
    np.testing.assert_allclose(state[:, 0], recorded[::step][:frames], atol=1e-6)


def test_eval_dataset_with_other_joint_names(tmp_path, config, capsys):
    """A dataset whose state names lack the robot's joints: said in one line, before any replay."""
    bag = write_bag(tmp_path / "bag", [{}])
    export_in_child([str(bag)], config, tmp_path / "ds", progress=False)
    argv = ["eval", "--dataset", str(tmp_path / "ds"), "--config", str(CONFIG_DIR / "default.yaml")]
    assert main([*argv, "--out", str(tmp_path / "e"), "-q"]) == 2
    err = capsys.readouterr().err
    names = "['joint_1', 'joint_2', 'joint_3']"
    assert f"observation.state names {names} lack robot.joint_names ['joint_4', 'joint_5'" in err
