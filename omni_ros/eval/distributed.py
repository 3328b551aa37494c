"""`omni-ros eval --ray`: every bag replayed as a Ray task, one report identical to the serial run's.

Each task loads the configured policy once per worker process and replays one bag exactly as the serial
`Replayer` would (a bag's replay never depends on another bag: each starts with a fresh assembler). The
driver checks every bag's topics before fanning out (a bad topic map fails fast, naming bag and topic),
then merges the per-bag results in the order the bags were given: episodes are numbered across bags as
the serial run numbers them, stage times are summed, and `timing.total_s` is the wall time of the whole
fan-out. Everything in metrics.json but the creation time and the measured times (`timing`,
`latency_ms`) is then the serial run's; bitwise equal predictions need the same torch thread count in
both runs (`policy.num_threads`), since a reduction's order depends on it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omni_ros.config import OmniConfig
from omni_ros.eval.bag import Bag
from omni_ros.eval.errors import EvalError, NoSamplesError
from omni_ros.eval.evaluate import Evaluation, _finish, _prepare_out, load_eval_policy, no_samples_message
from omni_ros.eval.replay import Replayer, ReplayResult, Timing, TopicMap
from omni_ros.eval.results import build_document
from omni_ros.policy.base import Policy, PolicyMetadata
from omni_ros.progress import Progress

# One policy per worker process and config (a worker runs many tasks).
_POLICIES: dict[str, Policy] = {}


def replay_one(config: OmniConfig, path: str) -> tuple[ReplayResult, PolicyMetadata]:
    """Runs in a Ray worker: one bag through the configured policy."""
    key = repr((config.policy, config.robot.joint_names, config.eval.cameras, config.topics.cameras))
    policy = _POLICIES.get(key)
    if policy is None:
        policy = _POLICIES[key] = load_eval_policy(config)
    return Replayer(config, policy).run([path]), policy.metadata


def merge(results: Sequence[ReplayResult], wall_s: float) -> ReplayResult:
    """Per-bag results, in bag order, as the one result a serial replay of all of them gives."""
    episodes, bags = [], []
    timing = Timing()
    for result in results:
        offset = len(episodes)
        for episode in result.episodes:
            episode.index += offset
            episodes.append(episode)
        bags.extend(result.bags)
        timing.read_s += result.timing.read_s
        timing.assemble_s += result.timing.assemble_s
        timing.infer_s += result.timing.infer_s
    timing.total_s = wall_s
    first = results[0]
    return ReplayResult(episodes, bags, timing, first.joint_names, first.action_dt)


def evaluate_ray(
    bags: Sequence[str],
    config: OmniConfig,
    out_dir: str | Path | None = None,
    progress: bool = True,
    address: str | None = None,
    num_cpus_per_task: float = 1.0,
) -> Evaluation:
    """`evaluate` with one Ray task per bag, on the connected cluster, `address`, or a local one it starts."""
    from omni_ros.cluster import LocalCluster, RemoteCluster, check_ray

    check_ray("omni-ros eval --ray")
    if not bags:
        raise EvalError("no bags given")
    if out_dir is not None:
        out_dir = _prepare_out(out_dir)
    topics = TopicMap.from_config(config)
    for path in bags:
        with Bag(path) as bag:
            topics.check(bag)

    ray_module = sys.modules.get("ray")
    cluster: Any = None
    if ray_module is None or not ray_module.is_initialized():
        cluster = RemoteCluster(address) if address else LocalCluster()
        cluster.start()
    try:
        import ray

        start = time.perf_counter()
        task = ray.remote(num_cpus=num_cpus_per_task, max_retries=1)(replay_one)
        pending = {task.remote(config, str(path)): i for i, path in enumerate(bags)}
        outcomes: list[Any] = [None] * len(bags)
        bar = Progress(len(bags), label="bags") if progress else None
        waiting = list(pending)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            try:
                outcomes[pending[done[0]]] = ray.get(done[0])
            except ray.exceptions.RayTaskError as exc:
                # The replay's own error (a bad bag, a policy that cannot load), not Ray's wrapper.
                raise (exc.cause if isinstance(exc.cause, Exception) else exc) from None
            if bar is not None:
                bar.update(1)
        wall_s = time.perf_counter() - start
    finally:
        if cluster is not None:
            cluster.stop()
    result = merge([r for r, _ in outcomes], wall_s)
    metadata = outcomes[0][1]
    if sum(e.scores.samples for e in result.episodes if e.scores is not None) == 0:
        raise NoSamplesError(no_samples_message(result, bags))
    doc = build_document(result, config, metadata, mode="offline")
    return _finish(doc, result, config, out_dir)
