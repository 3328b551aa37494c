"""An exported program in a child process (`policy.program_process`, omni_ros/backends/program_process.py): the same
actions as in the caller's process, its errors raised in the caller, a killed child restarted by the next request,
and the policy node running its program there by default."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from helpers.pte_cache import exported_tiny
from helpers.tiny_models import raw_obs
from omni_ros.backends.executorch_runner import load_pte
from omni_ros.backends.factory import child_process, load_policy
from omni_ros.backends.program_process import ProgramProcess, ProgramProcessError
from omni_ros.policy.config import PolicyConfig, RemoteConfig
from omni_ros.policy.rtc import RtcRequest
from omni_ros.typed_config import ConfigError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def pte(tmp_path_factory) -> Path:
    return exported_tiny(tmp_path_factory.getbasetemp(), "fp32")


@pytest.fixture(scope="module")
def inline(pte):
    policy = load_pte(pte, num_threads=1, mode="staged")
    yield policy
    policy.close()


@pytest.fixture
def child(pte):
    policy = load_pte(pte, num_threads=1, mode="staged", process=True)
    yield policy
    policy.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_the_child_computes_what_the_caller_would(inline, child):
    assert isinstance(child.runner, ProgramProcess) and child.runner.pid != os.getpid()
    assert child.metadata == inline.metadata  # backend, precision, shapes: the child's runner says them
    assert child.runner.rtc_methods == inline.runner.rtc_methods == ("inpaint",)
    for seed in range(3):
        obs = raw_obs(seed)
        np.testing.assert_array_equal(child.infer(obs)["actions"], inline.infer(obs)["actions"])
    # Real-time chunking crosses the pipe too: the request's old plan and delay reach the child's Euler loop.
    request = RtcRequest(np.random.default_rng(0).normal(size=(6, 3)), inference_delay=2, method="inpaint")
    got = child.infer(raw_obs(4), rtc=request)["actions"]
    np.testing.assert_array_equal(got, inline.infer(raw_obs(4), rtc=request)["actions"])
    assert not np.array_equal(got, child.infer(raw_obs(4))["actions"])


def test_an_error_in_the_child_is_raised_here_and_the_child_serves_on(child):
    pid = child.runner.pid
    inputs = child.processor.inputs([child.processor.parse(raw_obs(0))], child.runner.device, child.runner.dtype)
    # The runner in the child refuses a call without noise: its ValueError, raised here.
    with pytest.raises(ValueError, match="needs the sampling noise and the step count"):
        child.runner.sample(inputs, None, None)
    assert child.runner.pid == pid and np.isfinite(child.infer(raw_obs(0))["actions"]).all()


def test_a_killed_child_fails_its_request_and_the_next_one_starts_another(child, inline, monkeypatch):
    first = child.runner.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    with pytest.raises(ProgramProcessError, match=r"died during sample \(signal 9\); the next request starts it again"):
        child.infer(raw_obs(1))
    out = child.infer(raw_obs(1))["actions"]
    assert child.runner.pid not in (None, first)
    np.testing.assert_array_equal(out, inline.infer(raw_obs(1))["actions"])


def test_a_child_that_cannot_start_is_an_error_at_load(pte, monkeypatch):
    import shutil
    import sys

    monkeypatch.setattr(sys, "executable", shutil.which("false"))  # a child that exits at once
    with pytest.raises(ProgramProcessError, match=r"exited \(exit code 1\) before loading it"):
        load_pte(pte, num_threads=1, process=True)


def test_program_process_follows_the_config_and_the_caller(pte):
    assert child_process("auto", control_loop=True) and not child_process("auto", control_loop=False)
    assert child_process("child", control_loop=False) and not child_process("inline", control_loop=True)
    config = PolicyConfig(backend="executorch", pte=str(pte), num_threads=1)
    node = load_policy(config, control_loop=True)  # what the policy node passes
    served = load_policy(config)  # serve, eval, the Python API
    try:
        assert isinstance(node.runner, ProgramProcess)
        assert not isinstance(served.runner, ProgramProcess)
        pid = node.runner.pid
        assert pid is not None and _alive(pid)
    finally:
        node.close()
        served.close()
    node.close()  # twice is fine
    assert not _alive(pid)  # the child and its program are gone
    with pytest.raises(ConfigError, match="program_process"):
        PolicyConfig(backend="remote", remote=RemoteConfig(url="ws://127.0.0.1:1"), program_process="child")
