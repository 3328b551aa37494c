"""What the kernel cache holds, and which of it can go (`omni-ros cache list | prune | clear`).

Every entry is a folder `<cache_dir>/kernels/<label>-<key>-<cpu>/` (kernel_cache.py). An entry can never be loaded
again by this install when its tools differ from the installed ones (the key hashes their versions), when it is a
program built from other omni_ros model or export code (`builder` in its manifest) or when a later
build of the same checkpoint folder replaced it (a build removes those itself; older entries, built before the
manifest said where they came from, stay until pruned by age). A build killed mid-way leaves a hidden temporary
folder; a day later it is garbage. Entries of other CPUs are kept unless asked: a cache folder may be shared.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omni_ros.policy.precision.kernel_cache import MANIFEST, builder_source_hash, tool_versions

# A hidden folder of a build in progress is left alone this long (a full-size SmolVLA's program takes ~5 minutes).
UNFINISHED_AFTER_S = 24 * 3600
KINDS = {"stages.pte": "int8 program", "linears.pte": "int8 linears"}


@dataclass(frozen=True)
class CachedBuild:
    """One folder under `<cache_dir>/kernels` and what its manifest says (read once, by `scan`)."""

    folder: Path
    bytes: int
    manifest: dict[str, Any] | None  # None: no readable one
    last_used: float  # the manifest's mtime: a load touches it
    # The tool versions that built it: the manifest's, else (entries from before manifests recorded them) an int8
    # program's sidecar's; None where neither says.
    versions: dict[str, str] | None

    @property
    def unfinished(self) -> bool:
        return self.folder.name.startswith(".")

    @property
    def kind(self) -> str:
        if self.unfinished:
            return "unfinished build"
        files = self.field("files") or {}
        return next((kind for name, kind in KINDS.items() if name in files), "unknown")

    def field(self, key: str) -> Any:
        """The manifest's `key` (label, source, variant, cpu, built_at, ...), None where it has none."""
        return (self.manifest or {}).get(key)

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary (`omni-ros cache list --json`)."""
        summary = {"folder": str(self.folder), "kind": self.kind, "megabytes": round(self.bytes / 1e6, 1)}
        summary |= {key: self.field(key) for key in ("source", "cpu", "built_at", "build_seconds")}
        return summary | {"versions": self.versions, "last_used": self.last_used}


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _versions(folder: Path, manifest: dict[str, Any] | None) -> dict[str, str] | None:
    if manifest and manifest.get("versions"):
        return dict(manifest["versions"])
    try:
        return dict(json.loads((folder / "stages.pte.json").read_text(encoding="utf-8"))["versions"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def scan(root: Path) -> list[CachedBuild]:
    """Every entry (and unfinished build) under `root`/kernels, oldest use first."""
    kernels = root / "kernels"
    if not kernels.is_dir():
        return []
    builds = []
    for folder in sorted(p for p in kernels.iterdir() if p.is_dir()):
        path = folder / MANIFEST
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(manifest, dict):
                manifest = None
            last_used = path.stat().st_mtime
        except (OSError, ValueError):
            manifest, last_used = None, folder.stat().st_mtime
        builds.append(CachedBuild(folder, _size(folder), manifest, last_used, _versions(folder, manifest)))
    return sorted(builds, key=lambda b: b.last_used)


def stale_reason(
    build: CachedBuild,
    *,
    cpu_key: str,
    versions: dict[str, str],
    builder: str | None = None,
    unused_days: float | None = None,
    other_cpus: bool = False,
    now: float | None = None,
) -> str | None:
    """Why `build` can go (None: keep it)."""
    now = time.time() if now is None else now
    if build.unfinished:
        age = now - build.last_used
        return f"a build stopped {age / 3600:.0f} h ago" if age > UNFINISHED_AFTER_S else None
    if build.manifest is None:
        return "no readable manifest (never loaded: a load rebuilds it)"
    built_by = build.versions
    # Only the tools the entry recorded: those its key hashed (the per-linear kernels' leave omni_ros out).
    changed = sorted(k for k, v in (built_by or {}).items() if versions.get(k) != v)
    if changed:
        said = ", ".join(f"{k} {built_by[k]} (installed: {versions.get(k, '-')})" for k in changed if built_by)
        return f"built by other tools, {said}: this install never loads it"
    # A program's key hashes omni_ros's model and export source (kernel_cache.BUILDER_SOURCES): built from other.
    if builder is not None and build.field("builder") not in (None, builder):
        return "built from other omni_ros model or export code (an upgrade or an edit): this install never loads it"
    if other_cpus and build.field("cpu") != cpu_key:
        return f"built for another CPU ({build.field('cpu')})"
    if unused_days is not None and now - build.last_used > unused_days * 86400:
        return f"unused for {(now - build.last_used) / 86400:.0f} days"
    return None


def prune_plan(
    builds: list[CachedBuild],
    *,
    cpu_key: str,
    unused_days: float | None = None,
    other_cpus: bool = False,
    now: float | None = None,
) -> list[tuple[CachedBuild, str]]:
    """The builds `prune` removes, each with why."""
    versions, builder = tool_versions(), builder_source_hash()
    plan = []
    for build in builds:
        why = stale_reason(
            build,
            cpu_key=cpu_key,
            versions=versions,
            builder=builder,
            unused_days=unused_days,
            other_cpus=other_cpus,
            now=now,
        )
        if why is not None:
            plan.append((build, why))
    return plan


def remove(build: CachedBuild) -> None:
    shutil.rmtree(build.folder, ignore_errors=True)
