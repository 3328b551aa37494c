"""scripts/setup.sh is idempotent: a second run rebuilds and reinstalls nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _venv() -> Path:
    return Path(sys.prefix)


def _snapshot(venv: Path) -> dict[str, float]:
    """Modification times of what each setup step writes."""
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    paths = [
        venv / ".omni_ros" / "deps",
        venv / ".omni_ros" / "msgs",
        site / "omni_ros_msgs.pth",
        *sorted((venv / "lib" / "omni_ros_msgs" / "omni_ros").glob("*.so")),
        # interfaces/control_msgs, where no control_msgs is installed (this venv)
        venv / ".omni_ros" / "control_msgs",
        *sorted((venv / "lib" / "omni_ros_msgs" / "control_msgs").glob("*.so")),
        *sorted(site.glob("torch-*.dist-info/RECORD")),
        *sorted(site.glob("omni_ros-*.dist-info/RECORD")),
    ]
    return {str(p): p.stat().st_mtime_ns for p in paths}


def test_setup_twice_changes_nothing(root):
    venv = _venv()
    env = {**os.environ, "OMNI_ROS_VENV": str(venv)}
    first = subprocess.run(["bash", "scripts/setup.sh"], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr
    before = _snapshot(venv)
    assert len(before) >= 7, f"setup outputs missing: {sorted(before)}"
    second = subprocess.run(
        ["bash", "scripts/setup.sh"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    assert second.returncode == 0, second.stderr
    assert "python dependencies up to date" in second.stdout
    assert "messages up to date" in second.stdout
    assert "control_msgs up to date" in second.stdout
    assert "installing" not in second.stdout and "building" not in second.stdout
    assert _snapshot(venv) == before
