"""Episodes of the simulated robot driven by the scripted expert, written as a rosbag2.

The bag holds what the sim robot node and the policy node would have put on the wire: camera Images and
JointState at the sim's rates, the prompt (once per episode, at its start), the commanded JointTrajectory
at the control rate (one point: the target now), and the expert's chunks as omni_ros/ActionChunk. The
expert's chunks go through the real `ActionChunkExecutor`, as in `omni_ros.sim.rollout`. Simulated time
is mapped onto a fixed epoch, so the same seed always writes the same bag.

Episodes follow each other with `gap_s` of silence; the episode list (seed, target, prompt, success,
start time) is stored in the bag's metadata as custom data `omni_ros.episodes` (JSON), and the config it ran,
with an `eval:` section that replays this bag (topics and episode markers), as `omni_ros.config`
(omni_ros/eval/recorded.py), so `omni-ros eval BAG` needs no other config.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omni_ros.config import OmniConfig
from omni_ros.control.executor import ActionChunkExecutor
from omni_ros.eval.bagwrite import BagWriter
from omni_ros.eval.recorded import CONFIG_KEY, config_json, recording_eval_config
from omni_ros.sim.collect import CollectOptions, make_expert
from omni_ros.sim.engines import make_env
from omni_ros.sim.rollout import expert_policy

# Bag time of the first episode (2023-11-14T22:13:20Z): realistic stamps, deterministic output.
EPOCH = 1_700_000_000.0
# Sensor messages are logged this long after their stamp (render + transport on a real robot).
TRANSPORT_DELAY_S = 0.001
ACTION_CHUNK_TOPIC = "/omni_ros/action_chunk"


@dataclass
class RecordedEpisode:
    seed: int
    target: str
    prompt: str
    success: bool
    time_to_success: float | None
    start: float
    duration_s: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def record_sim(
    config: OmniConfig,
    out: str | Path,
    episodes: int,
    storage: str = "mcap",
    seed: int | None = None,
    duration_s: float | None = None,
    linger_s: float = 0.5,
    gap_s: float = 1.0,
    horizon: int = 50,
    chunk_dt: float = 0.02,
    progress: Callable[[int, RecordedEpisode], None] | None = None,
) -> list[RecordedEpisode]:
    """Write `episodes` expert episodes to the rosbag2 `out`; each runs until success + `linger_s` or time-out."""
    sim = config.sim
    env = make_env(sim)
    rate = config.robot.control_rate_hz
    period = 1.0 / rate
    names = list(env.joint_names)
    cam_topics = {cam: sim.camera_topic.format(camera=cam) for cam in sim.cameras}
    limit = duration_s if duration_s is not None else sim.episode_time_s
    first_seed = sim.seed if seed is None else int(seed)
    recorded: list[RecordedEpisode] = []
    chunk_id = 0
    with BagWriter(out, storage=storage) as bag:
        base = EPOCH
        for k in range(episodes):
            env.reset(first_seed + k)
            assert env.task is not None  # set by reset()
            expert = make_expert(env, CollectOptions(horizon=horizon, action_dt=chunk_dt))
            policy = expert_policy(env, expert)
            executor = ActionChunkExecutor(len(names), config.control, rate, dry_run=False)
            bag.string(sim.prompt_topic, env.task.prompt, base)
            next_cam = next_state = 0.0
            tick = 0
            while True:
                now = env.time
                t = base + now
                if now + 1e-9 >= next_state:
                    bag.joint_state(
                        sim.joint_state_topic, names, env.positions, t, t + TRANSPORT_DELAY_S, velocities=env.velocities
                    )
                    next_state += 1.0 / sim.joint_state_rate_hz
                if now + 1e-9 >= next_cam:
                    for cam, frame in env.render().items():
                        bag.image(cam_topics[cam], frame, t, t + TRANSPORT_DELAY_S)
                    next_cam += 1.0 / sim.camera_rate_hz
                executor.observe_position(env.positions)
                if executor.should_request(now):
                    request = executor.request_started(now)
                    actions = np.asarray(policy({"state": env.state}), dtype=np.float32)
                    executor.add_chunk(actions, now, chunk_dt, now, request)
                    bag.action_chunk(ACTION_CHUNK_TOPIC, actions, t, chunk_dt, chunk_id, names, backend="expert")
                    chunk_id += 1
                command = executor.tick(now)
                if command.publish:
                    assert command.positions is not None  # a published command has a position
                    env.command(command.positions)
                    bag.trajectory(config.control.command_topic, names, [command.positions], t, point_dt=period)
                env.step(period)
                tick += 1
                ended = env.time >= limit - 1e-9
                if env.succeeded_at is not None and env.time >= env.succeeded_at + linger_s - 1e-9:
                    ended = True
                if ended:
                    break
            episode = RecordedEpisode(
                seed=first_seed + k,
                target=env.task.target,
                prompt=env.task.prompt,
                success=env.succeeded_at is not None,
                time_to_success=env.succeeded_at,
                start=base,
                duration_s=round(env.time, 6),
            )
            recorded.append(episode)
            if progress is not None:
                progress(k, episode)
            base += env.time + gap_s
        bag.set_custom_data("omni_ros.episodes", json.dumps([e.to_dict() for e in recorded]))
        replay = recording_eval_config(config, cam_topics, sim.joint_state_topic, sim.prompt_topic, gap_s)
        bag.set_custom_data(CONFIG_KEY, config_json(config, replay))
    return recorded
