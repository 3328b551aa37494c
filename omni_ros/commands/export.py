"""`omni-ros export`: a checkpoint or preset -> one ExecuTorch `.pte` (+ sidecar JSON) for XNNPACK, QNN or CUDA."""

from __future__ import annotations

import argparse
import json

from omni_ros.config import ConfigError


def run(args: argparse.Namespace) -> int:
    from omni_ros.export.exporter import check_export_target, export_checkpoint, export_preset
    from omni_ros.export.qnn import QnnOptions
    from omni_ros.export.report import format_report

    qnn = QnnOptions(soc=args.qnn_soc, precision=args.qnn_precision)
    methods = tuple(args.methods) if args.methods else None  # None: every method of the model's family
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
    print(format_report(result.report))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a policy to an ExecuTorch .pte (xnnpack, qnn, cuda)",
        description="Export the policy's stages (pi0: encode_images, prefill, denoise_step; SmolVLA: encode_image, "
        "prefill, denoise_step) and the fused sampling loop (sample) as named methods of one .pte, lowered for a "
        "backend, plus a sidecar <out>.json. --checkpoint takes any folder omni_ros loads (omni_ros, LeRobot pi0 / "
        "pi0.5 / SmolVLA, openpi).",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", help="checkpoint directory (config.json + model.safetensors)")
    p.add_argument("--tokenizer", help="tokenizer file or folder for a reference checkpoint that ships none")
    source.add_argument("--preset", default="small", help="built-in architecture with seeded random weights")
    p.add_argument("--target", default="xnnpack", choices=["xnnpack", "qnn", "cuda"], help="backend to lower for")
    p.add_argument(
        "--quantize",
        default="none",
        choices=["none", "int8-dynamic", "8da4w"],
        help="weight quantization for xnnpack (QNN uses --qnn-precision)",
    )
    p.add_argument("--out", required=True, help="output .pte path; the sidecar is written to <out>.json")
    p.add_argument("--methods", nargs="+", help="methods to export (default: all of the model family's)")
    p.add_argument("--num-steps", type=int, help="Euler steps of the fused sample method (default: the model's)")
    p.add_argument("--qnn-soc", default="SM8650", help="Snapdragon SoC for --target qnn (e.g. SM8550, SM8650)")
    p.add_argument("--qnn-precision", default="8a8w", choices=["8a8w", "16a8w", "fp16"], help="QNN HTP precision")
    p.add_argument("--camera", action="append", help="preset camera names (repeatable)")
    p.add_argument("--state-dim", type=int, help="preset state dimension")
    p.add_argument("--action-dim", type=int, help="preset action dimension")
    p.add_argument("--json", action="store_true", help="print the result and delegation report as JSON")
    p.set_defaults(func=run)
