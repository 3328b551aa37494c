"""ONNX Runtime sessions for an exported policy: providers, threads, and Qualcomm's HTP through the QNN EP.

    cpu        ONNX Runtime's own CPU kernels (the `onnx` extra)
    qnn-htp    the QNN execution provider on the Hexagon HTP (the `qnn` extra: onnxruntime-qnn). On x86 Linux its
               libQnnHtp.so is Qualcomm's HTP emulator: the same compiler and integer kernels, not the NPU's speed
    cuda       CUDAExecutionProvider (onnxruntime-gpu, an NVIDIA GPU)
    tensorrt   TensorrtExecutionProvider (onnxruntime-gpu built with TensorRT, an NVIDIA GPU)

`providers` lists the allowed ones in order of preference. qnn-htp without cpu after it runs with CPU fallback
disabled: the whole graph is on the HTP or the session is refused, naming the operators that are not.

The HTP compiles a graph for one SoC at session creation. `HtpCache` keeps that compiled graph (an ONNX model of
EPContext nodes with the context binary embedded) next to the model, described by `qnn_cache.json`, so a robot
loads it in milliseconds instead of compiling at start-up; a cache of another QNN release, SoC or model is
recompiled, a corrupt one is refused.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omni_ros.errors import OmniRosError
from omni_ros.export.qnn import SOC_HTP_ARCH, SOC_MODEL, QnnOptions
from omni_ros.export.sidecar import OnnxModelError, file_digest, write_atomic

PROVIDERS = ("cpu", "qnn-htp", "cuda", "tensorrt")
ORT_PROVIDER = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}
ONNX_EXTRA = "pip install 'omni_ros[onnx]' (onnx, onnxscript, onnxruntime)"
QNN_EXTRA = "pip install 'omni_ros[qnn]' (onnxruntime-qnn 2.7.0: the QNN EP and the HTP libraries)"
GPU_HINT = {
    "cuda": "install onnxruntime-gpu in place of onnxruntime, on a machine with an NVIDIA GPU and its CUDA 12 driver",
    "tensorrt": "install onnxruntime-gpu and TensorRT 10, on a machine with an NVIDIA GPU",
}
CACHE_MANIFEST = "qnn_cache.json"
CACHE_FORMAT = "omni_ros.qnn_cache.v1"
log = logging.getLogger(__name__)


class ExtraMissing(OmniRosError, ImportError):
    """An optional dependency (the onnx or qnn extra) is not installed."""


class ProviderUnavailable(OmniRosError, RuntimeError):
    """A configured execution provider cannot run on this machine."""


def import_onnxruntime():
    try:
        import onnxruntime as ort
    except ImportError:
        raise ExtraMissing(
            f"policy.backend onnxruntime needs ONNX Runtime, which is not installed: {ONNX_EXTRA}"
        ) from None
    # Warnings of the runtime (and of the QNN EP: "file mapped weights ... only on Windows") are not ours to act on.
    ort.set_default_logger_severity(3)
    return ort


_qnn_lock = threading.Lock()


def qnn_ep_devices(ort) -> list:
    """The QNN EP's devices, its plugin library registered with ONNX Runtime once per process."""
    try:
        import onnxruntime_qnn
    except ImportError:
        raise ExtraMissing(f"providers: qnn-htp needs the qnn extra, which is not installed: {QNN_EXTRA}") from None
    name = onnxruntime_qnn.get_ep_name()
    with _qnn_lock:
        if not any(d.ep_name == name for d in ort.get_ep_devices()):
            ort.register_execution_provider_library(name, onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == name]
    if not devices:
        raise ProviderUnavailable(f"the QNN execution provider registered but offers no device ({name})")
    return devices


def qnn_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onnxruntime-qnn")
    except PackageNotFoundError:
        return "not installed"


@dataclass(frozen=True)
class HtpTarget:
    """The SoC and precision an HTP graph is compiled for (from the export's sidecar)."""

    soc: str
    precision: str

    @classmethod
    def from_options(cls, options: QnnOptions) -> HtpTarget:
        options.validate()
        return cls(options.soc, options.precision)

    def provider_options(self) -> dict[str, str]:
        return {
            "backend_type": "htp",
            "soc_model": str(SOC_MODEL[self.soc]),
            "htp_arch": SOC_HTP_ARCH[self.soc][1:],
            # Only the float (fp16) export runs float ops on the HTP; quantized graphs are integer throughout.
            "enable_htp_fp16_precision": "1" if self.precision == "fp16" else "0",
        }


def check_providers(providers: list[str] | tuple[str, ...]) -> list[str]:
    providers = list(providers)
    unknown = [p for p in providers if p not in PROVIDERS]
    if not providers or unknown:
        raise ProviderUnavailable(f"unknown providers {unknown or providers}; choose from {', '.join(PROVIDERS)}")
    if len(set(providers)) != len(providers):
        raise ProviderUnavailable(f"providers {providers} names one twice")
    if "qnn-htp" in providers and (providers[0] != "qnn-htp" or set(providers) - {"qnn-htp", "cpu"}):
        raise ProviderUnavailable(f"providers {providers}: qnn-htp comes first, optionally followed by cpu only")
    return providers


def session_options(ort, num_threads: int = 0, spin: bool = False):
    """One inference at a time, `num_threads` intra-op threads (0: ONNX Runtime's default) that do not spin.

    Spinning workers make a busy machine's latency collapse, as torch's OpenMP threads do (DESIGN.md section 11).
    """
    so = ort.SessionOptions()
    so.intra_op_num_threads = max(0, int(num_threads))
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    so.log_severity_level = 3
    return so


def _add_htp(ort, so, htp: HtpTarget, allow_cpu: bool) -> None:
    so.add_provider_for_devices(qnn_ep_devices(ort), htp.provider_options())
    if not allow_cpu:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")


def open_session(
    path: str | Path,
    providers: list[str] | tuple[str, ...] = ("cpu",),
    *,
    num_threads: int = 0,
    htp: HtpTarget | None = None,
):
    """An InferenceSession of `path` on `providers`, or a clear error saying why it cannot be had here."""
    ort = import_onnxruntime()
    providers = check_providers(providers)
    so = session_options(ort, num_threads)
    if providers[0] == "qnn-htp":
        if htp is None:
            raise ProviderUnavailable(f"{path}: qnn-htp runs an HTP export; export it with --target qnn-onnx")
        _add_htp(ort, so, htp, allow_cpu="cpu" in providers)
        return _create(ort, path, so, htp=htp, strict="cpu" not in providers)
    available = ort.get_available_providers()
    for p in providers:
        if ORT_PROVIDER[p] not in available:
            raise ProviderUnavailable(
                f"providers: {p} needs {ORT_PROVIDER[p]}, which onnxruntime {ort.__version__} here does not have "
                f"(it has {', '.join(available)}); {GPU_HINT.get(p, ONNX_EXTRA)}"
            )
    session = _create(ort, path, so, providers=[ORT_PROVIDER[p] for p in providers])
    # onnxruntime-gpu lists its GPU providers even without a GPU and silently falls back to the CPU: refuse that.
    if ORT_PROVIDER[providers[0]] not in session.get_providers():
        raise ProviderUnavailable(
            f"providers: {providers[0]} could not start ({ORT_PROVIDER[providers[0]]} is not in the session's "
            f"{session.get_providers()}): no usable GPU or driver; {GPU_HINT.get(providers[0], '')}"
        )
    return session


def _create(ort, path, so, *, providers=None, htp: HtpTarget | None = None, strict: bool = False):
    try:
        if providers is None:
            return ort.InferenceSession(str(path), sess_options=so)
        return ort.InferenceSession(str(path), sess_options=so, providers=providers)
    except Exception as exc:  # ONNX Runtime raises its own Fail/InvalidGraph/... types
        detail = str(exc).splitlines()[0][:500]
        if htp is not None and strict and "fallback to CPU EP has been explicitly disabled" in str(exc):
            off = htp_placement(path, htp)["cpu_ops"]
            raise OnnxModelError(
                f"{path}: not every operator runs on the HTP ({htp.soc}); on the CPU would be: "
                + ", ".join(f"{op} x{n}" for op, n in sorted(off.items()))
                + "; allow it with providers [qnn-htp, cpu] or rewrite those operators"
            ) from exc
        raise OnnxModelError(f"{path}: ONNX Runtime cannot load it: {detail}") from exc


def compile_htp(source: str | Path, target: str | Path, htp: HtpTarget, allow_cpu: bool = False) -> float:
    """Compile `source` for the HTP into `target` (EPContext model, binary embedded); returns the seconds it took."""
    ort = import_onnxruntime()
    so = session_options(ort, 1)
    _add_htp(ort, so, htp, allow_cpu)
    target = Path(target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.", suffix=".onnx")
    os.close(fd)
    start = time.perf_counter()
    try:
        Path(tmp).unlink()  # the compiler refuses to overwrite
        try:
            ort.ModelCompiler(so, str(source), embed_compiled_data_into_model=True).compile_to_file(tmp)
        except Exception as exc:
            if not allow_cpu and "CPU" in str(exc):
                off = htp_placement(source, htp)["cpu_ops"]
                raise OnnxModelError(
                    f"{source}: not every operator runs on the HTP ({htp.soc}); on the CPU would be: "
                    + ", ".join(f"{op} x{n}" for op, n in sorted(off.items()))
                ) from exc
            raise OnnxModelError(f"{source}: the QNN EP cannot compile it for {htp.soc}: {exc}") from exc
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return time.perf_counter() - start


def htp_placement(source: str | Path, htp: HtpTarget) -> dict[str, Any]:
    """Where each operator of `source` runs: the QNN partitions and the ops left to the CPU (compiled with fallback)."""
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        compiled = Path(tmp) / "placement.onnx"
        compile_htp(source, compiled, htp, allow_cpu=True)
        graph = onnx.load(compiled, load_external_data=False).graph
    ops = collections.Counter(n.op_type for n in graph.node)
    partitions = ops.pop("EPContext", 0)
    total = sum(1 for _ in onnx.load(source, load_external_data=False).graph.node)
    return {"qnn_partitions": partitions, "cpu_ops": dict(ops), "source_nodes": total}


def context_file(method: str) -> str:
    return f"{method}.qnn_ctx.onnx"


class HtpCache:
    """Compiled HTP graphs of one export folder, described by qnn_cache.json (see the module docstring)."""

    def __init__(self, folder: str | Path, htp: HtpTarget) -> None:
        self.folder, self.htp = Path(folder), htp
        self.manifest_path = self.folder / CACHE_MANIFEST

    def _identity(self) -> dict[str, Any]:
        # What a context binary is tied to: the QNN runtime that compiled it, the SoC, the precision.
        return {"onnxruntime_qnn": qnn_version(), "soc": self.htp.soc, "precision": self.htp.precision}

    def manifest(self) -> dict[str, Any]:
        if not self.manifest_path.exists():
            return {"format": CACHE_FORMAT, **self._identity(), "methods": {}}
        try:
            data = json.loads(self.manifest_path.read_text())
            if data.get("format") != CACHE_FORMAT or not isinstance(data.get("methods"), dict):
                raise ValueError(f"format {data.get('format')!r}")
        except (ValueError, UnicodeDecodeError) as exc:
            raise OnnxModelError(
                f"{self.manifest_path}: corrupt QNN cache manifest ({exc}); delete it and the *.qnn_ctx.onnx files "
                "next to it to recompile them"
            ) from exc
        if {k: data.get(k) for k in self._identity()} != self._identity():
            log.warning("%s: compiled for %s, now %s: recompiling", self.manifest_path, data, self._identity())
            return {"format": CACHE_FORMAT, **self._identity(), "methods": {}}
        return data

    def compile(self, method: str, source: Path, source_sha256: str) -> dict[str, Any]:
        """Compile `method` into the cache (export time, or a first start); returns its manifest entry."""
        target = self.folder / context_file(method)
        seconds = compile_htp(source, target, self.htp)
        entry = {"file": target.name, **file_digest(target), "source_sha256": source_sha256, "compile_s": seconds}
        manifest = self.manifest()
        manifest["methods"][method] = entry
        write_atomic(self.manifest_path, (json.dumps(manifest, indent=2) + "\n").encode())
        return entry

    def session(self, method: str, source: Path, source_sha256: str, allow_cpu: bool = False):
        """(session, "loaded" | "compiled" | "compiled, not cached") for `method`, compiling only when needed."""
        from omni_ros.export.sidecar import verify_file

        entry = self.manifest()["methods"].get(method)
        status = "loaded"
        if entry is None or entry.get("source_sha256") != source_sha256 or not (self.folder / entry["file"]).exists():
            if not os.access(self.folder, os.W_OK):
                log.warning("%s is read-only: compiling %s for the HTP without caching it", self.folder, method)
                return open_session(source, self._providers(allow_cpu), htp=self.htp), "compiled, not cached"
            entry, status = self.compile(method, source, source_sha256), "compiled"
        path = self.folder / entry["file"]
        try:
            verify_file(path, entry["sha256"], int(entry["bytes"]), OnnxModelError)
        except OnnxModelError as exc:
            raise OnnxModelError(
                f"corrupt QNN cache: {exc} against {CACHE_MANIFEST}; delete {path.name} to recompile it"
            ) from exc
        try:
            return open_session(path, self._providers(allow_cpu), htp=self.htp), status
        except OnnxModelError as exc:
            raise OnnxModelError(f"QNN cache {path} cannot be loaded ({exc}); delete it to recompile it") from exc

    @staticmethod
    def _providers(allow_cpu: bool) -> list[str]:
        return ["qnn-htp", "cpu"] if allow_cpu else ["qnn-htp"]
