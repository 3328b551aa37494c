"""The tree is ruff clean (lint rules and formatting in ruff.toml)."""

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
