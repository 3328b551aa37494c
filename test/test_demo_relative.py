"""Relative (delta) action chunks: the model learns chunk - state and the policy adds the state back."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from omni_ros.observation import ObservationSpec, make_observation
from omni_ros.policy.layouts.omni import load_checkpoint, read_checkpoint_config, save_checkpoint
from omni_ros.policy.loading import from_model, load
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.pi0.configuration import ModelConfig
from omni_ros.policy.pi0.modeling import Pi0Model
from omni_ros.policy.pi0.presets import preset
from omni_ros.policy.pi0.processing import fit_norm_stats
from omni_ros.policy.train import Trainer

pytestmark = pytest.mark.usefixtures("torch_one_thread")

DIM = 3


def configs() -> tuple[ModelConfig, ModelConfig]:
    absolute = preset("tiny", state_dim=DIM, action_dim=DIM)
    return absolute, dataclasses.replace(absolute, relative_actions=True)


def twin_models() -> tuple[Pi0Model, Pi0Model]:
    """The same weights under an absolute and a relative config."""
    absolute, relative = configs()
    torch.manual_seed(0)
    a = Pi0Model(absolute)
    r = Pi0Model(relative)
    r.load_state_dict(a.state_dict())
    return a, r


STATS = NormStats([0.1, -0.2, 0.3], [0.5, 0.7, 0.9], [0.05, -0.1, 0.2], [0.3, 0.4, 0.6])


def raw_obs(state, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    images = {c: rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for c in ("base", "wrist")}
    return {"images": images, "state": np.asarray(state, dtype=np.float32), "prompt": "reach the red block"}


def test_demo_preset_is_relative_and_others_are_not():
    assert preset("demo").relative_actions
    for name in ("tiny", "small", "pi0"):
        assert not preset(name).relative_actions


@pytest.mark.parametrize("state", [[0.0, 0.0, 0.0], [0.4, -1.2, 2.0]])
def test_relative_policy_returns_state_plus_the_models_delta(state):
    a, r = twin_models()
    obs = raw_obs(state)
    absolute = from_model(a, STATS, seed=3).infer(obs)["actions"]
    relative = from_model(r, STATS, seed=3).infer(obs)["actions"]
    assert relative.shape == absolute.shape == (a.cfg.action_horizon, DIM)
    # Same weights and noise: only the state added back differs, per joint and over the whole horizon.
    np.testing.assert_allclose(relative - absolute, np.broadcast_to(np.float32(state), absolute.shape), atol=1e-5)


def test_train_batch_targets_are_normalized_deltas_from_the_seen_state():
    a, r = twin_models()
    _, rel_cfg = configs()
    spec = ObservationSpec(("base", "wrist"), DIM, rel_cfg.vision.image_size)
    states = np.array([[0.2, 0.5, -0.3], [1.0, -1.0, 0.0]], dtype=np.float32)
    observations = [make_observation(spec, raw_obs(s, i)) for i, s in enumerate(states)]
    chunks = np.random.default_rng(1).normal(size=(2, rel_cfg.action_horizon, DIM)).astype(np.float32)
    rel = Trainer(r, STATS).batch(observations, chunks)["actions"].numpy()
    ab = Trainer(a, STATS).batch(observations, chunks)["actions"].numpy()
    np.testing.assert_allclose(rel, STATS.normalize_actions(chunks - states[:, None, :]), atol=1e-6)
    np.testing.assert_allclose(ab, STATS.normalize_actions(chunks), atol=1e-6)
    assert not np.allclose(rel, ab)


def test_norm_stats_are_fitted_on_deltas_when_relative():
    absolute, relative = configs()
    rng = np.random.default_rng(2)
    states = rng.normal(2.0, 1.0, size=(500, DIM)).astype(np.float32)
    chunks = (states[:, None, :] + rng.normal(0.0, 0.1, size=(500, 8, DIM))).astype(np.float32)
    rel = fit_norm_stats(relative, states, chunks)
    ab = fit_norm_stats(absolute, states, chunks)
    # Deltas are small and centred on 0; absolute chunks sit where the states are.
    assert np.all(np.abs(rel.action_mean) < 0.05) and np.all(np.asarray(rel.action_std) < 0.2)
    assert np.all(np.asarray(ab.action_mean) > 1.5) and np.all(np.asarray(ab.action_std) > 0.5)
    np.testing.assert_allclose(rel.state_mean, ab.state_mean)


def test_checkpoint_round_trip_keeps_the_flag_and_old_checkpoints_stay_absolute(tmp_path):
    _, r = twin_models()
    save_checkpoint(tmp_path / "rel", r, STATS)
    assert json.loads((tmp_path / "rel" / "config.json").read_text())["model"]["relative_actions"] is True
    model, stats, _ = load_checkpoint(tmp_path / "rel")
    assert model.cfg.relative_actions and stats == STATS
    state = [0.3, -0.6, 0.9]
    reloaded = load(tmp_path / "rel", seed=5).infer(raw_obs(state))["actions"]
    direct = from_model(r, STATS, seed=5).infer(raw_obs(state))["actions"]
    np.testing.assert_allclose(reloaded, direct, atol=1e-6)

    # A config.json written before the field existed loads as absolute.
    meta = json.loads((tmp_path / "rel" / "config.json").read_text())
    del meta["model"]["relative_actions"]
    (tmp_path / "rel" / "config.json").write_text(json.dumps(meta))
    assert not read_checkpoint_config(tmp_path / "rel")[0].relative_actions
