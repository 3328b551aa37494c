"""The package metadata agrees with itself: one version, and setup.py's requirements match requirements/."""

from __future__ import annotations

import re
import runpy
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import setuptools

import omni_ros

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def setup_kwargs() -> dict:
    """The arguments setup.py passes to setuptools.setup, without building anything."""
    captured: dict = {}
    original = setuptools.setup
    setuptools.setup = lambda **kwargs: captured.update(kwargs)
    try:
        runpy.run_path(str(ROOT / "setup.py"), run_name="__main__")
    finally:
        setuptools.setup = original
    return captured


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def test_one_version_everywhere(setup_kwargs):
    assert re.fullmatch(r"\d+\.\d+\.\d+", omni_ros.__version__)
    assert setup_kwargs["version"] == omni_ros.__version__
    assert ET.parse(ROOT / "package.xml").getroot().findtext("version") == omni_ros.__version__


def test_setup_requirements_agree_with_the_pinned_environment(setup_kwargs):
    """Every package both files name: the same lower bound, or a pin that satisfies setup.py's."""
    pinned = {}
    for line in (ROOT / "requirements" / "base.txt").read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[\w,]+\])?\s*(==|>=)?\s*([\w.]*)", line.split("#")[0].strip())
        if match:
            pinned[match[1].lower()] = (match[2], match[3])
    declared = [*setup_kwargs["install_requires"], *(r for rs in setup_kwargs["extras_require"].values() for r in rs)]
    checked = []
    for requirement in declared:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[\w,]+\])?(?:>=([\w.]+))?", requirement)
        assert match, f"setup.py requirement {requirement!r} has an unexpected form"
        name, low = match[1].lower(), match[2]
        if name not in pinned or low is None:
            continue
        op, version = pinned[name]
        if op == "==":
            assert _version(version) >= _version(low), f"{name}: requirements pin {version}, setup.py needs >={low}"
        else:
            assert (op, version) == (">=", low), f"{name}: requirements say {op}{version}, setup.py says >={low}"
        checked.append(name)
    assert "numpy" in checked and "pyyaml" in checked
