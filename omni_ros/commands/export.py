"""`omni-ros export`: a checkpoint or preset -> one ExecuTorch `.pte` (+ sidecar JSON) for XNNPACK, QNN or CUDA,
or a folder of ONNX graphs for ONNX Runtime (onnx) and Qualcomm's HTP through its QNN EP (qnn-onnx)."""

from __future__ import annotations

import argparse
import json

from omni_ros.typed_config import ConfigError

# --precision -> the xnnpack recipe that computes in it (an exported program has no bf16 kernels).
PRECISION_RECIPES = {"fp32": "none", "int8": "int8-dynamic"}


def _quantize_for(args: argparse.Namespace) -> str:
    """`--quantize` from `--precision` (the same words as policy.precision), refusing the two when they disagree."""
    if args.precision is None:
        return args.quantize or "none"
    precision = args.precision
    if precision == "bf16":
        raise ConfigError(
            "export --precision bf16: exported programs have no bf16 GEMMs here; serve the checkpoint with the torch "
            "backend and policy.precision bf16, or export --precision int8 / fp32"
        )
    if precision == "auto":
        from omni_ros.cpu_features import detect

        # What auto runs on this CPU, in a program: int8 where it has an int8 dot product, else float32.
        precision = "int8" if args.target == "xnnpack" and detect().int8_dot else "fp32"
        print(f"export --precision auto: {precision} on this CPU ({detect().model})")
    if precision == "int8" and args.target != "xnnpack":
        raise ConfigError(
            f"export --precision int8: int8-dynamic GEMMs are exported for --target xnnpack; --target {args.target} "
            "takes --qnn-precision (qnn, qnn-onnx) or float32"
        )
    recipe = PRECISION_RECIPES[precision]
    if args.quantize not in (None, recipe):
        raise ConfigError(f"export: --precision {args.precision} means --quantize {recipe}, not {args.quantize}")
    return recipe


def run(args: argparse.Namespace) -> int:
    import logging

    from omni_ros.export.exporter import check_export_target, export_checkpoint, export_preset
    from omni_ros.export.qnn import QnnOptions
    from omni_ros.export.report import format_report

    # Tracing, calibrating and compiling take minutes on big models: say what is happening (one line per step).
    logging.getLogger("omni_ros.export").setLevel(logging.INFO)
    onnx = args.target in ("onnx", "qnn-onnx")
    # int16 activations are what transformers need on the HTP through ONNX; ExecuTorch's QNN recipe defaults to 8a8w.
    precision = args.qnn_precision or ("16a8w" if args.target == "qnn-onnx" else "8a8w")
    qnn = QnnOptions(soc=args.qnn_soc, precision=precision, calibration_samples=args.calibration_samples)
    methods = tuple(args.methods) if args.methods else None  # None: every method of the model's family
    args.quantize = _quantize_for(args)
    try:
        # Refuse a missing SDK/GPU or a bad option before loading and tracing anything.
        check_export_target(args.target, args.quantize, qnn)
    except ValueError as exc:
        raise ConfigError(f"export: {exc}") from exc
    common = {
        "target": args.target,
        "quantize": args.quantize,
        "methods": methods,
        "num_steps": args.num_steps,
        "qnn": qnn,
    }
    if args.rtc:
        common["rtc"] = True
    if onnx:
        common["calibration"] = args.calibration
    if args.checkpoint:
        result = export_checkpoint(args.checkpoint, args.out, tokenizer=args.tokenizer, **common)
    else:
        dims = {"camera_names": args.camera, "state_dim": args.state_dim, "action_dim": args.action_dim}
        result = export_preset(args.preset, args.out, **{k: v for k, v in dims.items() if v}, **common)
    if args.json:
        summary = {
            "pte": str(result.pte),
            "sidecar": str(result.sidecar),
            "bytes": result.bytes,
            "seconds": round(result.seconds, 1),
            "delegation": result.report,
        }
        print(json.dumps(summary, indent=2))
        return 0
    print(f"wrote {result.pte} ({result.bytes / 1e6:.1f} MB) and {result.sidecar.name} in {result.seconds:.0f} s")
    if onnx:
        from omni_ros.export.onnx_export import format_onnx_report

        print(format_onnx_report(result.report))
    else:
        print(format_report(result.report))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a policy to an ExecuTorch .pte (xnnpack, qnn, cuda) or ONNX (onnx, qnn-onnx)",
        description="Export the policy's stages (pi0: encode_images, prefill, denoise_step; SmolVLA: encode_image "
        "per camera, prefill, denoise_step; X-VLA: encode, denoise_step) and the fused sampling loop (sample) as "
        "named methods of one .pte, lowered for a backend, plus a sidecar <out>.json; or, for --target onnx / "
        "qnn-onnx (qnn-onnx: the pi0 family), as one ONNX graph per method in the folder --out with its sidecar "
        "omni_ros.json. qnn-onnx quantizes for Qualcomm's HTP (calibrated on --calibration) and compiles the "
        "graphs for --qnn-soc (the qnn extra: onnxruntime-qnn).",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--checkpoint",
        help="checkpoint folder: omni_ros's, a LeRobot pi0 / pi05 / SmolVLA / pi0-FAST / X-VLA folder or an openpi "
        "PyTorch one",
    )
    source.add_argument("--preset", default="small", help="built-in architecture with seeded random weights")
    p.add_argument(
        "--target",
        default="xnnpack",
        choices=["xnnpack", "qnn", "cuda", "onnx", "qnn-onnx"],
        help="backend to export for",
    )
    p.add_argument(
        "--quantize",
        choices=["none", "int8-dynamic", "8da4w"],
        help="weight quantization for xnnpack (QNN uses --qnn-precision); default none",
    )
    p.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16", "int8"],
        help="policy.precision's words for --quantize: int8 = int8-dynamic (weights per channel, activations per "
        "token), fp32 = none, auto = what this CPU runs fastest (int8 with an int8 dot product); bf16 is refused",
    )
    p.add_argument("--tokenizer", help="tokenizer.json / .model for a LeRobot or openpi checkpoint that ships none")
    p.add_argument(
        "--out", required=True, help="output .pte path (sidecar <out>.json), or the output folder for onnx / qnn-onnx"
    )
    p.add_argument("--methods", nargs="+", help="methods to export (default: all of the model family's)")
    p.add_argument(
        "--rtc",
        action="store_true",
        help="also export guided_step, the guided real-time-chunking step (a traced backward pass; xnnpack float32 "
        "or int8-dynamic, cuda float32; pi0, pi0.5, SmolVLA, X-VLA in its x0 form); without it, exported programs "
        "serve RTC by hard prefix inpainting",
    )
    p.add_argument("--num-steps", type=int, help="Euler steps of the fused sample method (default: the model's)")
    p.add_argument(
        "--qnn-soc",
        default="SM8650",
        help="Snapdragon SoC for --target qnn / qnn-onnx (e.g. SM8550, SM8650; default SM8650)",
    )
    p.add_argument(
        "--qnn-precision",
        choices=["8a8w", "16a8w", "fp16"],
        help="HTP precision: activations/weights bits, or fp16 (V73+ SoCs); default 16a8w for qnn-onnx, 8a8w for qnn",
    )
    p.add_argument(
        "--calibration",
        default="auto",
        help="qnn-onnx: observations to calibrate the quantized graphs on: sim (the simulated arm), a dataset folder "
        "(omni-ros sim collect), spec (drawn from the model's own spec: simulator frames, states from its norm "
        "stats), or random (plumbing tests only); default auto: sim when the model fits the simulated arm, else spec",
    )
    p.add_argument("--calibration-samples", type=int, default=16, help="observations to calibrate on (default 16)")
    p.add_argument("--camera", action="append", help="preset camera names (repeatable)")
    p.add_argument("--state-dim", type=int, help="preset state dimension")
    p.add_argument("--action-dim", type=int, help="preset action dimension")
    p.add_argument("--json", action="store_true", help="print the result and delegation report as JSON")
    p.set_defaults(func=run)
