"""Launch files name only things that exist (parsed: launch_ros is not installable from PyPI)."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from omni_ros.commands.node import NODES

ROOT = Path(__file__).resolve().parent.parent
LAUNCH_FILES = sorted((ROOT / "launch").glob("*.launch.py"))


def package_name() -> str:
    return re.search(r"<name>(.*?)</name>", (ROOT / "package.xml").read_text()).group(1)


def share_paths(tree: ast.AST) -> list[str]:
    """Paths joined onto FindPackageShare(...) (directly or through a variable)."""
    share_vars = {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.Call)
        and getattr(n.value.func, "id", "") == "FindPackageShare"
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    paths = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "PathJoinSubstitution":
            parts = n.args[0].elts
            head = parts[0]
            is_share = (isinstance(head, ast.Call) and getattr(head.func, "id", "") == "FindPackageShare") or (
                isinstance(head, ast.Name) and head.id in share_vars
            )
            if is_share:
                paths.append("/".join(p.value for p in parts[1:]))
    return paths


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_file_references_exist(path):
    tree = ast.parse(path.read_text())
    packages = {
        n.args[0].value
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "FindPackageShare"
    }
    assert packages <= {package_name()}, packages
    for rel in share_paths(tree):
        # config/ and launch/ are installed to share/omni_ros by CMakeLists.txt.
        assert rel.split("/")[0] in ("config", "launch"), rel
        assert (ROOT / rel).is_file(), f"{path.name} names share/omni_ros/{rel}, which does not exist"
    node_calls = [
        n.args[0].value
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "node" and n.args
    ]
    for name in node_calls:
        assert name in NODES, f"{path.name} starts unknown node '{name}'"
    commands = [
        n.elts[0].value
        for n in ast.walk(tree)
        if isinstance(n, ast.List) and n.elts and isinstance(n.elts[0], ast.Constant) and n.elts[0].value == "omni-ros"
    ]
    assert node_calls or commands or share_paths(tree), f"{path.name} starts nothing"


def test_launch_and_config_dirs_installed_by_cmake():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert re.search(r"install\(DIRECTORY launch config DESTINATION share/\$\{PROJECT_NAME\}\)", cmake)


def test_omni_ros_console_script_and_node_command(python):
    assert "omni-ros = omni_ros.cli:main" in (ROOT / "setup.py").read_text()
    out = subprocess.run([python, "-m", "omni_ros.cli", "node", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for name in NODES:
        assert name in out.stdout
