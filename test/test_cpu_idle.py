"""Idle cores kept polling while an inference runs (omni_ros/cpu_idle.py): the request's lifetime, the modes, what
is said where it cannot be had, the kernel's own answer where this process may ask, and the pipeline holding it
around each chunk computed here."""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from pathlib import Path

import pytest
from test_reference_checkpoints import REFERENCE, observation

import omni_ros.policy
from omni_ros import cpu_idle, cpu_threads
from omni_ros.config import ConfigError, load_config
from omni_ros.cpu_idle import IdlePoll, LatencyRequest

KERNEL_DEVICE = Path("/dev/cpu_dma_latency")


def _device(tmp_path: Path) -> Path:
    """A file standing in for the kernel's device: what a request writes to it stays there to be read."""
    path = tmp_path / "cpu_dma_latency"
    path.write_bytes(b"")
    return path


def test_a_request_of_zero_is_open_exactly_while_some_block_holds_it(tmp_path):
    device = _device(tmp_path)
    request = LatencyRequest(device)
    assert request.status().active and str(device) in request.status().reason
    assert not request.holding
    with request.held():
        assert request.holding
        assert struct.unpack("i", device.read_bytes()) == (0,)  # 0 us, a binary s32 as the kernel reads it
        with request.held():  # nested (a batch's chunks one by one): the same request
            assert request.holding
        assert request.holding  # the outer block still runs
    assert not request.holding  # closed: the kernel drops the request with its file


def test_threads_share_the_one_request_until_the_last_leaves(tmp_path):
    request = LatencyRequest(_device(tmp_path))
    inside, leave = threading.Barrier(3), threading.Event()
    seen: list[bool] = []

    def hold() -> None:
        with request.held():
            inside.wait(timeout=10)
            leave.wait(timeout=10)
            seen.append(request.holding)

    workers = [threading.Thread(target=hold) for _ in range(2)]
    for w in workers:
        w.start()
    inside.wait(timeout=10)
    assert request.holding
    leave.set()
    for w in workers:
        w.join(timeout=10)
    assert seen == [True, True]  # each worker still held it when it was about to leave
    assert not request.holding


def test_off_never_opens_the_device(tmp_path):
    device = _device(tmp_path)
    request = LatencyRequest(device, mode="off")
    assert request.status() == IdlePoll(False, "policy.cpu_idle_poll off")
    with request.held():
        assert not request.holding
    assert device.read_bytes() == b""


@pytest.mark.parametrize(("mode", "level"), [("auto", logging.INFO), ("on", logging.WARNING)])
def test_a_missing_device_runs_without_it_and_says_so_once(tmp_path, caplog, mode, level):
    request = LatencyRequest(tmp_path / "absent", mode=mode)
    state = request.status()
    assert not state.active and state.describe() == f"off: {tmp_path / 'absent'} missing"
    with caplog.at_level(logging.INFO, logger="omni_ros.cpu_idle"):
        for _ in range(3):
            request.say(request.status())
            with request.held():
                assert not request.holding
    said = [r for r in caplog.records if "absent missing" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == level


def test_a_device_that_cannot_be_opened_is_given_up_with_the_reason(tmp_path, caplog):
    # A directory passes the write-access check (as root) but cannot be opened for writing (EISDIR); as a
    # non-root user it fails the access check: either way the chunk is computed and no request is held.
    folder = tmp_path / "not_a_device"
    folder.mkdir()
    request = LatencyRequest(folder)
    with caplog.at_level(logging.INFO, logger="omni_ros.cpu_idle"), request.held():
        assert not request.holding
    state = request.status()
    assert not state.active and str(folder) in state.reason
    if os.access(folder, os.W_OK):
        assert "could not be opened" in state.reason
        assert [r.getMessage() for r in caplog.records] == [f"cpu idle polling {state.describe()}"]


def test_modes_are_checked_and_reach_the_thread_settings(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_idle, "REQUEST", LatencyRequest(_device(tmp_path)))
    assert cpu_threads.configure(idle_poll="auto").idle_poll.describe().startswith("on: ")
    assert cpu_threads.configure(idle_poll="off").to_dict()["cpu_idle_poll"] == "off: policy.cpu_idle_poll off"
    with pytest.raises(ValueError, match="cpu_idle_poll must be one of auto, on, off, got 'sometimes'"):
        cpu_threads.configure(idle_poll="sometimes")
    config = tmp_path / "c.yaml"
    config.write_text("policy: {cpu_idle_poll: sometimes}\n")
    with pytest.raises(ConfigError, match=r"policy\.cpu_idle_poll: expected one of 'auto', 'on', 'off'"):
        load_config(config)


@pytest.mark.parametrize(
    ("wait_policy", "idle_poll", "slow"),
    [
        ("passive", IdlePoll(False, "policy.cpu_idle_poll off"), True),
        ("passive", IdlePoll(False, "/dev/cpu_dma_latency missing"), True),
        ("passive", IdlePoll(True, "/dev/cpu_dma_latency held at 0 us"), False),
        ("brief", IdlePoll(False, "policy.cpu_idle_poll off"), False),  # the workers spin through a burst of regions
        ("runtime", IdlePoll(False, "policy.cpu_idle_poll off"), False),
    ],
    ids=str,
)
def test_wakes_are_slow_only_where_workers_sleep_at_once_and_cores_halt(wait_policy, idle_poll, slow):
    assert cpu_threads.ThreadSettings(wait_policy, 2, True, idle_poll).wakes_are_slow is slow


def _kernel_target() -> int:
    # Reading the device gives the kernel's current CPU latency target, every process's requests together.
    with KERNEL_DEVICE.open("rb") as device:
        return struct.unpack("i", device.read(4))[0]


@pytest.mark.skipif(
    not os.access(KERNEL_DEVICE, os.R_OK | os.W_OK), reason="/dev/cpu_dma_latency is absent or not this user's"
)
def test_the_kernel_takes_the_request_and_drops_it_after():
    # Another process holding its own request (a test worker beside this one, inferring) also makes the target 0:
    # tried until one round sees the system free before and after ours.
    request = LatencyRequest(KERNEL_DEVICE)
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        before = _kernel_target()
        if before == 0:
            time.sleep(0.05)
            continue
        with request.held():
            during = _kernel_target()
        after = _kernel_target()
        if after == before:
            assert during == 0
            assert not request.holding
            return
    pytest.skip("other processes held a 0 us request all along: the kernel's target could not show ours")


def test_the_pipeline_holds_it_while_it_computes_a_chunk_here(monkeypatch, tmp_path):
    request = LatencyRequest(_device(tmp_path))
    monkeypatch.setattr(cpu_idle, "REQUEST", request)
    policy = omni_ros.policy.load(REFERENCE / "pi0_3cam")
    seen: list[bool] = []
    sample = policy.runner.sample

    def watched(*args, **kwargs):
        seen.append(request.holding)
        return sample(*args, **kwargs)

    monkeypatch.setattr(policy.runner, "sample", watched)
    obs = observation("pi0_3cam", "all_cameras")
    policy.infer(obs)
    assert seen == [True] and not request.holding
    # A chunk computed elsewhere (a remote server's) leaves this machine's cores be.
    monkeypatch.setattr(policy.runner, "computes_locally", False, raising=False)
    policy.infer(obs)
    assert seen == [True, False] and not request.holding


def test_policy_info_says_whether_idle_cores_poll(monkeypatch, tmp_path, capsys):
    from omni_ros.cli import main

    monkeypatch.setattr(cpu_idle, "REQUEST", LatencyRequest(tmp_path / "absent"))
    assert main(["policy", "info", "--preset", "tiny"]) == 0
    printed = capsys.readouterr().out
    assert f"idle cores:   polling while inferring off: {tmp_path / 'absent'} missing" in printed, printed
    monkeypatch.setattr(cpu_idle, "REQUEST", LatencyRequest(_device(tmp_path)))
    assert main(["policy", "info", "--preset", "tiny", "--json"]) == 0
    assert '"idle_poll": "on: ' in capsys.readouterr().out
