"""Round trips through bags written by the project (mcap and sqlite3) with known trajectories."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

from omni_ros.eval.bag import Bag
from omni_ros.eval.evaluate import evaluate
from omni_ros.eval.schema import SCHEMA_VERSION, validate
from omni_ros.eval.synthetic import ConstantPolicy, OraclePolicy, SyntheticSpec, write_synthetic_bag


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_oracle_policy_has_near_zero_error(tmp_path, storage):
    spec = SyntheticSpec(duration_s=2.0)
    bag = write_synthetic_bag(tmp_path / "bag", spec, storage=storage)
    with Bag(bag) as b:
        assert b.storage == storage
    policy = OraclePolicy(spec)
    result = evaluate([str(bag)], spec.config(), policy=policy, progress=False)
    o = result.document["overall"]
    frames = len(spec.frame_times("base"))
    assert o["instants"] == o["evaluated"] == policy.calls == frames
    assert o["aligned_samples"] == frames
    assert o["skipped"]["total"] == 0
    # Action times fall on the recorded 50 Hz grid: only float32 rounding remains.
    assert o["mae"] < 1e-5 and o["mse"] < 1e-10
    assert o["first_action"]["mae"] < 1e-5 and o["end_point"]["mae"] < 1e-5
    assert all(v < 1e-5 for v in o["mae_per_joint"].values())
    # The oracle's plans are one continuous trajectory: no jump between chunks.
    assert o["chunk_boundary"]["count"] == frames - 1 and o["chunk_boundary"]["max"] < 1e-5
    assert o["latency_ms"]["count"] == frames
    # Holding the observed joint positions, scored on the same values, is far worse than the oracle.
    hold = o["baseline_hold"]
    assert hold["scored_values"] == o["scored_values"]
    assert hold["mae"] > 100 * max(o["mae"], 1e-6)
    assert set(hold["mae_per_joint"]) == set(o["mae_per_joint"])


def test_oracle_off_grid_times_interpolate_recorded_commands(tmp_path):
    spec = SyntheticSpec(duration_s=1.5, cameras={"base": ("/cam/base", 30.0), "wrist": ("/cam/wrist", 30.0)})
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    o = evaluate([str(bag)], spec.config(), policy=OraclePolicy(spec), progress=False).document["overall"]
    # Linear interpolation of a 50 Hz sine track: small but not zero.
    assert 0 < o["mae"] < 2e-4


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_constant_policy_has_the_analytic_error(tmp_path, storage):
    # A linear command track, so interpolation is exact and the error has a closed form.
    spec = SyntheticSpec(duration_s=1.0, amplitude=[0.0, 0.0, 0.0])
    bag = write_synthetic_bag(tmp_path / "bag", spec, storage=storage)
    value = np.array([0.25, 0.0, -0.5])
    policy = ConstantPolicy(spec, value, horizon=10, dt=0.02)
    doc = evaluate([str(bag)], spec.config(), policy=policy, progress=False).document
    o = doc["overall"]

    taus = spec.frame_times("base")[:, None] + 0.02 * np.arange(10)[None, :]  # (instants, steps)
    truth = np.asarray(spec.offset) + np.asarray(spec.slope) * taus[..., None]  # (instants, steps, joints)
    err = value - truth
    for j, name in enumerate(spec.joint_names):
        assert o["mse_per_joint"][name] == pytest.approx(np.mean(err[..., j] ** 2), rel=1e-6)
        assert o["mae_per_joint"][name] == pytest.approx(np.mean(np.abs(err[..., j])), rel=1e-6)
    assert o["mse_per_step"] == pytest.approx(list(np.mean(err**2, axis=(0, 2))), rel=1e-6)
    assert o["mae"] == pytest.approx(np.mean(np.abs(err)), rel=1e-6)
    assert o["first_action"]["mse"] == pytest.approx(np.mean(err[:, 0] ** 2), rel=1e-6)
    assert o["end_point"]["mae"] == pytest.approx(np.mean(np.abs(err[:, -1])), rel=1e-6)
    assert o["end_point"]["samples"] == o["aligned_samples"] == len(taus)
    # A constant plan against a moving track: the jump between chunks is the plan's own (none).
    assert o["chunk_boundary"]["max"] == pytest.approx(0.0, abs=1e-9)


def test_report_files_schema_and_embedded_images(tmp_path):
    spec = SyntheticSpec(duration_s=1.0)
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    out = tmp_path / "out"
    result = evaluate([str(bag)], spec.config(), out_dir=out, policy=ConstantPolicy(spec, [0, 0, 0]), progress=False)

    doc = json.loads((out / "metrics.json").read_text())
    assert validate(doc) == []
    assert doc["schema_version"] == SCHEMA_VERSION and doc["mode"] == "offline"
    assert doc == json.loads(json.dumps(result.document))

    html = (out / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    # per-joint, horizon, latency, one trajectory plot, and camera frames (2 cameras)
    assert len(images) >= 6
    for b64 in images:
        assert base64.b64decode(b64)[:8] == b"\x89PNG\r\n\x1a\n"
    # Self-contained: nothing fetched from elsewhere.
    assert not re.search(r'(src|href)="(?!data:)', html)
    assert spec.prompt in html
    assert "MAE" in result.summary and str(out / "metrics.json") in result.summary


def test_schema_validator_reports_problems(tmp_path):
    spec = SyntheticSpec(duration_s=0.5)
    bag = write_synthetic_bag(tmp_path / "bag", spec)
    doc = evaluate([str(bag)], spec.config(), policy=OraclePolicy(spec), progress=False).document
    assert validate(doc) == []
    broken = json.loads(json.dumps(doc))
    del broken["overall"]["mse"]
    broken["episodes"][0]["instants"] = "many"
    broken["schema_version"] = 99
    broken["bags"][0]["extra"] = 1
    errors = validate(broken)
    assert "$.overall: missing key 'mse'" in errors
    assert any(e.startswith("$.episodes[0].instants: expected an integer") for e in errors)
    assert any(e.startswith(f"$.schema_version: expected {SCHEMA_VERSION}") for e in errors)
    assert "$.bags[0]: unexpected key 'extra'" in errors
