"""The per-checkpoint kernel cache: programs built on first load for this CPU, reused by every later load.

    <cache_dir>/kernels/<label>-<weights hash>-<cpu hash>/manifest.json + programs

The folder is named by what the programs depend on: the weights they were built from (a hash of the very
tensors compiled in, so a retrained or edited checkpoint rebuilds), the CPU (its model and the instruction
sets that choose kernels: a program built on one CPU is never used on another) and the versions of the tools
that built them (in the manifest). A file whose sha256 no longer matches its manifest entry is rebuilt with a
warning, never loaded: ExecuTorch's runtime can abort the process on a malformed program.

The manifest also says where the build came from (`source`: the checkpoint folder, resolved; `variant`: what was
built of it) and when; a load touches it, so its mtime is the entry's last use. A finished build removes the
entries it supersedes: the same label, source, variant and CPU built earlier (a checkpoint retrained in place, or a tool
upgrade, leaves its old builds, 0.5 GB each for a full-size SmolVLA program, unreachable: the key changed).
`omni-ros cache` lists, prunes and clears the rest (cache_admin.py).

`cache_root()`: `policy.cache_dir`, else $OMNI_ROS_CACHE_DIR, else $XDG_CACHE_HOME/omni_ros, else ~/.cache/omni_ros.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from omni_ros.cpu_features import CpuFeatures
from omni_ros.file_hash import file_sha256
from omni_ros.package_versions import package_versions

logger = logging.getLogger("omni_ros.policy")
MANIFEST = "manifest.json"
FORMAT = 1
# What builds and runs the cached programs: recorded in each manifest (`omni-ros cache prune` drops entries other
# versions built; the keys themselves hash the versions, so this install never loads them).
TOOLS = ("omni_ros", "torch", "executorch", "torchao")


def tool_versions() -> dict[str, str]:
    return package_versions(TOOLS)


# What decides the numbers a program computes, beside the checkpoint and the tools: omni_ros's code that defines the
# models and exports them. Its version string stays put while that code changes, so a program's key hashes the
# source itself (`builder_source_hash`; the stage programs, backends/stage_program.py).
BUILDER_SOURCES = ("export", "lowering.py", "policy")


def builder_source_hash(package: Path | None = None) -> str:
    """sha256 of the Python files under `BUILDER_SOURCES` of the omni_ros package (`package`: its folder)."""
    package = package or Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for name in BUILDER_SOURCES:
        root = package / name
        for path in sorted([root] if root.is_file() else root.rglob("*.py")):
            digest.update(f"{path.relative_to(package).as_posix()}|{file_sha256(path)}\n".encode())
    return digest.hexdigest()


def cache_root(configured: str | None = None) -> Path:
    if configured:
        return Path(configured).expanduser()
    if os.environ.get("OMNI_ROS_CACHE_DIR"):
        return Path(os.environ["OMNI_ROS_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "omni_ros"


def tensors_hash(tensors: Iterable[tuple[str, torch.Tensor]], extra: dict[str, Any]) -> str:
    """sha256 of named tensors (names, shapes, dtypes and bytes) and of `extra` (build settings)."""
    from omni_ros.policy.layouts.weights import release_mapped_pages

    digest = hashlib.sha256(json.dumps(extra, sort_keys=True).encode())
    for name, tensor in tensors:
        t = tensor.detach().contiguous().cpu()
        digest.update(f"{name}|{tuple(t.shape)}|{t.dtype}".encode())
        if t.numel():
            digest.update(t.reshape(-1).view(torch.uint8).numpy().data)  # the buffer itself, not a bytes copy
        # Reading a zero-copy weight brings its file pages back: the hash of a full-size X-VLA's float linears
        # held 3 GB that its int8 layers no longer need (scratch, /proc/self/status RssFile).
        release_mapped_pages(t)
    return digest.hexdigest()


def cpu_hash(cpu: CpuFeatures) -> str:
    return hashlib.sha256(cpu.key().encode()).hexdigest()[:8]


class CacheEntry:
    """One cache folder: its files are valid only together with a manifest whose hashes they match."""

    def __init__(
        self, root: Path, label: str, weights: str, cpu: CpuFeatures, *, source: str | None = None, variant: str = ""
    ) -> None:
        """`source`: the checkpoint folder the build reads (None: a model from a preset or from memory, never
        superseded); `variant`: what of it is built (the same source may hold several: a program with and without
        a method)."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)[:40] or "model"
        self.folder = root / "kernels" / f"{safe}-{weights[:16]}-{cpu_hash(cpu)}"
        self.label, self.weights, self.cpu = safe, weights, cpu
        self.source, self.variant = source, variant

    def load(self) -> dict[str, Any] | None:
        """The manifest if every file it names is intact; None if absent; a corrupt one is removed, with a
        warning, so that it is rebuilt."""
        path = self.folder / MANIFEST
        if not path.is_file():
            return None
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
            if manifest.get("format") != FORMAT or manifest.get("weights") != self.weights:
                raise ValueError("it was written for other weights or another format")
            for name, digest in manifest["files"].items():
                if file_sha256(self.folder / name) != digest:
                    raise ValueError(f"{name} does not match its sha256")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("kernel cache %s is corrupt (%s): rebuilding it", self.folder, exc)
            shutil.rmtree(self.folder, ignore_errors=True)
            return None
        # The manifest's mtime is the entry's last use (`omni-ros cache prune --unused-days`); a read-only cache is
        # still a cache.
        with contextlib.suppress(OSError):
            os.utime(path)
        return manifest

    def build(self, write: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
        """Run `write(tmp_folder)` (it writes the files, returns manifest fields), then move the folder into place
        atomically with its manifest: a build cut short leaves nothing that looks complete."""
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.folder.name}.", dir=self.folder.parent))
        try:
            fields = write(tmp)
            files = {p.name: file_sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
            manifest = {"format": FORMAT, "weights": self.weights, "cpu": self.cpu.key(), "files": files}
            manifest |= {"label": self.label, "source": self.source, "variant": self.variant}
            manifest |= {"versions": tool_versions()}  # a builder's own `versions` (what its key hashed) wins
            manifest |= {"built_at": round(time.time(), 1), **fields}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
            shutil.rmtree(self.folder, ignore_errors=True)
            os.replace(tmp, self.folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._remove_superseded()
        return manifest

    def _remove_superseded(self) -> None:
        """Remove the entries this build replaces: same label, source, variant and CPU, another key (older weights
        or tools). Nothing loads them again: their key no longer matches anything this install computes."""
        if self.source is None:
            return
        from omni_ros.policy.precision.cache_admin import scan

        mine = (self.label, self.source, self.variant, self.cpu.key())
        for old in scan(self.folder.parent.parent):
            same = tuple(old.field(key) for key in ("label", "source", "variant", "cpu")) == mine
            if same and old.folder != self.folder:
                logger.info(
                    "kernel cache: removing %s (%.0f MB), an earlier build of %s",
                    old.folder,
                    old.bytes / 1e6,
                    self.source,
                )
                shutil.rmtree(old.folder, ignore_errors=True)
