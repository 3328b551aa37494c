"""Small deterministic policies for the OpenPI bridge tests.

`EchoPolicy` validates with `make_observation` like every real backend, and its
actions are a fixed function of the state, the camera tiles and the prompt, so
a test can compute what any request must get back. The prompt steers it:
"sleep=0.5 ..." makes that inference take 0.5 s, "raise" makes it fail, and
"gate" blocks it until the test sets `policy.gate` (`policy.entered` tells the
test that a gated inference has started).
"""

from __future__ import annotations

import re
import threading
import time
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from omni_ros.observation import Observation, ObservationSpec, make_observation
from omni_ros.policy.base import BasePolicy, PolicyMetadata

_SLEEP = re.compile(r"sleep=([0-9.]+)")


class EchoPolicy(BasePolicy):
    def __init__(
        self,
        camera_names: Sequence[str] = ("cam",),
        state_dim: int = 8,
        action_dim: int = 8,
        horizon: int = 10,
        delay: float = 0.0,
        seed: int = 0,
        required_cameras: Sequence[str] = (),
    ) -> None:
        self.spec = ObservationSpec(
            camera_names=tuple(camera_names), state_dim=state_dim, required_cameras=tuple(required_cameras)
        )
        self.metadata = PolicyMetadata(
            model="echo-test",
            backend="test",
            camera_names=tuple(camera_names),
            image_size=self.spec.image_size,
            state_dim=state_dim,
            action_dim=action_dim,
            action_horizon=horizon,
        )
        self.delay = delay
        self.seed = seed
        self.lock = threading.Lock()
        self.calls = 0
        self.batch_sizes: list[int] = []
        self.observations: list[Observation] = []
        self.gate = threading.Event()
        self.entered = threading.Event()

    def infer(self, obs: dict[str, Any], *, noise: Any = None) -> dict[str, Any]:
        observation = make_observation(self.spec, obs)
        time.sleep(self._delay(observation))
        with self.lock:
            self.calls += 1
            self.batch_sizes.append(1)
            self.observations.append(observation)
        return {"actions": expected_actions(self, observation)}

    def infer_batch(self, observations: Sequence[dict[str, Any]], *, noise: Any = None) -> list[dict[str, Any]]:
        # Validate all first (like a real batched forward), then "compute" once for the batch.
        batch = [make_observation(self.spec, obs) for obs in observations]
        time.sleep(max(self._delay(o) for o in batch))
        with self.lock:
            self.calls += 1
            self.batch_sizes.append(len(batch))
            self.observations.extend(batch)
        return [{"actions": expected_actions(self, o)} for o in batch]

    def _delay(self, observation: Observation) -> float:
        self.entered.set()
        if observation.prompt == "raise":
            raise RuntimeError("policy exploded on purpose")
        if observation.prompt == "gate":
            if not self.gate.wait(30):
                raise RuntimeError("test never opened the gate")
            return 0.0
        match = _SLEEP.search(observation.prompt)
        return float(match.group(1)) if match else self.delay


def expected_actions(policy: EchoPolicy, observation: Observation) -> np.ndarray:
    """actions[h, d] = state[d % S] * (h + 1) + mean of camera d % C + prompt code + seed."""
    h, d = policy.metadata.action_horizon, policy.metadata.action_dim
    state = observation.state.astype(np.float64)
    means = np.array(
        [observation.images[c].mean() / 255.0 if observation.image_masks[c] else -1.0 for c in policy.spec.camera_names]
    )
    code = zlib.crc32(observation.prompt.encode()) % 1000 / 1000.0
    dims = np.arange(d)
    actions = state[dims % len(state)][None, :] * (np.arange(h)[:, None] + 1) + means[dims % len(means)][None, :]
    return (actions + code + policy.seed).astype(np.float32)


def make_policy(camera_names: Sequence[str] = ("cam",), state_dim: int = 8, action_dim: int = 8, **kwargs: Any):
    """Factory for `omni-ros serve --policy-factory helpers.bridge_policies:make_policy`."""
    return EchoPolicy(camera_names=camera_names or ("cam",), state_dim=state_dim or 8, action_dim=action_dim or 8)
