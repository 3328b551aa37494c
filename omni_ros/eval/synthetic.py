"""Synthetic bags with known trajectories, and reference policies that know them (tests and benchmarks).

The recorded command is a known function of time, `SyntheticSpec.command(tau)` (tau: seconds since the
bag's start). Inputs carry their own time so a reference policy can recover the observation stamp
exactly, whatever the assembler picked: every frame encodes its stamp (µs since start) in its first
pixels, and joint 1 of the joint state is linear in time. `OraclePolicy` then returns the recorded future
(near-zero error); `ConstantPolicy` returns one pose (an analytically known error).

    spec = SyntheticSpec(duration_s=2.0)
    write_synthetic_bag("bag", spec, storage="sqlite3")
    evaluate(["bag"], spec.config(), policy=OraclePolicy(spec))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from omni_ros.config import OmniConfig
from omni_ros.eval.bagwrite import BagWriter
from omni_ros.eval.config import EvalCamera
from omni_ros.observation import ObservationSpec
from omni_ros.policy.base import BasePolicy, PolicyMetadata

T_START = 1_700_000_000.0


@dataclass
class SyntheticSpec:
    duration_s: float = 2.0
    joint_names: list[str] = field(default_factory=lambda: ["j1", "j2", "j3"])
    # name -> (topic, rate Hz); frames at k / rate. The trigger camera is written last at equal times.
    cameras: dict[str, tuple[str, float]] = field(
        default_factory=lambda: {"base": ("/cam/base", 25.0), "wrist": ("/cam/wrist", 25.0)}
    )
    compressed: bool = False
    image_size: int = 32
    state_topic: str = "/joint_states"
    state_rate_hz: float = 50.0
    prompt_topic: str = "/prompt"
    prompt: str = "reach the red block"
    command_topic: str = "/command"
    # trajectory (JointTrajectory), joint_state (JointState) or array (Float64MultiArray)
    command_kind: str = "trajectory"
    command_rate_hz: float = 50.0
    # Commands continue this long after the last frame, so late chunks still have ground truth.
    command_tail_s: float = 0.5
    # command(tau) = offset + slope * tau + amplitude * sin(omega * tau), per joint; joint 1 must stay linear.
    offset: list[float] = field(default_factory=lambda: [0.1, -0.3, 0.5])
    slope: list[float] = field(default_factory=lambda: [0.5, 0.2, -0.1])
    amplitude: list[float] = field(default_factory=lambda: [0.0, 0.4, 0.3])
    omega: list[float] = field(default_factory=lambda: [0.0, 2.0, 3.0])
    # Frame times (tau, per camera name) to leave out, and ones whose stamp goes back by `stamp_back_s`.
    drop_frames: dict[str, list[float]] = field(default_factory=dict)
    out_of_order_frames: dict[str, list[float]] = field(default_factory=dict)
    stamp_back_s: float = 0.1
    # Every message is logged this long after its stamp (a recorder on a clock ahead of the robot's).
    log_delay_s: float = 0.0

    def command(self, tau: np.ndarray | float) -> np.ndarray:
        tau = np.asarray(tau, dtype=np.float64)[..., None]
        a, b, c, w = (np.asarray(x, dtype=np.float64) for x in (self.offset, self.slope, self.amplitude, self.omega))
        return a + b * tau + c * np.sin(w * tau)

    def state(self, tau: float) -> np.ndarray:
        """The measured joints follow the command exactly (joint 1 linear: it tells the time)."""
        return self.command(tau)

    def state_time(self, q: np.ndarray) -> float:
        return float((float(q[0]) - self.offset[0]) / self.slope[0])

    def frame_times(self, camera: str) -> np.ndarray:
        rate = self.cameras[camera][1]
        return np.arange(int(np.floor(self.duration_s * rate + 1e-9)) + 1) / rate

    def config(self, **eval_overrides: Any) -> OmniConfig:
        """An OmniConfig whose eval section reads this bag's topics (cameras in declaration order)."""
        config = OmniConfig()
        config.robot.joint_names = list(self.joint_names)
        ev = config.eval
        ev.cameras = [EvalCamera(name, topic) for name, (topic, _) in self.cameras.items()]
        ev.joint_states = self.state_topic
        ev.prompt_topic = self.prompt_topic
        ev.ground_truth.topic = self.command_topic
        ev.trigger_camera = next(iter(self.cameras))
        for key, value in eval_overrides.items():
            setattr(ev, key, value)
        return config


def encode_time(image: np.ndarray, tau: float) -> None:
    """Microseconds since the start in the first two pixels (48 bits, lossless in png and raw frames)."""
    us = round(tau * 1e6)
    image[0, :2] = np.array([(us >> s) & 255 for s in range(40, -1, -8)], dtype=np.uint8).reshape(2, 3)


def decode_time(image: np.ndarray) -> float:
    us = 0
    for v in image[0, :2, :3].reshape(-1):
        us = (us << 8) | int(v)
    return us / 1e6


def _frame(spec: SyntheticSpec, camera_index: int, tau: float) -> np.ndarray:
    size = spec.image_size
    image = np.full((size, size, 3), 40 + 60 * camera_index, dtype=np.uint8)
    # A moving bar so frames differ (and the policy sees motion).
    x = int((tau * 20) % size)
    image[:, x : x + 2] = 230
    encode_time(image, tau)
    return image


def write_synthetic_bag(path: str | Path, spec: SyntheticSpec, storage: str = "mcap") -> Path:
    """Write the bag described by `spec`; events at equal times go state, cameras (trigger last), command."""
    # Each event is called with the BagWriter (Callable[..., None]: mypy cannot match a lambda whose extra
    # parameters bind loop values by default to Callable[[BagWriter], None]).
    events: list[tuple[float, int, Callable[..., None]]] = []
    t0 = T_START
    delay = spec.log_delay_s

    def at(tau: float, order: int, fn: Callable[..., None]) -> None:
        events.append((round(tau, 9), order, fn))

    at(0.0, 0, lambda w: w.string(spec.prompt_topic, spec.prompt, t0 + delay))
    n_states = int(np.floor((spec.duration_s + spec.command_tail_s) * spec.state_rate_hz + 1e-9)) + 1
    for k in range(n_states):
        tau = k / spec.state_rate_hz
        if tau > spec.duration_s + 1e-9:
            break
        q = spec.state(tau)
        at(
            tau,
            1,
            lambda w, tau=tau, q=q: w.joint_state(spec.state_topic, spec.joint_names, q, t0 + tau, t0 + tau + delay),
        )
    names = list(spec.cameras)
    # Trigger camera (the first) last among cameras at equal times: its frame completes the observation.
    for ci, name in enumerate(names):
        topic, _ = spec.cameras[name]
        order = 3 if ci == 0 else 2
        dropped = {round(x, 6) for x in spec.drop_frames.get(name, [])}
        late = {round(x, 6) for x in spec.out_of_order_frames.get(name, [])}
        for tau in spec.frame_times(name):
            if round(tau, 6) in dropped:
                continue
            image = _frame(spec, ci, tau)
            stamp = tau - spec.stamp_back_s if round(tau, 6) in late else tau
            fn: Callable[..., None]
            if spec.compressed:
                fn = lambda w, topic=topic, image=image, stamp=stamp, tau=tau: w.compressed(  # noqa: E731
                    topic, image, t0 + stamp, t0 + tau + delay, fmt="png"
                )
            else:
                fn = lambda w, topic=topic, image=image, stamp=stamp, tau=tau: w.image(  # noqa: E731
                    topic, image, t0 + stamp, t0 + tau + delay
                )
            at(tau, order, fn)
    n_cmd = int(np.floor((spec.duration_s + spec.command_tail_s) * spec.command_rate_hz + 1e-9)) + 1
    for k in range(n_cmd):
        tau = k / spec.command_rate_hz
        c = spec.command(tau)
        at(tau, 4, lambda w, tau=tau, c=c: _write_command(w, spec, t0 + tau, t0 + tau + delay, c))
    events.sort(key=lambda e: (e[0], e[1]))
    with BagWriter(path, storage=storage) as writer:
        for _, _, fn in events:
            fn(writer)
    return Path(path)


def _write_command(writer: BagWriter, spec: SyntheticSpec, t: float, log: float, c: np.ndarray) -> None:
    if spec.command_kind == "trajectory":
        writer.trajectory(spec.command_topic, spec.joint_names, [c], t, log)
    elif spec.command_kind == "joint_state":
        writer.joint_state(spec.command_topic, spec.joint_names, c, t, log)
    elif spec.command_kind == "array":
        writer.float_array(spec.command_topic, c, log)
    else:
        raise ValueError(f"unknown command_kind {spec.command_kind!r}")


class _ReferencePolicy(BasePolicy):
    def __init__(self, spec: SyntheticSpec, horizon: int = 8, dt: float = 0.02) -> None:
        self.synthetic = spec
        cams = tuple(spec.cameras)
        dims = len(spec.joint_names)
        self.spec = ObservationSpec(camera_names=cams, state_dim=dims, image_size=spec.image_size)
        self.metadata = PolicyMetadata(
            model=type(self).__name__,
            backend="reference",
            camera_names=cams,
            image_size=spec.image_size,
            state_dim=dims,
            action_dim=dims,
            action_horizon=horizon,
            action_dt=dt,
        )
        self.calls = 0

    def observation_time(self, obs: Mapping[str, Any]) -> float:
        """The assembler's stamp for this observation: its oldest input."""
        times = [decode_time(img) for img in obs["images"].values()]
        times.append(self.synthetic.state_time(np.asarray(obs["state"])))
        return min(times)


class OraclePolicy(_ReferencePolicy):
    """Returns the recorded future: command(t0 + offset_s + i * dt) for i < horizon."""

    def __init__(self, spec: SyntheticSpec, horizon: int = 8, dt: float = 0.02, offset_s: float = 0.0) -> None:
        super().__init__(spec, horizon, dt)
        self.offset_s = offset_s
        self.stamps: list[float] = []

    def infer(self, obs: Mapping[str, Any], *, noise: Any = None) -> dict[str, Any]:
        self.calls += 1
        t0 = self.observation_time(obs)
        self.stamps.append(t0)
        meta = self.metadata
        times = t0 + self.offset_s + np.arange(meta.action_horizon) * meta.action_dt
        return {"actions": self.synthetic.command(times).astype(np.float32)}


class ConstantPolicy(_ReferencePolicy):
    """Always the same pose for every step."""

    def __init__(self, spec: SyntheticSpec, value: Sequence[float], horizon: int = 8, dt: float = 0.02) -> None:
        super().__init__(spec, horizon, dt)
        self.value = np.asarray(value, dtype=np.float32)
        self.stamps: list[float] = []

    def infer(self, obs: Mapping[str, Any], *, noise: Any = None) -> dict[str, Any]:
        self.calls += 1
        self.stamps.append(self.observation_time(obs))
        return {"actions": np.tile(self.value, (self.metadata.action_horizon, 1))}
