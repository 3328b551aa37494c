"""The GEMM ceiling of ExecuTorch XNNPACK against eager PyTorch on this CPU, for the shapes of a preset.

    .venv/bin/python bench/gemm_kernels.py [--preset small] [--threads 2] [--runs 20] [--out FILE]

Nearly all of a policy's time is spent in its linear layers. This benchmark
takes the linear layers of each stage of the preset (vision tower over all
cameras' tokens, backbone prefill over the whole prefix, action expert over
one chunk) at their real shapes, chains them into one module per stage, and
times that module eager (PyTorch's oneDNN/MKL GEMMs), as an XNNPACK fp32 .pte
and as an XNNPACK int8-dynamic .pte, each in its own fresh process. No
attention, norms or glue: whatever XNNPACK gains here is the most the whole
policy can gain from its kernels, so `flop_weighted_speedup` bounds what
bench/backends.py can show end to end on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import emit, median_ms

VARIANTS = {"xnnpack_fp32": "none", "xnnpack_int8": "int8-dynamic"}


def stage_shapes(preset_name: str) -> dict[str, dict[str, Any]]:
    """Per stage: rows (tokens in one inference) and the (in, out) features of every linear, in order."""
    from omni_ros.policy.pi0.presets import preset

    cfg = preset(preset_name)
    v, b, e = cfg.vision, cfg.backbone, cfg.expert

    def decoder(part, rows: int, layers: int) -> dict[str, Any]:
        q, kv = part.num_heads * part.head_dim, part.num_kv_heads * part.head_dim
        one = [(part.width, q), (part.width, kv), (part.width, kv), (q, part.width)]
        one += [(part.width, part.mlp_dim), (part.width, part.mlp_dim), (part.mlp_dim, part.width)]
        return {"rows": rows, "linears": one * layers}

    vision_layer = [(v.width, 3 * v.width), (v.width, v.width), (v.width, v.mlp_dim), (v.mlp_dim, v.width)]
    return {
        "vision": {"rows": len(cfg.camera_names) * v.num_tokens, "linears": vision_layer * v.depth},
        "prefill": decoder(b, cfg.prefix_len, b.depth),
        "denoise_step": decoder(e, cfg.action_horizon + 1, e.depth),
    }


def build(shapes: list[tuple[int, int]]):
    """One module applying every linear of a stage to an input of its width (one input per distinct width)."""
    import torch
    from torch import nn

    class Linears(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(i, o, bias=False) for i, o in shapes)
            self.widths = sorted({i for i, _ in shapes})

        def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            by_width = dict(zip(self.widths, xs, strict=True))
            return tuple(layer(by_width[layer.in_features]) for layer in self.layers)

        def example(self, rows: int) -> tuple[torch.Tensor, ...]:
            return tuple(torch.randn(rows, w) for w in self.widths)

    torch.manual_seed(0)
    return Linears().eval()


def export(stage: dict[str, Any], quantize: str, out: Path) -> None:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from omni_ros.export.quantize import quantize_model

    model = quantize_model(build(stage["linears"]), quantize)
    example = model.example(stage["rows"])
    with torch.no_grad():
        program = torch.export.export(model, example)
    edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    out.write_bytes(edge.to_executorch().buffer)


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    stage = stage_shapes(args.preset)[args.stage]
    model = build(stage["linears"])
    xs = model.example(stage["rows"])
    if args.pte is None:
        with torch.inference_mode():
            return {"ms": median_ms(lambda: model(*xs), args.runs)}
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
    from executorch.runtime import Runtime

    _unsafe_reset_threadpool(args.threads)
    method = Runtime.get().load_program(Path(args.pte)).load_method("forward")
    return {"ms": median_ms(lambda: method.execute(list(xs)), args.runs)}


def run_worker(args: argparse.Namespace, stage: str, pte: Path | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", "--preset", args.preset, "--stage", stage]
    cmd += ["--threads", str(args.threads), "--runs", str(args.runs)] + (["--pte", str(pte)] if pte else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {stage} {pte} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stage", help=argparse.SUPPRESS)
    parser.add_argument("--pte", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    shapes = stage_shapes(args.preset)
    report: dict[str, Any] = {
        "benchmark": "gemm_kernels",
        "preset": args.preset,
        "threads": args.threads,
        "runs": args.runs,
        "machine": {"cpu": platform.machine(), "cores": os.cpu_count(), "load_average": list(os.getloadavg())},
        "stages": {},
    }
    flops: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="omni_gemm_") as tmp:
        for name, stage in shapes.items():
            flops[name] = 2.0 * stage["rows"] * sum(i * o for i, o in stage["linears"])
            print(f"[gemm] {name}: {stage['rows']} rows, {len(stage['linears'])} linears", file=sys.stderr, flush=True)
            row: dict[str, Any] = {"rows": stage["rows"], "linears": len(stage["linears"]), "gflop": flops[name] / 1e9}
            row["eager_ms"] = run_worker(args, name, None)["ms"]
            for variant, quantize in VARIANTS.items():
                pte = Path(tmp) / f"{name}_{variant}.pte"
                export(stage, quantize, pte)
                ms = run_worker(args, name, pte)["ms"]
                row[f"{variant}_ms"] = ms
                row[f"{variant}_speedup"] = round(row["eager_ms"] / ms, 2)
            row["eager_gflops"] = round(flops[name] / row["eager_ms"] / 1e6, 1)
            report["stages"][name] = row
    # Time-weighted over one inference: vision + prefill once, denoise_step num_steps times.
    from omni_ros.policy.pi0.presets import preset

    steps = preset(args.preset).num_steps
    weights = {"vision": 1, "prefill": 1, "denoise_step": steps}
    eager_total = sum(report["stages"][s]["eager_ms"] * w for s, w in weights.items())
    report["flop_weighted_speedup"] = {
        variant: round(eager_total / sum(report["stages"][s][f"{variant}_ms"] * w for s, w in weights.items()), 2)
        for variant in VARIANTS
    }
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
