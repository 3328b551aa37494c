"""The sidecar JSON of an exported policy: everything the runtime needs besides the programs themselves.

`policy.pte` -> `policy.pte.json` with the model config (cameras, dims, horizon, tokenizer), norm stats,
the method signatures, the delegation report, the versions that exported it and the program's SHA-256.
An ONNX export is a folder with one `.onnx` file per method and the same sidecar as `omni_ros.json`
(format `omni_ros.onnx.v1`), which lists the size and SHA-256 of every file under `files`.
The runtime refuses a program whose sidecar is missing, does not describe it, or does not match the
configuration it is used with.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omni_ros.errors import OmniRosError
from omni_ros.file_hash import file_sha256
from omni_ros.package_versions import package_versions
from omni_ros.policy.methods import MethodSignature
from omni_ros.policy.normalize import NormStats

FORMAT = "omni_ros.pte.v1"
ONNX_FORMAT = "omni_ros.onnx.v1"
# The flatbuffer file identifier of an ExecuTorch program (bytes 4-8). The runtime aborts the whole process on
# some malformed files instead of raising, so nothing reaches it without this and the checksum.
PROGRAM_IDENTIFIER = b"ET12"


class PteError(OmniRosError, RuntimeError):
    """A `.pte` or its sidecar is missing, corrupt, or does not match the configuration."""


class OnnxModelError(OmniRosError, RuntimeError):
    """An ONNX export (its files, its sidecar or its compiled QNN cache) is missing, corrupt or does not match."""


def sidecar_path(pte: str | Path) -> Path:
    pte = Path(pte)
    return pte.with_name(pte.name + ".json")


PTE_PACKAGES = ("omni_ros", "torch", "executorch", "torchao")
ONNX_PACKAGES = ("omni_ros", "torch", "onnx", "onnxscript", "onnxruntime", "onnxruntime-qnn")


def runtime_versions(packages: tuple[str, ...] = PTE_PACKAGES) -> dict[str, str]:
    """Versions of what exports and runs programs (recorded at export, compared at load)."""
    return package_versions(packages)


@dataclass
class Sidecar:
    name: str
    target: str
    quantize: str
    model: Any  # the family's model config (pi0's ModelConfig, SmolVLAConfig, ...)
    norm_stats: NormStats
    methods: dict[str, MethodSignature]
    # Euler steps baked into the fused `sample` method.
    num_steps: int
    # The program file of a .pte; an ONNX export lists its files (name relative to the folder -> digest) instead.
    pte_sha256: str = ""
    pte_bytes: int = 0
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
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
        artifact = (
            {"files": self.files}
            if self.format == ONNX_FORMAT
            else {"pte": {"sha256": self.pte_sha256, "bytes": self.pte_bytes}}
        )
        return {
            "format": self.format,
            "name": self.name,
            "family": self.family,
            "target": self.target,
            "quantize": self.quantize,
            **artifact,
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
    def from_dict(cls, data: dict[str, Any], source: str = "<sidecar>", expect: str = FORMAT) -> Sidecar:
        error = OnnxModelError if expect == ONNX_FORMAT else PteError
        if data.get("format") != expect:
            raise error(f"{source}: sidecar format {data.get('format')!r}, this omni_ros reads {expect!r}")
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
                pte_sha256=data["pte"]["sha256"] if expect == FORMAT else "",
                pte_bytes=int(data["pte"]["bytes"]) if expect == FORMAT else 0,
                files={n: {"sha256": d["sha256"], "bytes": int(d["bytes"])} for n, d in data.get("files", {}).items()},
                num_steps=int(data["num_steps"]),
                versions=dict(data["versions"]),
                delegation=data.get("delegation", {}),
                tokenizer_file=data.get("tokenizer_file"),
                target_options=data.get("target_options", {}),
                format=expect,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise error(f"{source}: invalid sidecar: {exc!r}") from exc


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


def file_digest(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    return {"sha256": file_sha256(path), "bytes": path.stat().st_size}


def verify_file(path: Path, sha256: str, size: int, error: type[Exception] = PteError) -> None:
    """Refuse `path` unless it has the size and SHA-256 its sidecar recorded (truncated, corrupt, replaced)."""
    actual = path.stat().st_size
    if actual != size:
        raise error(
            f"{path}: {actual} bytes but its sidecar describes {size} bytes (truncated, corrupt or "
            "replaced file); export it again"
        )
    if file_sha256(path) != sha256:
        raise error(f"{path}: SHA-256 does not match its sidecar (corrupt or replaced file); export it again")


def _read_json(path: Path, error: type[Exception]) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path}: not valid JSON: {exc}") from exc


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
    sidecar = Sidecar.from_dict(_read_json(path, PteError), source=str(path))
    with open(pte, "rb") as f:
        header = f.read(8)
    if header[4:8] != PROGRAM_IDENTIFIER:
        raise PteError(
            f"{pte}: not an ExecuTorch program (file identifier {header[4:8]!r}, expected {PROGRAM_IDENTIFIER!r})"
        )
    if verify:
        verify_file(pte, sidecar.pte_sha256, sidecar.pte_bytes)
    return sidecar


ONNX_SIDECAR = "omni_ros.json"


def read_onnx_sidecar(folder: str | Path, verify: bool = True) -> Sidecar:
    """The sidecar of an ONNX export folder, every listed file checked against it (size, SHA-256) when `verify`."""
    folder = Path(folder)
    path = folder / ONNX_SIDECAR
    if not folder.is_dir():
        raise OnnxModelError(f"ONNX export not found: {folder} (a folder written by `omni-ros export --target onnx`)")
    if not path.is_file():
        raise OnnxModelError(
            f"{folder}: sidecar {ONNX_SIDECAR} is missing; `omni-ros export --target onnx` writes it next to the "
            ".onnx files and it holds the config, norm stats and signatures the runtime needs"
        )
    sidecar = Sidecar.from_dict(_read_json(path, OnnxModelError), source=str(path), expect=ONNX_FORMAT)
    missing = [m for m in sidecar.methods if f"{m}.onnx" not in sidecar.files]
    if missing:
        raise OnnxModelError(f"{path}: lists no file for methods {missing}")
    for name, digest in sidecar.files.items():
        file = folder / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise OnnxModelError(f"{path}: file {name!r} is outside the export folder")
        if not file.is_file():
            raise OnnxModelError(f"{folder}: {name} is missing (its sidecar lists it); export again")
        if verify:
            verify_file(file, digest["sha256"], digest["bytes"], OnnxModelError)
    return sidecar


def _major_minor(v: str) -> tuple[str, ...]:
    return tuple(v.split("+")[0].split(".")[:2])


def check_compatible(
    sidecar: Sidecar,
    source: str,
    camera_names: Sequence[str] | None = None,
    state_dim: int | None = None,
    action_dim: int | None = None,
    executorch_version: str | None = None,
    error: type[Exception] = PteError,
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
        raise error(f"{source} does not match this configuration: " + "; ".join(problems))
