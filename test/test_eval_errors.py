"""Bad input: missing or corrupt bags, unknown topics, no ground truth, nothing aligned, partial damage."""

from __future__ import annotations

import os
import sqlite3

import pytest
import yaml

from omni_ros.cli import main
from omni_ros.eval.errors import BagError, EvalError, NoSamplesError, TopicError
from omni_ros.eval.evaluate import evaluate
from omni_ros.eval.synthetic import ConstantPolicy, OraclePolicy, SyntheticSpec, write_synthetic_bag


@pytest.fixture
def spec():
    return SyntheticSpec(duration_s=1.0)


def config_file(tmp_path, spec, **eval_overrides):
    """A YAML config for the CLI matching `spec` (tiny policy never loaded: errors come first)."""
    ev = {
        "cameras": [{"name": n, "topic": t} for n, (t, _) in spec.cameras.items()],
        "joint_states": spec.state_topic,
        "prompt_topic": spec.prompt_topic,
        "ground_truth": {"topic": spec.command_topic},
        **eval_overrides,
    }
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump({"robot": {"joint_names": spec.joint_names}, "eval": ev}))
    return path


def test_missing_bag_is_a_clear_error_and_cli_exits_2(tmp_path, spec, capsys):
    missing = tmp_path / "nope"
    with pytest.raises(BagError, match="nope: no such file"):
        evaluate([str(missing)], spec.config(), policy=OraclePolicy(spec), progress=False)
    assert main(["eval", str(missing), "--config", str(config_file(tmp_path, spec)), "-q"]) == 2
    assert f"bag {missing}: no such file" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["garbage_mcap", "garbage_db3", "bad_metadata", "empty_dir"])
def test_corrupt_bags_name_the_bag(tmp_path, spec, kind):
    if kind == "garbage_mcap":
        bag = tmp_path / "x.mcap"
        bag.write_bytes(os.urandom(4096))
    elif kind == "garbage_db3":
        bag = tmp_path / "x.db3"
        bag.write_bytes(os.urandom(4096))
    elif kind == "bad_metadata":
        bag = write_synthetic_bag(tmp_path / "bag", spec, storage="sqlite3")
        (bag / "metadata.yaml").write_text("rosbag2_bagfile_information: [unclosed")
    else:
        bag = tmp_path / "empty"
        bag.mkdir()
    with pytest.raises(BagError) as info:
        evaluate([str(bag)], spec.config(), policy=OraclePolicy(spec), progress=False)
    assert str(bag) in str(info.value)


def test_mcap_with_broken_metadata_is_read_by_scanning_and_says_so(tmp_path, spec):
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    (bag / "metadata.yaml").write_text("rosbag2_bagfile_information: [unclosed")
    doc = evaluate([str(bag)], spec.config(), policy=OraclePolicy(spec), progress=False).document
    assert "index unreadable" in doc["bags"][0]["skipped_messages"]["truncated"]
    assert doc["overall"]["evaluated"] == len(spec.frame_times("base"))


def test_unknown_camera_topic_names_bag_and_topic(tmp_path, spec, capsys):
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    config = spec.config()
    config.eval.cameras[1].topic = "/cam/side"
    with pytest.raises(TopicError, match=r"no topic '/cam/side' \(camera 'wrist'\)") as info:
        evaluate([str(bag)], config, policy=OraclePolicy(spec), progress=False)
    assert str(bag) in str(info.value) and "/cam/base" in str(info.value)  # lists what the bag has
    cams = [{"name": "base", "topic": "/cam/base"}, {"name": "wrist", "topic": "/cam/side"}]
    assert main(["eval", str(bag), "--config", str(config_file(tmp_path, spec, cameras=cams)), "-q"]) == 2
    err = capsys.readouterr().err
    assert "/cam/side" in err and str(bag) in err and "Traceback" not in err


def test_bag_without_the_ground_truth_topic(tmp_path, spec):
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    config = spec.config()
    config.eval.ground_truth.topic = "/arm/commands"
    with pytest.raises(TopicError, match=r"no topic '/arm/commands' \(ground-truth actions\)"):
        evaluate([str(bag)], config, policy=OraclePolicy(spec), progress=False)
    config.eval.ground_truth.topic = spec.prompt_topic  # exists, wrong type
    with pytest.raises(TopicError, match="has type std_msgs/msg/String; expected trajectory_msgs"):
        evaluate([str(bag)], config, policy=OraclePolicy(spec), progress=False)


def test_second_bag_checked_before_any_replay(tmp_path, spec):
    good = write_synthetic_bag(tmp_path / "good", spec)
    other = SyntheticSpec(duration_s=0.5, command_topic="/elsewhere")
    bad = write_synthetic_bag(tmp_path / "bad", other)
    policy = OraclePolicy(spec)
    with pytest.raises(TopicError, match=f"bag {bad}: no topic '/command'"):
        evaluate([str(good), str(bad)], spec.config(), policy=policy, progress=False)
    assert policy.calls == 0


def test_zero_aligned_samples(tmp_path, spec):
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    config = spec.config()
    config.eval.ground_truth.source = "joint_states"
    config.eval.ground_truth.offset_s = 100.0  # the ground truth lies 100 s before every prediction
    with pytest.raises(NoSamplesError, match=f"no aligned samples in {bag}"):
        evaluate([str(bag)], config, policy=OraclePolicy(spec), progress=False)


def test_all_instants_stale_says_why_and_log_times_fix_it(tmp_path):
    # Stamps 5 s behind the log times (a recorder on another clock): every input looks stale.
    spec = SyntheticSpec(duration_s=1.0, log_delay_s=5.0)
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    config = spec.config()
    with pytest.raises(NoSamplesError, match=r"camera 'base' is stale x26.*use_header_stamps: false"):
        evaluate([str(bag)], config, policy=ConstantPolicy(spec, [0, 0, 0]), progress=False)
    config.eval.use_header_stamps = False
    doc = evaluate([str(bag)], config, policy=ConstantPolicy(spec, [0, 0, 0]), progress=False).document
    assert doc["overall"]["evaluated"] == 26 and doc["overall"]["skipped"]["total"] == 0


def test_failing_policy_is_counted_not_fatal_per_instant(tmp_path, spec):
    bag = write_synthetic_bag(tmp_path / "bag", spec)

    class Flaky(ConstantPolicy):
        n = 0

        def infer(self, obs):
            self.n += 1
            if self.n % 2:
                raise RuntimeError("backend hiccup")
            return super().infer(obs)

    doc = evaluate([str(bag)], spec.config(), policy=Flaky(spec, [0, 0, 0]), progress=False).document
    o = doc["overall"]
    assert o["skipped"]["reasons"] == {"inference failed: RuntimeError: backend hiccup": 13}
    assert o["evaluated"] == 13 and o["instants"] == 26


def test_policy_for_other_joints_is_refused(tmp_path, spec):
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    config = spec.config()
    config.robot.joint_names = ["a", "b"]
    with pytest.raises(EvalError, match="lists 2 joints"):
        evaluate([str(bag)], config, policy=OraclePolicy(spec), progress=False)


def test_sqlite3_bag_with_corrupt_messages_evaluates_the_rest(tmp_path, spec):
    bag = write_synthetic_bag(tmp_path / "bag", spec, storage="sqlite3")
    db = next(bag.glob("*.db3"))
    with sqlite3.connect(db) as conn:
        topic_id = conn.execute("SELECT id FROM topics WHERE name = '/cam/wrist'").fetchone()[0]
        ids = [r[0] for r in conn.execute("SELECT id FROM messages WHERE topic_id = ? ORDER BY id", (topic_id,))]
        conn.executemany("UPDATE messages SET data = ? WHERE id = ?", [(b"\x00\x01\x00\x00\xff", i) for i in ids[5:8]])
    doc = evaluate([str(bag)], spec.config(), policy=OraclePolicy(spec), progress=False).document
    skipped = doc["bags"][0]["skipped_messages"]["undecodable"]
    assert sum(skipped.values()) == 3 and all(k.startswith("/cam/wrist: ") for k in skipped)
    assert doc["bags"][0]["messages_decoded"] == doc["bags"][0]["messages_read"]
    o = doc["overall"]
    assert o["evaluated"] == len(spec.frame_times("base")) and o["mae"] < 1e-5


def test_truncated_mcap_evaluates_what_was_written(tmp_path, spec, capsys):
    long = SyntheticSpec(duration_s=3.0)
    bag = write_synthetic_bag(tmp_path / "bag", long)
    mcap = next(bag.glob("*.mcap"))
    size = mcap.stat().st_size
    with open(mcap, "r+b") as f:  # a recorder killed mid-write: no index, no footer, a cut record
        f.truncate(int(size * 0.5))
    doc = evaluate([str(bag)], long.config(), policy=OraclePolicy(long), progress=False).document
    b = doc["bags"][0]
    assert "recovered by scanning" in b["skipped_messages"]["truncated"]
    assert "cut-off record" in b["skipped_messages"]["truncated"]
    o = doc["overall"]
    frames = len(long.frame_times("base"))
    assert frames // 4 < o["evaluated"] < frames and o["mae"] < 1e-5
    # ... and the summary says so.
    out = tmp_path / "out"
    assert main(["eval", str(bag), "--config", str(config_file(tmp_path, long)), "--out", str(out), "-q"]) == 0
    assert "reading stopped early" in capsys.readouterr().out


def test_record_sim_refuses_an_existing_output(tmp_path, capsys):
    out = tmp_path / "exists"
    out.mkdir()
    assert main(["bag", "record-sim", "--episodes", "1", "--out", str(out), "-q"]) == 2
    assert f"bag {out}: already exists" in capsys.readouterr().err


def test_bag_info_lists_topics(tmp_path, spec, capsys):
    bag = write_synthetic_bag(tmp_path / "bag", spec, storage="sqlite3")
    assert main(["bag", "info", str(bag)]) == 0
    out = capsys.readouterr().out
    assert "/cam/base" in out and "sensor_msgs/msg/Image" in out and "sqlite3" in out
