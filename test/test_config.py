"""Config files load into typed dataclasses; mistakes name the file and key."""

from __future__ import annotations

import subprocess

import pytest

from omni_ros.config import CONFIG_DIR, ConfigError, OmniConfig, PolicyConfig, from_dict, load_config, to_dict


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
