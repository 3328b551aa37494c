"""Config files load into typed dataclasses; mistakes name the file and key."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest

from omni_ros.config import CONFIG_DIR, ConfigError, OmniConfig, PolicyConfig, from_dict, load_config, to_dict
from omni_ros.typed_config import FieldError


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIG_DIR.glob("*.yaml")))
def test_every_shipped_config_loads(name):
    if name.startswith("train_"):
        # Training recipes (`omni-ros train --config`) have their own schema.
        from omni_ros.train.config import TrainConfig

        assert isinstance(load_config(CONFIG_DIR / name, TrainConfig), TrainConfig)
        return
    config = load_config(CONFIG_DIR / name)
    assert isinstance(config, OmniConfig)


def test_valid_file_sets_values_and_keeps_defaults(tmp_path):
    path = tmp_path / "robot.yaml"
    path.write_text("name: arm\npolicy:\n  num_steps: 5\n  seed: null\nrobot:\n  control_rate_hz: 100\n")
    config = load_config(path)
    assert config.name == "arm"
    assert config.policy.num_steps == 5
    assert config.policy.seed is None
    assert config.robot.control_rate_hz == 100.0 and isinstance(config.robot.control_rate_hz, float)
    assert config.policy.backend == PolicyConfig().backend


def test_misspelled_key_names_file_key_and_suggestion(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("policy:\n  num_step: 5\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message
    assert "policy.num_step" in message
    assert "did you mean 'policy.num_steps'" in message


@pytest.mark.parametrize(
    "text,key,expected",
    [
        ("policy:\n  num_steps: ten\n", "policy.num_steps", "expected int"),
        ("policy:\n  num_steps: true\n", "policy.num_steps", "expected int"),
        ("robot:\n  dry_run: 'yes'\n", "robot.dry_run", "expected bool"),
        ("robot:\n  joint_names: joint_1\n", "robot.joint_names", "expected a list"),
        ("robot:\n  joint_names: [1, 2]\n", "robot.joint_names[0]", "expected str"),
        ("policy:\n  backend: tensorflow\n", "policy.backend", "expected one of"),
        ("policy: 3\n", "policy", "expected a mapping"),
    ],
)
def test_wrong_type_names_key(tmp_path, text, key, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert f"{path}: {key}:" in message
    assert expected in message


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"{missing}: config file not found"):
        load_config(missing)


def test_invalid_yaml(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("policy: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_round_trip_through_plain_data():
    config = load_config(CONFIG_DIR / "sim.yaml")
    assert from_dict(OmniConfig, to_dict(config)) == config


def test_cli_reports_config_error_with_exit_code_2(tmp_path, python):
    path = tmp_path / "typo.yaml"
    path.write_text("robot:\n  dryrun: false\n")
    result = subprocess.run(
        [python, "-m", "omni_ros.cli", "config", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "robot.dryrun" in result.stderr and "did you mean 'robot.dry_run'" in result.stderr


def test_cli_help_lists_subcommands(python):
    result = subprocess.run([python, "-m", "omni_ros.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for name in ("up", "config"):
        assert f"    {name} " in result.stdout


# ----- range checks: each config dataclass checks its own values in __post_init__ ---------------------------

# (YAML, dotted key, what the message says): a sample of bad values over every section.
BAD_VALUES = [
    ("policy: {num_steps: 0}", "policy.num_steps", "must be >= 1"),
    ("policy: {num_threads: -1}", "policy.num_threads", "must be >= 0"),
    ("policy: {action_dt: 0}", "policy.action_dt", "must be in (0, 1] seconds"),
    ("policy: {backend: executorch}", "policy.backend", "needs policy.pte"),
    ("policy: {backend: executorch, pte: m.pte, dtype: bfloat16}", "policy.dtype", "use float32"),
    ("robot: {control_rate_hz: 0}", "robot.control_rate_hz", "must be positive"),
    ("status: {rate_hz: -1}", "status.rate_hz", "must be positive"),
    ("control: {prefetch_threshold: 1.5}", "control.prefetch_threshold", "fraction of the chunk, 0..1"),
    ("control: {blend_window_s: -0.1}", "control.blend_window_s", "must be >= 0"),
    ("control: {max_velocity: [1.0, 0.0]}", "control.max_velocity", "must be positive"),
    ("control: {position_upper: [.inf]}", "control.position_upper", "must be finite"),
    ("control: {position_lower: [1.0], position_upper: [0.0, 2.0]}", "control.position_lower", "must not exceed"),
    ("control: {position_lower: [0, 0], position_upper: [1, 1, 1]}", "control.position_lower", "joint count"),
    ("sim: {n_joints: 2}", "sim.link_lengths", "has 3 values for 2 joints"),
    ("sim: {link_lengths: [0.3, 0.0, 0.1]}", "sim.link_lengths", "must be positive"),
    ("sim: {joint_lower: [0, 0]}", "sim.joint_lower", "expected 1 or 3"),
    ("sim: {joint_lower: [1.0], joint_upper: [1.0]}", "sim.joint_lower", "must be below joint_upper"),
    ("sim: {home: [0, 0]}", "sim.home", "expected 1 or 3"),
    ("sim: {joint_names: [a, b]}", "sim.joint_names", "has 2 names for 3 joints"),
    ("sim: {time_constant: 0}", "sim.time_constant", "must be positive"),
    ("sim: {camera_rate_hz: 0}", "sim.camera_rate_hz", "must be positive"),
    ("sim: {cameras: [side]}", "sim.cameras", "unknown cameras ['side']"),
    ("sim: {cameras: []}", "sim.cameras", "is empty"),
    ("sim: {image_height: 8}", "sim.image_height", "at least 16 pixels"),
    ("sim: {block_colors: [red, mauve]}", "sim.block_colors", "unknown block colors ['mauve']"),
    ("sim: {n_blocks: 5}", "sim.n_blocks", "between 1 and 4"),
    ("policy: {remote: {url: 'ws://127.0.0.1:1', ca_file: ca.pem}}", "policy.remote.ca_file", "needs a wss:// url"),
    ("serve: {workers: 0}", "serve.workers", "must be >= 1"),
    ("serve: {tls_cert: cert.pem}", "serve.tls_key", "takes both tls_cert and tls_key"),
    ("serve: {max_message_bytes: 100}", "serve.max_message_bytes", "must be >= 1024"),
    ("serve: {batching: {max_batch: 0}}", "serve.batching.max_batch", "must be >= 1"),
    ("serve: {batching: {max_wait_ms: -1}}", "serve.batching.max_wait_ms", "must be >= 0"),
    ("tts: {rate: 0}", "tts.rate", "must be positive"),
    ("tts: {output_sample_rate: -1}", "tts.output_sample_rate", "must be >= 0"),
    ("tts: {output_channels: 9}", "tts.output_channels", "within 1-8"),
    ("tts: {max_queue: 0}", "tts.max_queue", "at least 1"),
    ("tts: {schedule: {ramp_ms: [40, -1]}}", "tts.schedule.ramp_ms[1]", "must be positive"),
    ("tts: {schedule: {safety_margin: -0.5}}", "tts.schedule.safety_margin", "must be >= 0"),
    ("tts: {schedule: {min_chunk_ms: 500}}", "tts.schedule.min_chunk_ms", "must not exceed steady_chunk_ms"),
    ("eval: {every_k_frames: 0}", "eval.every_k_frames", "must be >= 1"),
    ("eval: {rate_hz: -1}", "eval.rate_hz", "must be >= 0"),
    ("eval: {trigger_camera: side}", "eval.trigger_camera", "'side' is not one of the cameras ['base', 'wrist']"),
    ("topics: {cameras: []}", "eval.cameras", "no cameras configured"),
    ("robot: {command_interface: forward_position}", "topics.forward_command", "name the forward_command_controller"),
    (
        "control: {follow_joint_trajectory: {goal_position_tolerance: [0.1, 0.1]}}",
        "control.follow_joint_trajectory.goal_position_tolerance",
        "give 0, 1 or one per joint (6)",
    ),
    (
        "control: {follow_joint_trajectory: {path_position_tolerance: [-0.5]}}",
        "control.follow_joint_trajectory.path_position_tolerance",
        "must be >= 0 or -1",
    ),
    ("control: {follow_joint_trajectory: {action: ''}}", "control.follow_joint_trajectory.action", "must name"),
]


@pytest.mark.parametrize("text,key,expected", BAD_VALUES, ids=[key for _, key, _ in BAD_VALUES])
def test_config_check_reports_bad_values_with_file_and_key(tmp_path, capsys, text, key, expected):
    from omni_ros.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text(text + "\n")
    assert main(["config", "check", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"omni-ros: error: {path}: {key} " in err
    assert expected in err


def test_every_section_has_a_bad_value_sample():
    sampled = {key.split(".")[0] for _, key, _ in BAD_VALUES}
    checked = {f.name for f in dataclasses.fields(OmniConfig) if f.name not in ("name", "topics")}
    assert checked <= sampled


def test_checks_run_when_built_in_python_too():
    from omni_ros.control.config import ControlConfig

    with pytest.raises(FieldError, match=r"^prefetch_threshold is a fraction of the chunk, 0..1; got 1.5$"):
        ControlConfig(prefetch_threshold=1.5)
    with pytest.raises(ValueError, match=r"needs policy\.pte"):
        PolicyConfig(backend="executorch")
    # A nested value names its place in lists too.
    with pytest.raises(ConfigError, match=r"^<dict>: tts\.schedule\.ramp_ms\[1\] must be positive"):
        from_dict(OmniConfig, {"tts": {"schedule": {"ramp_ms": [40, -1]}}})


def test_a_missing_required_key_is_named(tmp_path):
    path = tmp_path / "cams.yaml"
    path.write_text("topics:\n  cameras:\n    - {name: base}\n")
    with pytest.raises(
        ConfigError, match=rf"^{path}: topics\.cameras\[0\]: missing key\(s\) topics\.cameras\[0\]\.topic$"
    ):
        load_config(path)


def test_training_recipe_ranges_are_checked(tmp_path):
    from omni_ros.train.config import TrainConfig

    path = tmp_path / "recipe.yaml"
    path.write_text("steps: 10\nlog_every: 0\n")
    with pytest.raises(ConfigError, match=rf"^{path}: log_every must be >= 1, got 0$"):
        load_config(path, TrainConfig)
    path.write_text("final_lr_fraction: 2\n")
    with pytest.raises(ConfigError, match=rf"^{path}: final_lr_fraction is a fraction of lr"):
        load_config(path, TrainConfig)


@dataclasses.dataclass
class _Inner:
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("size must be >= 1")  # a plain ValueError, not naming its field


@dataclasses.dataclass
class _Outer:
    inner: _Inner = dataclasses.field(default_factory=_Inner)


def test_a_plain_value_error_of_a_nested_section_is_located():
    with pytest.raises(ConfigError, match=r"^f\.yaml: inner: size must be >= 1$"):
        from_dict(_Outer, {"inner": {"size": 0}}, source="f.yaml")
