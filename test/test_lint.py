"""The tree is ruff clean (lint rules and formatting in ruff.toml) and mypy clean (mypy.ini)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RUFF = Path(sys.executable).parent / "ruff"


def test_ruff_check(root):
    result = subprocess.run([str(RUFF), "check", "."], cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format(root):
    result = subprocess.run(
        [str(RUFF), "format", "--check", "."], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_clean(root):
    """omni_ros/ ships py.typed, so its annotations are a promise: mypy over the whole package, no errors.

    The incremental cache (.mypy_cache, ignored by git) makes runs after the first take seconds.
    """
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=270,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout, result.stdout
