"""The LeRobot pi0 fixture `pi0_arm` (cameras top, left_wrist; 6 joints) as the serving tests drive it: its
observations, its node configuration and a synthetic bag recorded from such an arm."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from omni_ros.config import CameraTopic

ARM = Path(__file__).resolve().parent.parent / "fixtures" / "reference" / "pi0_arm"
JOINTS = [f"joint_{i}" for i in range(1, 7)]
PROMPT = "Pick up the RED cube"


def observation(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    top, wrist = rng.integers(0, 256, (48, 64, 3), np.uint8), rng.integers(0, 256, (40, 30, 3), np.uint8)
    return {"images": {"top": top, "left_wrist": wrist}, "state": rng.normal(size=6), "prompt": PROMPT}


def harness_observation() -> dict:
    """What test/helpers/policy_harness.py publishes, as the node assembles it: black frames, joints at 0.1 * i."""
    frame = np.zeros((48, 48, 3), np.uint8)
    return {"images": {"top": frame, "left_wrist": frame}, "state": 0.1 * np.arange(6), "prompt": PROMPT}


def configure(cfg) -> None:
    """A node config (the harness's) serving the fixture on the harness's topics."""
    cfg.policy.checkpoint, cfg.policy.preset = str(ARM), "tiny"
    cfg.robot.joint_names = list(JOINTS)
    cfg.topics.cameras = [CameraTopic("top", "/camera/top/image_raw"), CameraTopic("left_wrist", "/camera/lw")]


def synthetic_spec():
    """A 1 s recording of the arm: both cameras at 10 Hz, joints moving."""
    from omni_ros.eval.synthetic import SyntheticSpec

    return SyntheticSpec(
        duration_s=1.0,
        joint_names=list(JOINTS),
        cameras={"top": ("/cam/top", 10.0), "left_wrist": ("/cam/left_wrist", 10.0)},
        offset=[0.1, -0.3, 0.5, 0.0, 0.2, -0.1],
        slope=[0.5, 0.2, -0.1, 0.0, 0.1, 0.0],
        amplitude=[0.0, 0.4, 0.3, 0.1, 0.0, 0.2],
        omega=[0.0, 2.0, 3.0, 1.0, 0.0, 4.0],
    )
