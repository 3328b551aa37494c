"""Policy -> one `.pte` with named methods for a target backend, plus its sidecar JSON."""

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
from omni_ros.export.methods import stage_plan
from omni_ros.export.qnn import QnnOptions, find_qnn_sdk, lower_qnn, qnn_plan
from omni_ros.export.quantize import QUANTIZE, quantize_model
from omni_ros.export.report import delegation_report
from omni_ros.export.sidecar import Sidecar, file_sha256, sidecar_path, write_atomic, write_sidecar
from omni_ros.policy.normalize import NormStats

TARGETS = ("xnnpack", "qnn", "cuda")
log = logging.getLogger(__name__)


@dataclass
class ExportResult:
    pte: Path
    sidecar: Path
    report: dict[str, Any]
    seconds: float
    bytes: int
    timings: dict[str, float] = field(default_factory=dict)


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
) -> ExportResult:
    """Export `methods` (default: all of the model family's) of `model` to `out` (.pte) and write `out`.json.

    The model is copied, switched to its export forms and quantized; the caller's model is untouched.
    """
    check_export_target(target, quantize, qnn)
    cfg: Any = model.cfg
    plan = stage_plan(cfg)
    methods = tuple(methods or plan.methods)
    plan.check_methods(methods)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    steps = num_steps or cfg.num_steps
    start = time.perf_counter()
    timings: dict[str, float] = {}
    work = use_export_forms(copy.deepcopy(model).float().eval())
    target_options: dict[str, Any] = {}
    with warnings.catch_warnings():
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
            sigs = plan.signatures(cfg)
            programs = {}
            for method in methods:
                t0 = time.perf_counter()
                inputs = tuple(x.to(device) for x in plan.example_inputs(sigs[method], cfg))
                with torch.no_grad():
                    programs[method] = torch.export.export(plan.module(work, method, steps), inputs)
                timings[f"export_{method}_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            if target == "cuda":
                from omni_ros.export.cuda import lower_cuda

                edge = lower_cuda(programs)
            else:
                from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
                from executorch.exir import to_edge_transform_and_lower

                edge = to_edge_transform_and_lower(programs, partitioner=[XnnpackPartitioner()])
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
        methods={m: plan.signatures(cfg)[m] for m in methods},
        pte_sha256=file_sha256(out),
        pte_bytes=out.stat().st_size,
        num_steps=steps,
        delegation=report,
        tokenizer_file=tokenizer_name,
        target_options=target_options,
    )
    sidecar.versions["omni_ros"] = _omni_version()
    write_sidecar(out, sidecar)
    seconds = time.perf_counter() - start
    log.info("exported %s (%s, %s) in %.1f s", out, target, quantize, seconds)
    return ExportResult(out, sidecar_path(out), report, seconds, out.stat().st_size, timings)


def export_checkpoint(checkpoint: str | Path, out: str | Path, tokenizer: Any = None, **kwargs: Any) -> ExportResult:
    """Export a checkpoint directory of any layout omni_ros reads (weights, norm stats, its tokenizer file)."""
    from omni_ros.policy import families, layouts
    from omni_ros.policy.layouts.omni import load_checkpoint

    checkpoint = Path(checkpoint)
    omni = layouts.detect(checkpoint) == "omni_ros"
    if omni:
        model, stats, _ = load_checkpoint(checkpoint)
    else:  # a reference checkpoint (LeRobot, openpi): its family's model, weights memory-mapped
        read = layouts.read(checkpoint, tokenizer=tokenizer)
        family = families.get(read.family)
        model, stats = layouts.build_model(read, lambda: family.build_model(read.config)), read.norm_stats
    tokenizer_file = None
    if model.cfg.tokenizer.kind not in ("bytes", "words") and model.cfg.tokenizer.path:
        tokenizer_file = Path(model.cfg.tokenizer.path)
        # omni_ros checkpoints name it relative to their folder; a reference layout names the file it found.
        tokenizer_file = checkpoint / tokenizer_file if omni and not tokenizer_file.is_absolute() else tokenizer_file
    kwargs.setdefault("name", checkpoint.name)
    return export_policy(model, stats, out, tokenizer_file=tokenizer_file, **kwargs)


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
