"""Policy -> one `.pte` with named methods for a target backend, plus its sidecar JSON.

The ONNX targets (onnx, qnn-onnx) write a folder of ONNX graphs instead (`omni_ros.export.onnx_export`).
"""

from __future__ import annotations

import copy
import logging
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omni_ros.export.forms import use_export_forms
from omni_ros.export.qnn import QnnOptions, find_qnn_sdk, lower_qnn, qnn_plan
from omni_ros.export.report import delegation_report
from omni_ros.export.rtc_step import NAME as GUIDED_STEP
from omni_ros.export.rtc_step import GuidedStep, guided_signature
from omni_ros.export.sidecar import Sidecar, file_sha256, sidecar_path, write_atomic, write_sidecar
from omni_ros.lowering import cia_ops_collected_once, lower_to_xnnpack, provenance_shared
from omni_ros.policy.families import stage_plan
from omni_ros.policy.methods import StagePlan
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.quantize import QUANTIZE, quantize_model

TARGETS = ("xnnpack", "qnn", "cuda", "onnx", "qnn-onnx")
log = logging.getLogger(__name__)


@dataclass
class ExportResult:
    pte: Path
    sidecar: Path
    report: dict[str, Any]
    seconds: float
    bytes: int
    timings: dict[str, float] = field(default_factory=dict)


# The families ExecuTorch's QNN delegate (`--target qnn`) exports; the others reach the HTP through qnn-onnx.
QNN_PTE_FAMILIES = ("pi0", "smolvla")
# (target, quantize) pairs whose programs can hold the guided RTC step (a traced backward pass).
GUIDED_TARGETS = (("xnnpack", "none"), ("xnnpack", "int8-dynamic"), ("cuda", "none"))


def check_export_target(target: str, quantize: str, qnn: QnnOptions | None = None) -> None:
    """Everything that can be refused before tracing a model: unknown options, a missing SDK or GPU."""
    if target not in TARGETS:
        raise ValueError(f"unknown export target '{target}'; choose one of {', '.join(TARGETS)}")
    if quantize not in QUANTIZE:
        raise ValueError(f"unknown quantization '{quantize}'; choose one of {', '.join(QUANTIZE)}")
    if target == "qnn":
        (qnn or QnnOptions()).validate()
        if quantize != "none":
            raise ValueError("QNN quantizes with its own calibrated recipe: use --qnn-precision, not --quantize")
        find_qnn_sdk()
    elif target in ("onnx", "qnn-onnx"):
        if quantize != "none":
            raise ValueError(f"--quantize is for xnnpack; --target {target} takes --qnn-precision (qnn-onnx) or none")
        from omni_ros.export.ort_session import import_onnxruntime, qnn_ep_devices

        ort = import_onnxruntime()
        if target == "qnn-onnx":
            (qnn or QnnOptions()).validate()
            qnn_ep_devices(ort)  # the HTP compiler: a missing qnn extra fails here, before any tracing
    elif target == "cuda":
        from omni_ros.export.cuda import check_cuda_export

        if quantize != "none":
            raise ValueError("--target cuda exports float32 only; use --quantize none")
        check_cuda_export()


def export_policy(
    model: nn.Module,
    norm_stats: NormStats,
    out: str | Path,
    *,
    target: str = "xnnpack",
    quantize: str = "none",
    methods: tuple[str, ...] | list[str] | None = None,
    num_steps: int | None = None,
    name: str | None = None,
    tokenizer_file: str | Path | None = None,
    qnn: QnnOptions | None = None,
    calibration: str = "auto",
    rtc: bool = False,
) -> ExportResult:
    """Export `methods` (default: all of the model family's) of `model` to `out` (.pte) and write `out`.json.
    `rtc` adds the guided real-time-chunking step (xnnpack: float32 or int8-dynamic; cuda: float32).

    The model is copied, switched to its export forms and quantized; the caller's model is untouched.
    For the ONNX targets `out` is a folder; qnn-onnx calibrates on `calibration` (auto, sim, spec, random or a dataset).
    """
    cfg: Any = model.cfg
    family, plan = getattr(cfg, "family", "pi0"), stage_plan(cfg)
    if target == "qnn" and family not in QNN_PTE_FAMILIES:
        # Its PT2E calibration draws pi0-layout inputs and runs the velocity-form Euler loop (qnn.calibration_inputs).
        other = "--target onnx" if plan.token_decoder else "--target qnn-onnx (the HTP through ONNX Runtime's QNN EP)"
        raise ValueError(
            f"--target qnn exports {' and '.join(QNN_PTE_FAMILIES)} models; export a {family} model with {other}"
        )
    check_export_target(target, quantize, qnn)
    methods = tuple(methods or plan.methods)
    if rtc and GUIDED_STEP not in methods:
        methods = (*methods, GUIDED_STEP)
    plan.check_methods(methods)
    if GUIDED_STEP in methods and (target, quantize) not in GUIDED_TARGETS:
        raise ValueError(
            f"method {GUIDED_STEP} (guided real-time chunking) is exported for xnnpack (float32 or int8-dynamic) and "
            "cuda (float32) only; QNN, ONNX and other quantizations use hard prefix inpainting (control.rtc.method: "
            "inpaint)"
        )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    steps = num_steps or cfg.num_steps
    start = time.perf_counter()
    if target in ("onnx", "qnn-onnx"):
        return _export_onnx(model, norm_stats, out, target, methods, steps, name, tokenizer_file, qnn, calibration)
    timings: dict[str, float] = {}
    work = use_export_forms(copy.deepcopy(model).float().eval())
    # A quantized guided step is traced in float32 and quantized after (rtc_step.py says why).
    float_work = copy.deepcopy(work) if GUIDED_STEP in methods and quantize != "none" else work
    target_options: dict[str, Any] = {}
    with warnings.catch_warnings(), provenance_shared():
        # torch.export and the lowering passes are chatty about internals we do not control.
        warnings.simplefilter("ignore")
        if target == "qnn":
            qnn = qnn or QnnOptions()
            target_options = qnn_plan(cfg, qnn, methods)
            edge = lower_qnn(work, methods, qnn, steps)
        else:
            quantize_model(work, quantize)
            device = "cuda" if target == "cuda" else "cpu"
            work.to(device)
            sigs = _signatures(plan, cfg, methods)
            programs = {}
            for method in methods:
                t0 = time.perf_counter()
                inputs = tuple(x.to(device) for x in plan.example_inputs(sigs[method], cfg))
                # (check_methods allows guided_step for the families whose plan lists it as optional)
                if method == GUIDED_STEP:
                    module: nn.Module = GuidedStep(float_work, plan, inputs, quantize=quantize)
                else:
                    module = plan.module(work, method, steps)
                with torch.no_grad():
                    programs[method] = torch.export.export(module, inputs)
                timings[f"export_{method}_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            if target == "cuda":
                from omni_ros.export.cuda import lower_cuda

                with cia_ops_collected_once():
                    edge = lower_cuda(programs)
            else:
                edge = lower_to_xnnpack(programs)
            timings["lower_s"] = time.perf_counter() - t0
        report = delegation_report(edge, methods)
        t0 = time.perf_counter()
        buffer = edge.to_executorch().buffer
        timings["to_executorch_s"] = time.perf_counter() - t0
    write_atomic(out, buffer)
    tokenizer_name = None
    if tokenizer_file is not None:
        tokenizer_name = f"{out.name}.tokenizer{Path(tokenizer_file).suffix}"
        shutil.copyfile(tokenizer_file, out.parent / tokenizer_name)
    sidecar = Sidecar(
        name=name or cfg.name,
        target=target,
        quantize=quantize if target != "qnn" else (qnn or QnnOptions()).precision,
        model=cfg,
        norm_stats=norm_stats,
        methods={m: _signatures(plan, cfg, methods)[m] for m in methods},
        pte_sha256=file_sha256(out),
        pte_bytes=out.stat().st_size,
        num_steps=steps,
        delegation=report,
        tokenizer_file=tokenizer_name,
        target_options=target_options,
    )
    sidecar.model = bundle_fast_tokenizer(cfg, out.parent, f"{out.name}.fast_tokenizer")
    sidecar.versions["omni_ros"] = _omni_version()
    write_sidecar(out, sidecar)
    seconds = time.perf_counter() - start
    log.info("exported %s (%s, %s) in %.1f s", out, target, quantize, seconds)
    return ExportResult(out, sidecar_path(out), report, seconds, out.stat().st_size, timings)


def bundle_fast_tokenizer(cfg: Any, folder: Path, name: str) -> Any:
    """A pi0-FAST config's FAST action tokenizer copied to `folder`/`name`, and the config naming it there
    (relative: the runtime reads it beside the program); any other config as it is."""
    from dataclasses import replace

    fast = getattr(cfg, "fast", None)
    if fast is None or not fast.path:
        return cfg
    from omni_ros.policy.pi0_fast.fast import FILES

    dest = folder / name
    dest.mkdir(parents=True, exist_ok=True)
    for file in FILES:  # what the detokenizer reads (read_fast_folder checked they exist when the model loaded)
        shutil.copyfile(Path(fast.path) / file, dest / file)
    return replace(cfg, fast=replace(fast, path=name))


def _signatures(plan: StagePlan, cfg: Any, methods: tuple[str, ...] | list[str]) -> dict[str, Any]:
    sigs = plan.signatures(cfg)
    if GUIDED_STEP in methods:
        sigs[GUIDED_STEP] = guided_signature(sigs["denoise_step"], cfg.action_horizon, plan.guidance)
    return sigs


def _export_onnx(model, norm_stats, out, target, methods, steps, name, tokenizer_file, qnn, calibration):
    from dataclasses import replace

    from omni_ros.export.onnx_export import export_onnx
    from omni_ros.export.sidecar import ONNX_SIDECAR
    from omni_ros.policy.tokenizer import make_tokenizer

    start = time.perf_counter()
    tokenizer_cfg = model.cfg.tokenizer
    if tokenizer_file is not None:
        tokenizer_cfg = replace(tokenizer_cfg, path=str(tokenizer_file))
    sidecar, timings = export_onnx(
        model,
        norm_stats,
        out,
        target=target,
        methods=tuple(methods),
        num_steps=steps,
        name=name or model.cfg.name,
        tokenizer_file=tokenizer_file,
        qnn=qnn,
        calibration=calibration,
        tokenizer=make_tokenizer(tokenizer_cfg),
    )
    seconds = time.perf_counter() - start
    size = sum(d["bytes"] for d in sidecar.files.values())
    log.info("exported %s (%s, %s) in %.1f s", out, target, sidecar.quantize, seconds)
    return ExportResult(out, out / ONNX_SIDECAR, sidecar.delegation, seconds, size, timings)


def export_checkpoint(
    checkpoint: str | Path, out: str | Path, tokenizer: str | Path | None = None, **kwargs: Any
) -> ExportResult:
    """Export a checkpoint folder of any layout (weights, norm stats and its tokenizer file if any)."""
    from omni_ros.policy import families, layouts

    path = Path(checkpoint).expanduser().resolve()  # the layout names its tokenizer relative to the folder
    read = layouts.read(path, tokenizer=tokenizer)
    model = layouts.build_model(read, lambda: families.get(read.family).build_model(read.config))
    tokenizer_file = None
    if read.config.tokenizer.kind not in ("bytes", "words") and read.config.tokenizer.path:
        tokenizer_file = Path(read.config.tokenizer.path)
        tokenizer_file = tokenizer_file if tokenizer_file.is_absolute() else path / tokenizer_file
    kwargs.setdefault("name", path.name)
    return export_policy(model, read.norm_stats, out, tokenizer_file=tokenizer_file, **kwargs)


def export_preset(preset_name: str, out: str | Path, weights_seed: int = 0, **kwargs: Any) -> ExportResult:
    """Export a built-in architecture with seeded random weights (the same weights `from_preset` builds)."""
    from omni_ros.policy.pi0.presets import build_preset

    overrides = {k: kwargs.pop(k) for k in ("camera_names", "state_dim", "action_dim") if k in kwargs}
    model = build_preset(preset_name, weights_seed, **overrides)
    cfg = model.cfg
    kwargs.setdefault("name", f"{preset_name} (random weights)")
    return export_policy(model, NormStats.identity(cfg.state_dim, cfg.action_dim), out, **kwargs)


def _omni_version() -> str:
    from omni_ros import __version__

    return __version__
