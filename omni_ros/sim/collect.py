"""Demonstrations for the reach task: closed-loop episodes labelled by the scripted expert.

Every time the chunk executor asks for a chunk, the observation of that
instant is stored with the chunk the expert answers to it. What is *executed*
is not always that chunk: with probability `noise_prob` it heads for a
perturbed point or a wrong block (noise injection), and with a `driver`
policy (DAgger) the learner's own chunk runs with probability `driver_prob`.
Either way the states drift off the expert's path and the labels show how to
come back, which is what a policy needs when its own small errors add up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_ros.control.config import ControlConfig
from omni_ros.sim.config import SimConfig
from omni_ros.sim.dataset import Sample
from omni_ros.sim.engines import ReachingExpert, SimRobot
from omni_ros.sim.engines import make_env as make_sim_env
from omni_ros.sim.engines import make_expert as make_sim_expert
from omni_ros.sim.rollout import ChunkPolicy, EpisodeResult, run_episode


@dataclass
class CollectOptions:
    """How demonstrations are recorded (defaults match the `demo` model preset)."""

    horizon: int = 16
    # Seconds between the actions of a chunk.
    action_dt: float = 0.05
    # Simulated inference latency, as in evaluation.
    latency: float = 0.1
    # Episode length; the expert reaches in 2-3 s, the rest teaches holding still on the block.
    episode_time_s: float = 5.0
    # A new chunk is asked for when fewer than this fraction of the current one is left (denser samples).
    prefetch_threshold: float = 0.75
    # Probability that an executed chunk is perturbed instead of the expert's.
    noise_prob: float = 0.4
    # Std of the goal offset of a perturbed chunk (metres); half of the perturbed chunks go to a wrong block.
    noise_xy: float = 0.08
    # Probability that the driver policy's chunk runs instead of the expert's (DAgger); needs a driver.
    driver_prob: float = 0.0
    # The pose whose IK branch the expert reaches with (one per joint; empty: the arm's home). This one
    # bends the elbow the same way for every block on the table, so where the arm goes is a smooth
    # function of where the block is; from the folded home pose the choice flips across the table.
    ik_reference: list[float] = field(default_factory=lambda: [1.5708, 2.0, -1.0])


def episode_control(options: CollectOptions) -> ControlConfig:
    return ControlConfig(prefetch_threshold=options.prefetch_threshold)


def collect_episode(
    env: SimRobot,
    expert: ReachingExpert,
    seed: int,
    options: CollectOptions,
    rng: np.random.Generator,
    driver: ChunkPolicy | None = None,
) -> tuple[list[Sample], EpisodeResult]:
    """Run one episode from `seed`; returns its labelled samples and the episode's outcome."""
    samples: list[Sample] = []

    def policy(obs: dict[str, Any]) -> np.ndarray:
        assert env.scene is not None and env.task is not None  # set by reset()
        goal = np.asarray(env.scene.block(env.task.target).xy)
        label = expert.chunk(obs["state"], goal)
        samples.append(
            Sample(
                images={k: v.copy() for k, v in obs["images"].items()},
                state=np.asarray(obs["state"], np.float32).copy(),
                prompt=obs["prompt"],
                actions=label,
                episode=seed,
                target=env.task.target,
                time=env.time,
                goal=expert.goal(goal).astype(np.float32),
            )
        )
        if driver is not None and rng.random() < options.driver_prob:
            return driver(obs)
        if rng.random() < options.noise_prob:
            others = [b for b in env.scene.blocks if b.color != env.task.target]
            if others and rng.random() < 0.5:
                return expert.chunk(obs["state"], others[int(rng.integers(len(others)))].xy)
            return expert.chunk(obs["state"], goal + rng.normal(0.0, options.noise_xy, size=2))
        return label

    result = run_episode(
        env,
        policy,
        seed,
        control=episode_control(options),
        chunk_dt=options.action_dt,
        latency=options.latency,
        stop_on_success=False,
    )
    return samples, result


def make_env(sim: SimConfig, options: CollectOptions) -> tuple[SimRobot, ReachingExpert]:
    env = make_sim_env(dataclasses.replace(sim, episode_time_s=options.episode_time_s))
    return env, make_expert(env, options)


def make_expert(env: SimRobot, options: CollectOptions) -> ReachingExpert:
    """The demonstrating expert: the planar arm reaches with the IK branch of `options.ik_reference` (the arm's
    home if it does not fit the arm). Recorded bags use the same expert, so a policy is scored against what it
    was taught."""
    return make_sim_expert(env, options.horizon, options.action_dt, options.ik_reference)


def collect(
    sim: SimConfig,
    options: CollectOptions,
    seeds: range,
    on_episode: Callable[[list[Sample], EpisodeResult], None],
    driver: ChunkPolicy | None = None,
    noise_seed: int = 0,
) -> None:
    """Collect one episode per seed, handing each episode's samples to `on_episode`."""
    env, expert = make_env(sim, options)
    rng = np.random.default_rng([noise_seed, seeds.start])
    for seed in seeds:
        samples, result = collect_episode(env, expert, seed, options, rng, driver)
        on_episode(samples, result)
