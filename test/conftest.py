"""Test-wide settings: DDS stays on loopback, on a domain of this run's own."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Set before anything imports rclpy, and inherited by every child process.
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
os.environ.setdefault("ROS_DOMAIN_ID", str(100 + os.getpid() % 100))

ROOT = Path(__file__).resolve().parent.parent
HELPERS = Path(__file__).resolve().parent / "helpers"


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture
def python() -> str:
    """The interpreter of this test run (the project venv)."""
    return sys.executable


@pytest.fixture
def ros_context():
    """An initialised rclpy context for tests that create nodes in-process."""
    import rclpy

    context = rclpy.Context()
    rclpy.init(context=context)
    yield context
    context.try_shutdown()


@pytest.fixture
def torch_one_thread():
    """One torch thread for the test, restored after: on 2 shared cores more threads only fight each other
    (and spinning OpenMP workers collapse when another process is busy)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
