"""Test-wide settings: DDS stays on loopback, on a domain of this run's own; how `make test` shares the suite
between its two pytest-xdist workers."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

# Shared fixtures of the reference checkpoints (their modules name what they provide).
pytest_plugins = ["helpers.smolvla_fixture"]

# Set before anything imports rclpy, and inherited by every child process.
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
# `policy.precision: auto` picks from the CPU's instructions, and CI machines differ (AVX2-only, VNNI, AMX): the
# suite believes an AVX2-only CPU (auto -> fp32) wherever a test does not choose a precision or pretend a CPU
# itself, so its tolerances hold on every machine. omni_ros/cpu_features.py FLAGS_ENV.
os.environ.setdefault("OMNI_ROS_CPU_FLAGS", "avx2")
# `make test-avx2`: the suite as an AVX2-only CPU computes it (no AVX-512, no int8 dot product) on any x86 machine.
# The make target holds oneDNN and ATen to AVX2 (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY); here the hardware the
# precision layers ask before trusting an instruction (cpu_features.hardware) reads as AVX2-only too. In this
# process only: a test's child process runs on the real CPU's flags (with the kernels still held to AVX2).
if os.environ.get("OMNI_ROS_TEST_HARDWARE") == "avx2":
    from omni_ros import cpu_features

    _AVX2 = cpu_features.CpuFeatures("x86_64", "AVX2-only (OMNI_ROS_TEST_HARDWARE)", frozenset({"avx2", "fma"}))
    cpu_features.hardware = lambda: _AVX2  # type: ignore[assignment]
# One domain per run and per xdist worker (gw0, gw1, ...): two workers never see each other's topics. The
# controlling process picks the run's base (or keeps a ROS_DOMAIN_ID its caller set); its workers inherit that
# environment and add their index. (A setdefault in the workers kept the inherited base: every worker on one
# domain, and two DDS tests running at once read each other's commands.)
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
if "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ.setdefault("ROS_DOMAIN_ID", str(100 + (os.getpid() % 30) * 4))
    os.environ["OMNI_ROS_TEST_DOMAIN_BASE"] = os.environ["ROS_DOMAIN_ID"]
else:
    _BASE = int(os.environ.get("OMNI_ROS_TEST_DOMAIN_BASE") or os.environ.get("ROS_DOMAIN_ID") or 100)
    os.environ["ROS_DOMAIN_ID"] = str((_BASE + _WORKER % 4) % 233)  # 232 is the highest valid domain

# Modules that share one session-cached export (test/helpers/pte_cache.py) run on one worker, so each variant is
# exported once per run; the Ray modules run one after the other (the CLI test counts the processes of every
# local cluster). The rest are spread module by module (module fixtures stay shared). These groups go first.
SAME_WORKER = {
    "test_export_xnnpack.py": "pte",
    "test_export_serving.py": "pte",
    "test_export_rtc.py": "pte",
    "test_program_process.py": "pte",
    "test_export_onnx.py": "onnx",
    "test_onnx_qnn.py": "onnx",
    "test_onnx_smolvla.py": "onnx",
    "test_ray_serve.py": "ray",
    "test_ray_cli.py": "ray",
    "test_stage_program.py": "stage_program",  # alone, but its one export (about a minute) is best started first
}

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The long export groups first: a worker that starts them last would finish alone.
    items.sort(key=lambda item: Path(str(item.path)).name not in SAME_WORKER)
    for item in items:
        if Path(str(item.path)).name in SAME_WORKER:
            # Whichever test first asks for a shared export pays for it in its setup (minutes on 2 busy cores).
            item.add_marker(pytest.mark.timeout(1200))


if importlib.util.find_spec("xdist") is not None:  # the hook exists only with the plugin

    def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
        from xdist.scheduler import LoadScopeScheduling

        class SharedExportScheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                module = nodeid.split("::", 1)[0]
                return SAME_WORKER.get(Path(module).name, module)

        return SharedExportScheduling(config, log)
