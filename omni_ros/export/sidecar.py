"""The sidecar JSON next to a `.pte`: everything the runtime needs besides the program itself.

`policy.pte` -> `policy.pte.json` with the model config (cameras, dims, horizon, tokenizer), norm stats,
the method signatures, the delegation report, the versions that exported it and the program's SHA-256.
The runtime refuses a `.pte` whose sidecar is missing, does not describe it, or does not match the
configuration it is used with.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omni_ros.errors import OmniRosError
from omni_ros.export.methods import MethodSignature
from omni_ros.policy.normalize import NormStats

FORMAT = "omni_ros.pte.v1"
# The flatbuffer file identifier of an ExecuTorch program (bytes 4-8). The runtime aborts the whole process on
# some malformed files instead of raising, so nothing reaches it without this and the checksum.
PROGRAM_IDENTIFIER = b"ET12"


class PteError(OmniRosError, RuntimeError):
    """A `.pte` or its sidecar is missing, corrupt, or does not match the configuration."""


def sidecar_path(pte: str | Path) -> Path:
    pte = Path(pte)
    return pte.with_name(pte.name + ".json")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def runtime_versions() -> dict[str, str]:
    """Versions of what exports and runs programs (recorded at export, compared at load)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for package in ("omni_ros", "torch", "executorch", "torchao"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "unknown"
    return versions


@dataclass
class Sidecar:
    name: str
    target: str
    quantize: str
    model: Any  # the family's model config (pi0's ModelConfig, SmolVLAConfig, ...)
    norm_stats: NormStats
    methods: dict[str, MethodSignature]
    pte_sha256: str
    pte_bytes: int
    # Euler steps baked into the fused `sample` method.
    num_steps: int
    versions: dict[str, str] = field(default_factory=runtime_versions)
    delegation: dict[str, Any] = field(default_factory=dict)
    # A tokenizer file copied next to the .pte (sentencepiece), relative to it.
    tokenizer_file: str | None = None
    target_options: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT

    @property
    def family(self) -> str:
        """The model family (omni_ros.policy.families) of the program: its processor and its stage chaining."""
        return getattr(self.model, "family", "pi0")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "name": self.name,
            "family": self.family,
            "target": self.target,
            "quantize": self.quantize,
            "pte": {"sha256": self.pte_sha256, "bytes": self.pte_bytes},
            "model": self.model.to_dict(),
            "norm_stats": asdict(self.norm_stats),
            "tokenizer_file": self.tokenizer_file,
            "num_steps": self.num_steps,
            "methods": {name: sig.to_dict() for name, sig in self.methods.items()},
            "versions": self.versions,
            "target_options": self.target_options,
            "delegation": self.delegation,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<sidecar>") -> Sidecar:
        if data.get("format") != FORMAT:
            raise PteError(f"{source}: sidecar format {data.get('format')!r}, this omni_ros reads {FORMAT!r}")
        from omni_ros.policy import families

        try:
            # Programs written before families had names are pi0's.
            model = families.get(data.get("family", "pi0")).config_type.from_dict(data["model"], source=source)
            stats = NormStats(**data["norm_stats"])
            stats.check(model.state_dim, model.action_dim)
            return cls(
                name=data["name"],
                target=data["target"],
                quantize=data["quantize"],
                model=model,
                norm_stats=stats,
                methods={n: MethodSignature.from_dict(n, s) for n, s in data["methods"].items()},
                pte_sha256=data["pte"]["sha256"],
                pte_bytes=int(data["pte"]["bytes"]),
                num_steps=int(data["num_steps"]),
                versions=dict(data["versions"]),
                delegation=data.get("delegation", {}),
                tokenizer_file=data.get("tokenizer_file"),
                target_options=data.get("target_options", {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PteError(f"{source}: invalid sidecar: {exc!r}") from exc


def write_atomic(path: Path, data: bytes) -> None:
    """Write via a temporary file and rename, so a crash never leaves a half-written file under `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp creates 0600; give the file the permissions a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_sidecar(pte: str | Path, sidecar: Sidecar) -> Path:
    path = sidecar_path(pte)
    write_atomic(path, (json.dumps(sidecar.to_dict(), indent=2) + "\n").encode())
    return path


def read_sidecar(pte: str | Path, verify: bool = True) -> Sidecar:
    """The sidecar of `pte`, checked to describe this very file (size and SHA-256) when `verify`."""
    pte = Path(pte)
    if not pte.is_file():
        raise PteError(f"ExecuTorch program not found: {pte}")
    path = sidecar_path(pte)
    if not path.is_file():
        raise PteError(
            f"{pte}: sidecar {path.name} is missing; it is written by `omni-ros export` next to the .pte "
            "and holds the config, norm stats and signatures the runtime needs"
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PteError(f"{path}: not valid JSON: {exc}") from exc
    sidecar = Sidecar.from_dict(data, source=str(path))
    with open(pte, "rb") as f:
        header = f.read(8)
    if header[4:8] != PROGRAM_IDENTIFIER:
        raise PteError(
            f"{pte}: not an ExecuTorch program (file identifier {header[4:8]!r}, expected {PROGRAM_IDENTIFIER!r})"
        )
    if verify:
        size = pte.stat().st_size
        if size != sidecar.pte_bytes:
            raise PteError(
                f"{pte}: {size} bytes but its sidecar describes {sidecar.pte_bytes} bytes (truncated, corrupt or "
                "replaced .pte); export it again"
            )
        if file_sha256(pte) != sidecar.pte_sha256:
            raise PteError(f"{pte}: SHA-256 does not match its sidecar (corrupt or replaced .pte); export it again")
    return sidecar


def _major_minor(v: str) -> tuple[str, ...]:
    return tuple(v.split("+")[0].split(".")[:2])


def check_compatible(
    sidecar: Sidecar,
    source: str,
    camera_names: list[str] | tuple[str, ...] | None = None,
    state_dim: int | None = None,
    action_dim: int | None = None,
    executorch_version: str | None = None,
) -> None:
    """Refuse a program exported for other cameras, dims or another ExecuTorch release, naming the difference."""
    cfg = sidecar.model
    problems = []
    if camera_names is not None and list(camera_names) != list(cfg.camera_names):
        problems.append(f"cameras: program {list(cfg.camera_names)}, configured {list(camera_names)}")
    if state_dim is not None and state_dim != cfg.state_dim:
        problems.append(f"state_dim: program {cfg.state_dim}, configured {state_dim}")
    if action_dim is not None and action_dim != cfg.action_dim:
        problems.append(f"action_dim: program {cfg.action_dim}, configured {action_dim}")
    exported = sidecar.versions.get("executorch", "unknown")
    if executorch_version is not None and _major_minor(exported) != _major_minor(executorch_version):
        problems.append(
            f"export version: exported with executorch {exported}, this runtime is executorch {executorch_version} "
            "(delegate payloads are tied to the release; re-export with this one)"
        )
    if problems:
        raise PteError(f"{source} does not match this configuration: " + "; ".join(problems))
