"""torch's OpenMP settings are in place before torch loads, for every entry point, and the config can change them.

The effect on latency under CPU contention is measured in bench/contention.py; here, the mechanism."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from omni_ros import cpu_threads
from omni_ros.config import ConfigError, load_config


def _python(code: str, env_update: dict[str, str | None], cwd=None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    env.update({k: v for k, v in env_update.items() if v is not None})
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_importing_omni_ros_makes_idle_workers_sleep_unless_the_environment_says_otherwise():
    code = (
        "import os, omni_ros\n"
        "from omni_ros import cpu_threads\n"
        "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'), cpu_threads.current().wait_policy)"
    )
    assert _python(code, {}) == "PASSIVE None passive"
    assert _python(code, {"OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE None active"
    # libgomp: a spin count wins over the wait policy's own, so the user's count is their choice and stays.
    assert _python(code, {"GOMP_SPINCOUNT": "2000"}) == "None 2000 brief"
    assert _python(code, {"GOMP_SPINCOUNT": "0"}) == "None 0 passive"


def test_a_child_process_environment_for_each_wait_policy():
    """What a benchmark hands a worker to run it under a wait policy: libgomp's variables replaced, the rest kept."""
    base = {"PATH": "/bin", "OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "5"}
    assert cpu_threads.wait_policy_env("passive", base) == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    brief = cpu_threads.wait_policy_env("brief", base)
    assert brief["OMP_WAIT_POLICY"] == "PASSIVE" and int(brief["GOMP_SPINCOUNT"]) > 0
    assert cpu_threads.wait_policy_env("active", base) == {"PATH": "/bin", "OMP_WAIT_POLICY": "ACTIVE"}
    assert cpu_threads.wait_policy_env("runtime", base) == {"PATH": "/bin"}  # libgomp's own default
    code = "import os, omni_ros\nfrom omni_ros import cpu_threads\nprint(cpu_threads.current().wait_policy)"
    for policy in ("passive", "brief", "active"):
        env = cpu_threads.wait_policy_env(policy, {})
        assert _python(code, {"OMP_WAIT_POLICY": None, **env}) == policy  # and the child reads it back as such


def test_entry_points_read_their_config_before_anything_imports_torch():
    # What the CLI, the node mains, the launcher and the evaluator import before they read the config.
    code = (
        "import sys\n"
        "from omni_ros.cli import build_parser\n"
        "build_parser()\n"
        "import omni_ros.nodes.policy_node, omni_ros.nodes.bridge_node, omni_ros.launcher\n"
        "import omni_ros.eval.replay, omni_ros.eval.recorded, omni_ros.serving.server\n"
        "print('torch' in sys.modules)"
    )
    assert _python(code, {}) == "False"


def test_the_config_sets_wait_policy_and_threads_before_torch_starts(tmp_path):
    config = tmp_path / "c.yaml"
    code = (
        "import argparse, json, os\n"
        "from omni_ros.commands.common import config_from_args\n"
        f"config_from_args(argparse.Namespace(config={str(config)!r}, sim=False))\n"
        "import torch\n"
        "names = ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')\n"
        "print(json.dumps([os.environ.get(k) for k in names] + [torch.get_num_threads()]))"
    )

    def run(policy: str, env: dict[str, str | None] | None = None) -> list:
        config.write_text(f"policy: {policy}\n")
        return json.loads(_python(code, env or {}))

    assert run("{omp_wait_policy: active, num_threads: 1}") == ["ACTIVE", None, 1]
    assert run("{omp_wait_policy: runtime}")[:2] == [None, None]  # the OpenMP runtime's own default
    # passive sleeps at once: a spin count set by the default (or the environment) does not stay behind.
    assert run("{omp_wait_policy: passive, num_threads: 1}", {"GOMP_SPINCOUNT": "5"}) == ["PASSIVE", None, 1]
    assert run("{omp_wait_policy: brief, num_threads: 1}", {"OMP_WAIT_POLICY": "ACTIVE"}) == ["PASSIVE", "10000", 1]
    # Without a config value, the user's environment stays.
    assert run("{num_threads: 1}", {"OMP_WAIT_POLICY": "ACTIVE"}) == ["ACTIVE", None, 1]


def test_too_late_is_said_once_and_threads_still_change(caplog):
    torch = pytest.importorskip("torch")  # loaded: the wait policy in effect can no longer change
    threads = torch.get_num_threads()
    in_effect = cpu_threads.current().wait_policy
    other = "active" if in_effect != "active" else "passive"
    try:
        with caplog.at_level(logging.WARNING, logger="omni_ros.cpu_threads"):
            for _ in range(3):
                settings = cpu_threads.configure(wait_policy=other, num_threads=1)
        assert settings.wait_policy == in_effect and settings.num_threads == 1 and torch.get_num_threads() == 1
        late = [r for r in caplog.records if "after torch was imported" in r.getMessage()]
        assert len(late) == 1 and f"stays {in_effect}" in late[0].getMessage()
    finally:
        torch.set_num_threads(threads)


def test_bad_values_are_config_errors(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("policy: {omp_wait_policy: sleepy}\n")
    with pytest.raises(
        ConfigError, match=r"policy\.omp_wait_policy: expected one of 'passive', 'brief', 'active', 'runtime'"
    ):
        load_config(path)
    with pytest.raises(ValueError, match="must be one of"):
        cpu_threads.configure(wait_policy="sleepy")


def test_step_threads_are_timed_both_ways_then_the_faster_stays():
    from omni_ros.cpu_threads import StepThreads

    for fast in (1, 2):
        chooser = StepThreads((1, 2), samples=3, warmup=2)
        order = []
        for _ in range(2 + 2 * 3):
            n = chooser.next()
            order.append(n)
            chooser.record(n, 0.010 if n == fast else 0.013)
        assert order[:2] == [2, 2]  # warm-up steps: as set (the last candidate), not timed
        assert sorted(order[2:]) == [1, 1, 1, 2, 2, 2] and chooser.chosen == fast
        assert [chooser.next() for _ in range(3)] == [fast] * 3
    assert StepThreads((2,)).chosen == 2  # one candidate: nothing to time


def test_denoising_steps_take_the_threads_their_timing_chose(torch_one_thread):
    """On a CPU with more than one torch thread, the runner times the denoising steps on one torch thread and on
    all of them and keeps the faster (omni_ros.cpu_threads.StepThreads), whatever the precision; torch's threads
    are back as set after each chunk. On one thread there is nothing to choose."""
    import numpy as np
    import torch

    from omni_ros.backends.factory import load_policy
    from omni_ros.config import PolicyConfig
    from omni_ros.cpu_threads import StepThreads

    torch.set_num_threads(1)
    assert load_policy(PolicyConfig(preset="tiny", precision="fp32")).runner.step_threads is None
    torch.set_num_threads(2)
    policy = load_policy(PolicyConfig(preset="tiny", precision="fp32"))
    runner, seen = policy.runner, []
    assert runner.step_threads is not None and runner.step_threads.candidates == (1, 2)
    runner.step_threads = None  # the threads as set, for the baseline below
    model = runner.model
    real = model.denoise_step

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    model.denoise_step = spy
    meta = policy.metadata
    images = {name: np.zeros((48, 64, 3), np.uint8) for name in meta.camera_names}
    obs = {"images": images, "state": np.zeros(meta.state_dim, np.float32), "prompt": "reach"}
    policy.infer(obs)
    steps = len(seen)
    assert steps >= 3 and seen == [2] * steps  # as set
    runner.step_threads = chooser = StepThreads((1, 2), samples=2, warmup=0)
    seen.clear()
    policy.infer(obs)
    policy.infer(obs)
    assert sorted(seen[:4]) == [1, 1, 2, 2] and chooser.chosen in (1, 2)  # two timings each, then the faster
    assert seen[4:] == [chooser.chosen] * (2 * steps - 4)
    assert torch.get_num_threads() == 2


def test_guided_rtc_steps_are_timed_whole_on_their_own_threads(torch_one_thread):
    """A guided RTC step (forward and its backward pass) is timed apart from plain steps, as a whole, on one torch
    thread and on all of them, and the faster runs later guided steps; the chunk is the one computed on the threads
    as set (float sums in another order: within 1e-5)."""
    import numpy as np
    import torch

    from omni_ros.backends.factory import load_policy
    from omni_ros.config import PolicyConfig
    from omni_ros.cpu_threads import StepThreads
    from omni_ros.policy.rtc import RtcRequest

    torch.set_num_threads(2)
    policy = load_policy(PolicyConfig(preset="tiny", precision="fp32"))
    runner = policy.runner
    assert runner.guided_step_threads is not None and runner.guided_step_threads.candidates == (1, 2)
    meta = policy.metadata
    images = {name: np.zeros((48, 64, 3), np.uint8) for name in meta.camera_names}
    obs = {"images": images, "state": np.zeros(meta.state_dim, np.float32), "prompt": "reach"}
    noise = np.random.default_rng(0).normal(size=(meta.action_horizon, meta.action_dim)).astype(np.float32)
    plan = policy.infer(obs, noise=noise)["actions"][3:] + 0.2
    request = RtcRequest(plan, inference_delay=3)

    seen: list[int] = []
    real = runner.model.denoise_step

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    runner.model.denoise_step = spy
    runner.guided_step_threads = None  # the threads as set: the baseline
    baseline = policy.infer(obs, noise=noise, rtc=request)["actions"]
    steps = len(seen)
    assert steps >= 3 and seen == [2] * steps
    runner.guided_step_threads = chooser = StepThreads((1, 2), samples=2, warmup=0)
    seen.clear()
    first = policy.infer(obs, noise=noise, rtc=request)["actions"]
    second = policy.infer(obs, noise=noise, rtc=request)["actions"]
    assert sorted(seen[:4]) == [1, 1, 2, 2] and chooser.chosen in (1, 2)
    assert seen[4:] == [chooser.chosen] * (2 * steps - 4)
    assert runner.step_threads is not None and not any(runner.step_threads.timings.values())  # plain: untouched
    np.testing.assert_allclose(first, baseline, atol=1e-5)
    np.testing.assert_allclose(second, baseline, atol=1e-5)
    assert torch.get_num_threads() == 2
