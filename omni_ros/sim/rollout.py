"""Closed-loop episodes in simulated time: a chunk policy -> ActionChunkExecutor -> SimEnv.

Inference is modelled as asynchronous: when the executor asks for a chunk,
the observation of that instant goes to the policy, and the chunk arrives
`latency` seconds later stamped with the observation time, exactly as in the
policy node. No wall-clock time is involved, so runs are deterministic.
With `control.blending: rtc` the policy is called as `policy(obs, rtc=request)`
whenever the executor has a plan to continue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_ros.control.config import ControlConfig
from omni_ros.control.executor import ActionChunkExecutor, Command
from omni_ros.sim.engines import ReachingExpert, SimRobot

# policy(obs) -> (H, D) actions; under `blending: rtc` also policy(obs, rtc=RtcRequest).
ChunkPolicy = Callable[..., np.ndarray]


@dataclass
class EpisodeResult:
    seed: int
    target: str
    prompt: str
    success: bool
    time_to_success: float | None
    final_distance: float
    chunks: int
    commands: int
    # Largest per-joint change between consecutive commands.
    max_step: float
    frames: list[dict[str, np.ndarray]] = field(default_factory=list, repr=False)


def expert_policy(env: SimRobot, expert: ReachingExpert) -> ChunkPolicy:
    """The scripted expert as a chunk policy (it reads the target's position from the simulator)."""

    def policy(obs: dict[str, Any]) -> np.ndarray:
        assert env.scene is not None and env.task is not None  # set by reset()
        return expert.chunk(obs["state"], env.scene.block(env.task.target).xy)

    return policy


def run_episode(
    env: SimRobot,
    policy: ChunkPolicy,
    seed: int,
    control: ControlConfig | None = None,
    control_rate_hz: float = 50.0,
    chunk_dt: float = 0.02,
    latency: float = 0.0,
    target: str | None = None,
    prompt: str | None = None,
    render: bool = True,
    stop_on_success: bool = True,
    record_every: int = 0,
    on_tick: Callable[[float, Command, ActionChunkExecutor], None] | None = None,
) -> EpisodeResult:
    """One episode from `env.reset(seed)`; `record_every` > 0 keeps every n-th tick's camera frames.

    `on_tick(now, command, executor)` sees every control tick (benchmarks measure commands with it).
    """
    env.reset(seed, target=target, prompt=prompt)
    assert env.task is not None  # set by reset()
    executor = ActionChunkExecutor(env.n_joints, control, control_rate_hz, dry_run=False)
    period = 1.0 / control_rate_hz
    pending: tuple[float, float, np.ndarray, int] | None = None  # (arrival, stamp, actions, request id)
    frames: list[dict[str, np.ndarray]] = []
    tick = 0
    while not env.done:
        now = env.time
        executor.observe_position(env.positions)
        if pending is not None and pending[0] <= now + 1e-9:
            executor.add_chunk(pending[2], pending[1], chunk_dt, now, pending[3])
            pending = None
        if executor.should_request(now):
            request = executor.request_started(now)
            obs = env.observe() if render else {"images": {}, "state": env.state, "prompt": env.task.prompt}
            rtc = executor.rtc_request(now)
            actions = policy(obs) if rtc is None else policy(obs, rtc=rtc)
            pending = (now + latency, now, np.asarray(actions), request)
            if latency <= 0:
                executor.add_chunk(pending[2], pending[1], chunk_dt, now, request)
                pending = None
        command = executor.tick(now)
        if on_tick is not None:
            on_tick(now, command, executor)
        if command.publish:
            assert command.positions is not None  # a published command has a position
            env.command(command.positions)
        if record_every > 0 and tick % record_every == 0:
            frames.append(env.render())
        env.step(period)
        tick += 1
        if stop_on_success and env.succeeded_at is not None:
            break
    return EpisodeResult(
        seed=seed,
        target=env.task.target,
        prompt=env.task.prompt,
        success=env.succeeded_at is not None,
        time_to_success=env.succeeded_at,
        final_distance=env.distance_to_target(),
        chunks=executor.stats.chunks_accepted,
        commands=executor.stats.commands_published,
        max_step=executor.stats.max_step,
        frames=frames,
    )
