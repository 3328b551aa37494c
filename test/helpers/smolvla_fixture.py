"""The LeRobot SmolVLA reference fixture (`smolvla_3cam`, made by `make reference-fixtures`) as pytest fixtures,
its cases as observations, and the error measure the quantized exports are held to.

    smolvla_reference, smolvla_checkpoint, smolvla_eager   pytest fixtures (test/conftest.py loads this module)
    cases, assert_matches_eager_and_lerobot, assert_quantized_close   plain helpers: import them
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from safetensors.torch import load_file

from omni_ros.policy import load


@pytest.fixture(scope="module")
def smolvla_reference(root):
    """(reference folder, the fixture's manifest entry)."""
    reference = root / "test" / "fixtures" / "reference"
    manifest = json.loads((reference / "manifest.json").read_text())["fixtures"]["smolvla_3cam"]
    return reference, manifest


@pytest.fixture(scope="module")
def smolvla_checkpoint(smolvla_reference):
    reference, manifest = smolvla_reference
    return reference / manifest["path"]


@pytest.fixture(scope="module")
def smolvla_eager(smolvla_checkpoint):
    """The eager policy of the fixture (the reference every export is compared with)."""
    return load(smolvla_checkpoint)


def cases(reference_fixture) -> Iterator[tuple[dict[str, Any], dict]]:
    """(observation with the case's cameras, the case's tensors: noise, LeRobot's actions, ...) per case."""
    reference, manifest = reference_fixture
    for case in manifest["cases"].values():
        t = load_file(str(reference / case["file"]))
        images = {k.removeprefix("observation.images."): t[f"observation/{k}"].numpy() for k in case["present_cameras"]}
        yield {"images": images, "state": t["observation/observation.state"].numpy(), "prompt": case["prompt"]}, t


def quantized_error(got: np.ndarray, expected: np.ndarray, norm_stats) -> tuple[float, float]:
    """(max abs difference in normalized action units (robot units / the action std), relative L2 of the
    difference against the expected chunk's deviation from the action mean)."""
    std, mean = np.asarray(norm_stats.action_std), np.asarray(norm_stats.action_mean)
    normalized = float((np.abs(got - expected).max(axis=0) / std).max())
    return normalized, float(np.linalg.norm(got - expected) / np.linalg.norm(expected - mean))


def assert_matches_eager_and_lerobot(policy, reference_fixture, eager, atol: float = 1e-4) -> None:
    """Every case's chunk from `policy` (an export of the fixture) within `atol` of eager's and of LeRobot's, for
    the same observation and noise."""
    for obs, t in cases(reference_fixture):
        noise = t["noise"][0].numpy()
        got = policy.infer(obs, noise=noise)["actions"]
        np.testing.assert_allclose(got, eager.infer(obs, noise=noise)["actions"], rtol=0, atol=atol)
        np.testing.assert_allclose(got, t["actions"][0].numpy(), rtol=0, atol=atol)


def assert_quantized_close(policy, reference_fixture, eager, max_normalized: float, relative_l2: float) -> None:
    """Every case's chunk from `policy` (a quantized export) within the two bounds of eager's (`quantized_error`),
    and not bit-identical to it (it is quantized)."""
    for obs, t in cases(reference_fixture):
        noise = t["noise"][0].numpy()
        got, expected = policy.infer(obs, noise=noise)["actions"], eager.infer(obs, noise=noise)["actions"]
        normalized, relative = quantized_error(got, expected, eager.processor.norm_stats)
        assert 0 < normalized <= max_normalized, normalized
        assert relative <= relative_l2, relative
