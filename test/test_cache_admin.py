"""The kernel cache over time: a build records where it came from and replaces that checkpoint's earlier builds, a
load marks its entry used, and `omni-ros cache list | prune | clear` (the real CLI) say and remove what can go."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from omni_ros import cpu_features
from omni_ros.policy.precision import PrecisionChoice, apply_precision
from omni_ros.policy.precision.kernel_cache import CacheEntry, builder_source_hash, tool_versions

pytestmark = pytest.mark.usefixtures("torch_one_thread")
DAY = 86400.0
# This CPU as the builds and the CLI's child see it (both read $OMNI_ROS_CPU_FLAGS the same way).
THIS_CPU = cpu_features.detect().key()


def _build(cache: Path, seed: int, source: str | None) -> Path:
    """Swap a two-linear model's layers for XNNPACK int8 kernels (a build, or a cache read); its entry's folder."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 48))
    choice = PrecisionChoice("int8", "test", kernel="xnnpack")
    applied = apply_precision(model, choice, cache_dir=cache, label="two", source=source)
    assert applied.cache is not None
    return applied.cache


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "omni_ros.cli", "cache", *args], capture_output=True, text=True, timeout=120
    )


def _entry(cache: Path, name: str, **manifest) -> Path:
    """A cache entry as a build of other days or tools leaves it (manifest fields as given)."""
    folder = cache / "kernels" / name
    folder.mkdir(parents=True)
    (folder / "linears.pte").write_bytes(b"x" * 1000)
    fields = {"format": 1, "weights": "0" * 64, "cpu": THIS_CPU, "files": {"linears.pte": "0" * 64}}
    (folder / "manifest.json").write_text(json.dumps({**fields, **manifest}))
    return folder


def _rebuild(cache: Path, weights: str, source: str | None, variant: str) -> CacheEntry:
    """An entry built by a writer of one small file: the cache's bookkeeping without a minute of lowering."""
    entry = CacheEntry(cache, "two", weights, cpu_features.detect(), source=source, variant=variant)
    entry.build(lambda tmp: (tmp / "linears.pte").write_bytes(b"program") and {})
    return entry


def test_a_build_records_its_source_replaces_that_checkpoints_earlier_build_and_a_load_marks_it_used(tmp_path):
    first = _build(tmp_path, 0, "/robots/arm/last")  # a real int8 load: XNNPACK kernels built for this CPU
    manifest = json.loads((first / "manifest.json").read_text())
    installed = tool_versions()
    assert manifest["source"] == "/robots/arm/last" and manifest["label"] == "two" and manifest["variant"]
    assert manifest["versions"] and all(installed[tool] == v for tool, v in manifest["versions"].items())
    assert abs(manifest["built_at"] - time.time()) < 600
    same = {"label": "two", "variant": manifest["variant"], "versions": manifest["versions"]}
    other_checkpoint = _entry(tmp_path, "two-best", **same, source="/robots/arm/best")
    other_cpu = _entry(tmp_path, "two-last-other-cpu", **same, source="/robots/arm/last", cpu="x86_64|another|avx2")
    other_label = _entry(tmp_path, "arm-last", **{**same, "label": "arm"}, source="/robots/arm/last")
    other_variant = _entry(tmp_path, "two-last-guided", **{**same, "variant": "another"}, source="/robots/arm/last")
    in_memory = _rebuild(tmp_path, "1" * 64, None, manifest["variant"])  # a preset's or a model in memory's
    assert first.exists() and in_memory.folder.exists()  # nothing recorded, nothing replaced
    retrained = _rebuild(tmp_path, "2" * 64, "/robots/arm/last", manifest["variant"])  # retrained in place
    assert not first.exists()
    kept = (other_checkpoint, other_cpu, other_label, other_variant, in_memory.folder, retrained.folder)
    assert all(p.exists() for p in kept)

    marker = retrained.folder / "manifest.json"
    long_ago = time.time() - 40 * DAY
    os.utime(marker, (long_ago, long_ago))
    assert retrained.load() is not None and marker.stat().st_mtime > long_ago + 39 * DAY


def test_prune_removes_what_this_install_cannot_load_and_keeps_the_rest(tmp_path):
    current = _entry(tmp_path, "two-current", source="/robots/arm/last", versions=tool_versions())
    old_tools = _entry(tmp_path, "two-old-tools", versions={**tool_versions(), "torch": "1.0.0"})
    # A program whose key hashed other omni_ros model / export source; one built from this install's is kept.
    old_code = _entry(tmp_path, "two-stages-old-code", versions=tool_versions(), builder="0" * 64)
    this_code = _entry(tmp_path, "two-stages-this-code", versions=tool_versions(), builder=builder_source_hash())
    unknown = _entry(tmp_path, "two-legacy")  # built before manifests said their versions: kept
    other_cpu = _entry(tmp_path, "two-other-cpu", cpu="x86_64|another|avx2", versions=tool_versions())
    unused = _entry(tmp_path, "two-unused", versions=tool_versions())
    broken = tmp_path / "kernels" / "two-broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    stopped = tmp_path / "kernels" / ".two-stopped.abc"  # a build killed two days ago
    stopped.mkdir()
    (stopped / "linears.pte").write_bytes(b"half")
    running = tmp_path / "kernels" / ".two-running.def"  # a build in progress
    running.mkdir()
    for path in (stopped, unused / "manifest.json"):
        os.utime(path, (time.time() - 2 * DAY, time.time() - 2 * DAY))

    listed = _cli("list", "--json", "--cache-dir", str(tmp_path))
    assert listed.returncode == 0, listed.stderr
    by_folder = {Path(e["folder"]).name: e for e in json.loads(listed.stdout)}
    assert set(by_folder) == {p.name for p in (tmp_path / "kernels").iterdir()}
    assert by_folder[current.name]["source"] == "/robots/arm/last" and by_folder[current.name]["can_go"] is None
    assert "torch 1.0.0" in by_folder[old_tools.name]["can_go"]
    assert "other omni_ros model or export code" in by_folder[old_code.name]["can_go"]
    assert by_folder[this_code.name]["can_go"] is None

    dry = _cli("prune", "--dry-run", "--cache-dir", str(tmp_path))
    assert dry.returncode == 0 and "would free" in dry.stdout and old_tools.exists() and broken.exists()
    pruned = _cli("prune", "--cache-dir", str(tmp_path))
    assert pruned.returncode == 0, pruned.stderr
    assert "4 entries" in pruned.stdout
    assert not old_tools.exists() and not old_code.exists() and not broken.exists() and not stopped.exists()
    assert current.exists() and unknown.exists() and other_cpu.exists() and unused.exists() and running.exists()
    assert this_code.exists()

    asked = _cli("prune", "--unused-days", "1", "--other-cpus", "--cache-dir", str(tmp_path))
    assert asked.returncode == 0, asked.stderr
    assert not other_cpu.exists() and not unused.exists()
    assert current.exists() and unknown.exists() and running.exists()

    cleared = _cli("clear", "--cache-dir", str(tmp_path))
    assert cleared.returncode == 0 and not any((tmp_path / "kernels").iterdir())
    empty = _cli("list", "--cache-dir", str(tmp_path))
    assert empty.returncode == 0 and "empty" in empty.stdout
