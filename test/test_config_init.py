"""`omni-ros config init` on every reference checkpoint, `config check` against the checkpoint (cameras, dims,
joints), each with a mismatch that must be caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from omni_ros.cli import main
from omni_ros.config import load_config

REF = Path(__file__).resolve().parent / "fixtures" / "reference"

# fixture -> (cameras in the checkpoint's order, state dim, action dim, tokenizer folder for openpi's); the
# numbers are the fixture README's table (openpi's cameras are its fixed image keys), written down here so a
# reader that got them wrong fails.
FIXTURES = {
    "pi0_1cam": (["top"], 8, 7, None),
    "pi0_3cam": (["top", "left_wrist", "right_wrist"], 8, 7, None),
    "pi05_2cam": (["top", "left_wrist"], 7, 6, None),
    "smolvla_3cam": (["top", "left_wrist", "right_wrist"], 6, 7, None),
    "pi0_arm": (["top", "left_wrist"], 6, 6, None),
    "openpi_pi0": (["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"], 8, 7, "pi0_3cam"),
    "openpi_pi05": (["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"], 7, 6, "pi05_2cam"),
}


def _init(tmp_path: Path, name: str, checkpoint: Path | None = None) -> Path:
    tok = FIXTURES[name][3]
    out = tmp_path / f"{name}.yaml"
    argv = ["config", "init", "--checkpoint", str(checkpoint or REF / name), "--out", str(out)]
    if tok:
        argv += ["--tokenizer", str(REF / tok)]
    assert main(argv) == 0
    return out


def _check(path: Path, *extra: str) -> int:
    return main(["config", "check", "--config", str(path), *extra])


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_init_writes_the_checkpoints_cameras_and_joints(tmp_path, capsys, name):
    cameras, state, action, _ = FIXTURES[name]
    out = _init(tmp_path, name)
    config = load_config(out)
    assert [c.name for c in config.topics.cameras] == cameras
    assert [c.topic for c in config.topics.cameras] == [f"/camera/{c}/image_raw" for c in cameras]
    # No fixture stores names: placeholders, one per action dim, said to be placeholders in the file.
    assert config.robot.joint_names == [f"joint_{i}" for i in range(1, action + 1)]
    text = out.read_text()
    assert "PLACEHOLDERS" in text
    assert config.robot.dry_run is True
    assert Path(config.policy.checkpoint or "") == (REF / name).resolve()
    capsys.readouterr()
    status = _check(out)
    err = capsys.readouterr().err
    if state == action:
        assert status == 0, err
    else:
        # The node reads and commands the same joints: a checkpoint with state != action dims cannot be served,
        # and both init (a WARNING in the file) and check say so.
        assert status == 1
        assert f"state has {state} dims but its action {action}" in err
        assert "WARNING" in text


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_check_catches_a_camera_set_mismatch(tmp_path, capsys, name):
    out = _init(tmp_path, name)
    data = yaml.safe_load(out.read_text())
    first = data["topics"]["cameras"][0]["name"]
    data["topics"]["cameras"][0]["name"] = "not_a_camera"
    out.write_text(yaml.safe_dump(data))
    capsys.readouterr()
    assert _check(out) == 1
    err = capsys.readouterr().err
    assert f"no topic for ['{first}']" in err
    assert "['not_a_camera'] not in the checkpoint" in err


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_check_catches_a_joint_count_mismatch(tmp_path, capsys, name):
    action = FIXTURES[name][2]
    out = _init(tmp_path, name)
    data = yaml.safe_load(out.read_text())
    data["robot"]["joint_names"] = data["robot"]["joint_names"][:-1]
    out.write_text(yaml.safe_dump(data))
    capsys.readouterr()
    assert _check(out) == 1
    err = capsys.readouterr().err
    assert f"lists {action - 1} joints but the checkpoint's action has {action}" in err


def test_check_catches_cameras_in_another_order(tmp_path, capsys):
    out = _init(tmp_path, "pi0_arm")
    data = yaml.safe_load(out.read_text())
    data["topics"]["cameras"].reverse()
    out.write_text(yaml.safe_dump(data))
    capsys.readouterr()
    assert _check(out) == 1
    assert "same cameras in another order" in capsys.readouterr().err


def _with_config(tmp_path: Path, name: str, **changes) -> Path:
    """A copy of reference fixture `name` (files linked) whose config.json has `changes`."""
    folder = tmp_path / f"{name}_named"
    folder.mkdir()
    for file in (REF / name).iterdir():
        if file.name != "config.json":
            (folder / file.name).symlink_to(file)
    config = json.loads((REF / name / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_joint_names_come_from_the_checkpoint_where_it_has_them(tmp_path, capsys):
    names = ["shoulder_pan.pos", "shoulder_lift.pos", "elbow_flex.pos", "wrist_flex.pos", "wrist_roll.pos", "gripper"]
    folder = _with_config(tmp_path, "pi0_arm", action_feature_names=names)
    out = _init(tmp_path, "pi0_arm", checkpoint=folder)
    config = load_config(out)
    # LeRobot's "<joint>.pos" motor features are the ROS joint "<joint>".
    assert config.robot.joint_names == [
        "shoulder_pan",
        "shoulder_lift",
        "elbow_flex",
        "wrist_flex",
        "wrist_roll",
        "gripper",
    ]
    assert "PLACEHOLDERS" not in out.read_text()
    assert "action_feature_names" in out.read_text()
    capsys.readouterr()
    assert _check(out) == 0
    # Renamed joints are served (a robot's URDF may name them differently), with a warning naming them.
    data = yaml.safe_load(out.read_text())
    data["robot"]["joint_names"][0] = "pan"
    out.write_text(yaml.safe_dump(data))
    assert _check(out) == 0
    assert "0: 'pan' vs 'shoulder_pan'" in capsys.readouterr().err


def test_feature_names_of_the_wrong_length_fall_back_to_placeholders(tmp_path, capsys):
    folder = _with_config(tmp_path, "pi0_arm", action_feature_names=["a", "b"])
    out = _init(tmp_path, "pi0_arm", checkpoint=folder)
    assert load_config(out).robot.joint_names[0] == "joint_1"
    assert "action_feature_names lists 2 names for 6 action dims" in out.read_text()


def test_init_refuses_to_overwrite_and_check_against_another_checkpoint(tmp_path, capsys):
    out = _init(tmp_path, "pi0_arm")
    assert main(["config", "init", "--checkpoint", str(REF / "pi0_arm"), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    # --checkpoint overrides the config's own: pi0_arm's config does not fit pi0_3cam.
    assert _check(out, "--checkpoint", str(REF / "pi0_3cam")) == 1
    err = capsys.readouterr().err
    assert "no topic for ['right_wrist']" in err
    assert "action has 7" in err
