"""Qualcomm (QNN / HTP) lowering: SDK check, compile plan and specs, PT2E quantization, QnnPartitioner.

Lowering for the Hexagon NPU needs Qualcomm's AI Engine Direct (QNN) SDK on the
exporting machine. ExecuTorch, when `QNN_SDK_ROOT` is unset, tries to download
the SDK from the internet; `find_qnn_sdk` runs before anything imports the
ExecuTorch QNN code, so a machine without the SDK gets a clear error and no
network access. Everything before that boundary (options, the compile plan
with its static shapes, calibration inputs) is plain Python and testable here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omni_ros.errors import OmniRosError
from omni_ros.policy.families import method_module, signatures, stage_plan
from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.methods import MethodSignature
from omni_ros.policy.pipeline import StageClock

# Snapdragon SoCs with an HTP (Hexagon tensor processor) and its architecture version.
SOC_HTP_ARCH = {
    "SM8450": "V69",  # Snapdragon 8 Gen 1
    "SM8475": "V69",  # Snapdragon 8+ Gen 1
    "SM8550": "V73",  # Snapdragon 8 Gen 2
    "SM8650": "V75",  # Snapdragon 8 Gen 3
    "SM8750": "V79",  # Snapdragon 8 Elite
    "SM8850": "V81",  # Snapdragon 8 Elite Gen 5
    "SC8380XP": "V73",  # Snapdragon X Elite
    "QCS9100": "V73",  # robotics / IoT
    "QCM6490": "V68",  # robotics RB3 Gen 2
    "SA8295": "V68",  # automotive
}
# QNN's SoC model numbers (the `soc_model` of the HTP backend and of ONNX Runtime's QNN EP), the same as
# ExecuTorch's QcomChipset values. The HTP compiles for one SoC: a context binary runs only there.
SOC_MODEL = {
    "SM8450": 36,
    "SM8475": 42,
    "SM8550": 43,
    "SM8650": 57,
    "SM8750": 69,
    "SM8850": 87,
    "SC8380XP": 60,
    "QCS9100": 77,
    "QCM6490": 93,
    "SA8295": 39,
}
# The quantization each precision needs: the HTP runs integer graphs; fp16 needs a premium SoC (V73+).
PRECISIONS = {"8a8w": "use_8a8w", "16a8w": "use_16a8w", "fp16": None}
FP16_MIN_ARCH = 73

HTP_LIBRARY = Path("lib") / "x86_64-linux-clang" / "libQnnHtp.so"
INSTALL_HINT = (
    "install the Qualcomm AI Engine Direct (QNN) SDK (https://www.qualcomm.com/developer/software/"
    "qualcomm-ai-engine-direct-sdk, version 2.3x) and export QNN_SDK_ROOT=/path/to/qairt/<version>; "
    "omni_ros never downloads it"
)


class QnnSdkError(OmniRosError, RuntimeError):
    """The Qualcomm SDK needed to lower for QNN is not installed or not configured."""


@dataclass(frozen=True)
class QnnOptions:
    soc: str = "SM8650"
    precision: str = "8a8w"
    # Calibration batches for the activation ranges of a quantized graph.
    calibration_samples: int = 4

    def validate(self) -> None:
        if self.soc not in SOC_HTP_ARCH:
            raise ValueError(f"unknown QNN SoC '{self.soc}'; choose one of {', '.join(sorted(SOC_HTP_ARCH))}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown QNN precision '{self.precision}'; choose one of {', '.join(PRECISIONS)}")
        if self.precision == "fp16" and int(SOC_HTP_ARCH[self.soc][1:]) < FP16_MIN_ARCH:
            raise ValueError(f"{self.soc} (HTP {SOC_HTP_ARCH[self.soc]}) has no fp16 HTP; use 8a8w or 16a8w")
        if self.calibration_samples < 1:
            raise ValueError("calibration_samples must be at least 1")


@dataclass(frozen=True)
class QnnSdk:
    root: Path
    htp_library: Path


def find_qnn_sdk(env: Mapping[str, str] | None = None) -> QnnSdk:
    """The SDK named by QNN_SDK_ROOT, with its host HTP library; a clear error otherwise. Touches no network."""
    env = os.environ if env is None else env
    root = env.get("QNN_SDK_ROOT", "")
    if not root:
        raise QnnSdkError(f"QNN lowering needs the Qualcomm SDK but QNN_SDK_ROOT is not set: {INSTALL_HINT}")
    path = Path(root)
    if not path.is_dir():
        raise QnnSdkError(f"QNN_SDK_ROOT={root} is not a directory: {INSTALL_HINT}")
    library = path / HTP_LIBRARY
    if not library.is_file():
        raise QnnSdkError(f"QNN_SDK_ROOT={root} has no {HTP_LIBRARY} (incomplete SDK?): {INSTALL_HINT}")
    return QnnSdk(path, library)


def qnn_plan(cfg: Any, options: QnnOptions, methods: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """What a QNN lowering will do, without the SDK: target, precision, quantization and static shapes per method."""
    options.validate()
    sigs = signatures(cfg)
    return {
        "soc": options.soc,
        "htp_arch": SOC_HTP_ARCH[options.soc],
        "backend": "HTP",
        "precision": options.precision,
        "quantization": "none (fp16 HTP)" if PRECISIONS[options.precision] is None else f"PT2E {options.precision}",
        "calibration_samples": 0 if PRECISIONS[options.precision] is None else options.calibration_samples,
        # The HTP compiles one fixed graph per method: every dimension is static.
        "methods": {name: sigs[name].to_dict() for name in methods},
        "options": asdict(options),
    }


def random_model_inputs(cfg: Any, samples: int, gen: torch.Generator) -> list[ModelInputs]:
    """Random observations as model inputs (batch 1): pixels in [-1, 1], a prompt of random length, a state.

    Shapes come from the family's fused `sample` signature (images, image_masks, tokens, token_mask, state, noise).
    """
    images, image_masks, tokens_spec, _, state, _ = stage_plan(cfg).signatures(cfg)["sample"].inputs
    out = []
    for _ in range(samples):
        tokens = torch.randint(0, min(cfg.vocab_size, 256), tokens_spec.shape, generator=gen)
        token_mask = torch.zeros(tokens.shape, dtype=torch.bool)
        token_mask[:, : 1 + int(torch.randint(1, tokens.shape[1], (1,), generator=gen))] = True
        out.append(
            ModelInputs(
                images=torch.rand(images.shape, generator=gen) * 2 - 1,
                image_masks=torch.ones(image_masks.shape, dtype=torch.bool),
                tokens=tokens,
                token_mask=token_mask,
                state=torch.randn(state.shape, generator=gen),
            )
        )
    return out


def calibration_inputs(
    model: nn.Module,
    methods: list[str] | tuple[str, ...],
    samples: int,
    seed: int = 0,
    inputs: list[ModelInputs] | None = None,
) -> dict[str, list[tuple[torch.Tensor, ...]]]:
    """Per method, input tuples produced by running the eager model on observations.

    `inputs` are model inputs of real observations (batch 1, `omni_ros.export.calibration`); without them,
    `samples` random observations. Each stage is calibrated on what the stage before it really produces
    (image tokens, a KV cache, the states of the Euler loop), not on unrelated random tensors: the family's
    own staged inference runs over the eager stage modules and every call is recorded.
    """
    cfg: Any = model.cfg
    plan = stage_plan(cfg)
    sigs: dict[str, MethodSignature] = plan.signatures(cfg)
    modules = {name: plan.module(model, name, cfg.num_steps) for name in plan.staged}
    out: dict[str, list[tuple[torch.Tensor, ...]]] = {name: [] for name in methods}
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for observed in inputs if inputs is not None else random_model_inputs(cfg, samples, gen):
            noise = torch.randn(sigs["sample"].inputs[-1].shape, generator=gen)
            recorded: dict[str, list[tuple[torch.Tensor, ...]]] = {name: [] for name in plan.methods}

            def run(method: str, tensors: list[torch.Tensor], recorded=recorded) -> list[torch.Tensor]:
                recorded[method].append(tuple(tensors))
                result = modules[method](*tensors)
                return list(result) if isinstance(result, tuple) else [result]

            plan.run_staged(cfg, run, observed, noise, cfg.num_steps, StageClock())
            recorded["sample"] = [(*plan.fused_inputs(cfg, observed), noise)]
            for name in methods:
                out[name].extend(recorded[name])
    return out


def lower_qnn(model: nn.Module, methods: list[str] | tuple[str, ...], options: QnnOptions, num_steps: int):
    """Quantize (PT2E, calibrated) and lower `methods` of `model` with the QnnPartitioner; returns the edge manager.

    The SDK is checked first: nothing below imports ExecuTorch's QNN code without it.
    """
    options.validate()
    find_qnn_sdk()
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
        to_edge_transform_and_lower_to_qnn,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quant = PRECISIONS[options.precision]
    specs = generate_qnn_executorch_compiler_spec(
        soc_model=getattr(QcomChipset, options.soc),
        backend_options=generate_htp_compiler_spec(use_fp16=quant is None),
    )
    calibration = calibration_inputs(model, methods, options.calibration_samples if quant else 1)
    modules, inputs = {}, {}
    for name in methods:
        example = calibration[name][0]
        graph = torch.export.export(method_module(model, name, num_steps), example).module()
        if quant is not None:
            quantizer = QnnQuantizer()
            quantizer.set_default_quant_config(getattr(QuantDtype, quant), is_linear_per_channel=True)
            graph = prepare_pt2e(graph, quantizer)
            with torch.no_grad():
                for batch in calibration[name]:
                    graph(*batch)
            graph = convert_pt2e(graph)
        modules[name], inputs[name] = graph, example
    return to_edge_transform_and_lower_to_qnn(modules, inputs, {name: specs for name in methods})
