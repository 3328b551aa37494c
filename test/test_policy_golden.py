"""Golden actions: the shipped demo checkpoint, a fixed observation and fixed noise give stored actions.

Like a backward-compatibility test: any change to preprocessing, the model or the sampler that moves the
shipped policy's output fails here. The stored actions were produced before the inference path was
reshaped into one pipeline (and must stay what they are). To regenerate after an intended change:
`OMNI_ROS_UPDATE_GOLDEN=1 .venv/bin/python -m pytest test/test_policy_golden.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import omni_ros.policy
from omni_ros.observation import ObservationError

GOLDEN = Path(__file__).parent / "fixtures" / "golden" / "demo_actions.npz"
pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def golden() -> dict:
    with np.load(GOLDEN) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def demo(root):
    return omni_ros.policy.load(root / "checkpoints" / "demo")


def _obs(golden: dict) -> dict:
    return {
        "images": {"base": golden["base"], "wrist": golden["wrist"]},
        "state": golden["state"],
        "prompt": str(golden["prompt"]),
    }


def test_demo_checkpoint_gives_the_golden_actions(demo, golden):
    actions = demo.infer(_obs(golden), noise=golden["noise"])["actions"]
    if os.environ.get("OMNI_ROS_UPDATE_GOLDEN"):
        np.savez(GOLDEN, **{**golden, "actions": actions})
    assert actions.shape == golden["actions"].shape == (16, 3)
    np.testing.assert_allclose(actions, golden["actions"], rtol=0, atol=1e-5)


def test_seeded_noise_is_the_golden_noise(demo, golden):
    # Seed 0 draws exactly the stored noise, so the default call lands on the same actions.
    np.testing.assert_allclose(demo.infer(_obs(golden))["actions"], golden["actions"], rtol=0, atol=1e-5)
    assert demo.metadata.noise_shape == golden["noise"].shape


def test_the_noise_matters_and_bad_noise_is_refused(demo, golden):
    other = demo.infer(_obs(golden), noise=golden["noise"] + 1.0)["actions"]
    assert np.abs(other - golden["actions"]).max() > 1e-3
    with pytest.raises(ObservationError, match=r"noise has shape \(16, 4\), expected \(16, 3\)"):
        demo.infer(_obs(golden), noise=np.zeros((16, 4), np.float32))
    bad = golden["noise"].copy()
    bad[3, 1] = np.nan
    with pytest.raises(ObservationError, match="non-finite"):
        demo.infer(_obs(golden), noise=bad)
