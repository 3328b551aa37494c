"""The GEMM ceiling of every kernel we can run on this CPU, at the shapes of a policy's stages.

    .venv/bin/python bench/gemm_kernels.py [--preset small|pi0|pi0_edge|smolvla] [--threads 2] [--runs 20] [--rounds 3]
        [--no-export] [--out FILE]

Nearly all of a policy's time is spent in its linear layers. This benchmark takes the linear layers of
each stage (vision tower over all cameras' tokens, backbone prefill over the whole prefix, action expert
over one chunk) at their real shapes, chains them into one module per stage, and times that module with
every GEMM kernel the product can use, each in its own fresh process:

- `eager_dense`: torch's nn.Linear (MKL / oneDNN sgemm), `policy.cpu_linear: dense`;
- `eager_packed`: oneDNN from a pre-packed weight, `policy.cpu_linear: packed` (the served default);
- `eager_int8`: torch's dynamically quantized linear (the x86 engine's u8 x s8 FBGEMM kernels, which use
  VNNI where the CPU has it and AVX2 pairwise multiply-adds where it does not);
- `eager_bf16`: `policy.precision: bf16`'s layer (oneDNN bf16 from a packed weight where the CPU has
  AVX512_BF16 / AMX, else the same numbers emulated in float32: the row then says `emulated`);
- `eager_int8_onednn`: `policy.precision: int8`'s oneDNN layer as the product runs it on this CPU (int8 weights
  per channel, activations quantized per token at run time, the quantization included in the time): `torch._int_mm`
  where the CPU has an int8 dot product, else the same operands through a packed float32 GEMM (`emulated`);
- `eager_int_mm`: the same layer forced onto `torch._int_mm` whatever the CPU (what it costs without VNNI);
- `xnnpack_fp32` / `xnnpack_int8`: the same module as an ExecuTorch XNNPACK .pte, fp32 and int8-dynamic
  (`policy.int8_kernel: xnnpack` runs these kernels one linear per call, plus ~11-17 us a call).

No attention, norms or glue: `inference_gemm_ms` (one inference's GEMMs: vision and prefill once, the
denoising step num_steps times) is a floor under that kernel's whole chunk, and `flop_weighted_speedup` (over
`eager_packed`) the most that kernel can gain the whole policy, so they bound what bench/vs_lerobot.py,
bench/smolvla.py and bench/backends.py can show end to end on the same machine. The kernels run in turn,
round after round, so a slow spell of a shared machine lands on all of them, each timed with idle cores
polling as the product infers (`policy.cpu_idle_poll` auto: held where /dev/cpu_dma_latency is writable; the
JSON's `machine.cpu_idle_poll` says; results without that key timed cores that halt). `--preset` is a pi0 preset,
`pi0_edge` (bench/vs_lerobot.py's size) or `smolvla` (LeRobot's default SmolVLA over SmolVLM2-500M, 2 cameras
at 512 px); `smolvla_attention` times the products inside that SmolVLA's vision attention (q k^T and p v per
head, keys and values standing as weights) at every kernel: what attention would cost at each GEMM rate;
`pi0_edge_attention` the same for the edge pi0 (vision, prefix and denoising-step attention). `--image-threads`
times the vision stage's eager kernels as the product runs a tower over several cameras under passive waiting: the
rows split over the threads, each part on one torch thread (omni_ros/policy/image_threads.py); without it the
stage's rows share every thread in each product.

The linears are the product's: where a module's linears read one tensor, int8 stacks them into one
(omni_ros/policy/precision/stacked_linears.py: q / k / v, gate / up), bf16 and float32 do not; each kernel's chain
stacks them alike (`chain`). A stage's `linears` counts them unstacked.

Each stage also gets `weight_read_ms`: the time to read its weights once at this machine's memory rate, per
weight width (4 bytes fp32, 2 bf16, 1 int8), timed as a sum over a buffer of that many bytes on the same threads
and in the same rounds as the kernels. A product of few rows (a denoising step: the chunk's 50 actions) cannot
take less than that, however fast its arithmetic; `{kernel}_over_weight_read` says how far each kernel is from
it, and `inference_weight_read_ms` adds it up over one inference like `inference_gemm_ms`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import cpu_facts, emit, median_ms

from omni_ros import cpu_idle

EAGER = ("eager_dense", "eager_packed", "eager_int8", "eager_bf16", "eager_int8_onednn", "eager_int_mm")
PTE = {"xnnpack_fp32": "none", "xnnpack_int8": "int8-dynamic"}
BASELINE = "eager_packed"  # what the node and the server run
# The bytes a kernel reads per weight.
WEIGHT_BYTES = {
    "eager_dense": 4, "eager_packed": 4, "eager_int8": 1, "eager_bf16": 2, "eager_int8_onednn": 1,
    "eager_int_mm": 1, "xnnpack_fp32": 4, "xnnpack_int8": 1,
}  # fmt: skip
READ = "weight_read"  # the worker kind that times reading a stage's weights (`--bytes` of them)
# Which groups of linears reading one tensor a kernel's product stacks (as the product's precision does).
STACKING = {
    "eager_dense": (), "eager_packed": (), "xnnpack_fp32": (), "eager_bf16": (),
    "eager_int8": ("attention", "mlp"), "eager_int8_onednn": ("attention", "mlp"), "eager_int_mm": ("attention", "mlp"),
    "xnnpack_int8": ("attention", "mlp"),
}  # fmt: skip
Shape = tuple[int, int]


def group(kind: str, *members: Shape) -> tuple[str, list[Shape]]:
    """Linears that read one tensor (`kind` attention: q / k / v; mlp: gate / up), stacked where a kernel stacks
    `kind`."""
    return kind, list(members)


def chain(linears: list[Any], kernel: str = "eager_packed") -> list[Shape]:
    """A stage's linears as `kernel`'s product runs them: each group one stacked linear or its members apart."""
    out: list[Shape] = []
    for item in linears:
        if isinstance(item[0], str):
            kind, members = item
            if kind in STACKING.get(kernel, ()):
                out.append((members[0][0], sum(o for _, o in members)))
            else:
                out += members
        else:
            out.append(item)
    return out


def smolvla_stage_shapes() -> tuple[dict[str, dict[str, Any]], int]:
    """SmolVLA's stages at LeRobot's default size (SmolVLAConfig's defaults), 2 cameras, a 48-token prompt."""
    from omni_ros.policy.smolvla.configuration import SmolVLAConfig

    cfg = SmolVLAConfig()
    v, t, e = cfg.vision, cfg.text, cfg.expert
    cameras = len(cfg.camera_names)
    patches = (cfg.tile_size // v.patch_size) ** 2
    # The SigLIP blocks' q / k / v are one linear in the model (pi0/vision.py's VitBlock).
    vision_layer = [(v.width, 3 * v.width), (v.width, v.width), (v.width, v.mlp_dim), (v.mlp_dim, v.width)]
    q, kv = t.num_heads * t.head_dim, t.num_kv_heads * t.head_dim
    text_layer: list[Any] = [group("attention", (t.width, q), (t.width, kv), (t.width, kv)), (q, t.width)]
    text_layer += [group("mlp", (t.width, t.mlp_dim), (t.width, t.mlp_dim)), (t.mlp_dim, t.width)]
    expert: list[Any] = []
    for _, kind in cfg.layer_plan():
        # A cross-attention layer projects the cached VLM K/V once in prefill; per step it has q and o.
        expert += [group("attention", (e.width, q), (e.width, kv), (e.width, kv)) if kind == "self" else (e.width, q)]
        expert += [(q, e.width), group("mlp", (e.width, e.mlp_dim), (e.width, e.mlp_dim)), (e.mlp_dim, e.width)]
    # The connector projects the pixel-shuffled image tokens (2 x 64 rows); it is counted with the prefill, at
    # the prefill's 177 rows (2% more than its GEMM work).
    connector = [(v.width * v.scale_factor**2, t.width)]
    shapes = {
        "vision": {"rows": cameras * patches, "linears": vision_layer * v.depth},
        "prefill": {"rows": cfg.prefix_len, "linears": connector + text_layer * t.depth},
        "denoise_step": {"rows": cfg.action_horizon, "linears": expert},
    }
    return shapes, cfg.num_steps


def pi0_edge():
    """bench/vs_lerobot.py's edge-size pi0 (scripts/lerobot_bench.py): 2 cameras at 224 px in 14 px patches,
    SigLIP 384 x 6, VLM 512 x 6, expert 256 x 6, a 48-token prompt, horizon 50, 10 steps."""
    from omni_ros.policy.pi0.configuration import TokenizerConfig, TransformerConfig, VisionConfig
    from omni_ros.policy.pi0.presets import preset

    gemma = dict(num_heads=8, num_kv_heads=1, head_dim=64)
    return preset(
        "small",
        action_horizon=50,
        num_steps=10,
        vision=VisionConfig(image_size=224, patch_size=14, width=384, depth=6, num_heads=16, mlp_dim=1536),
        backbone=TransformerConfig(width=512, depth=6, mlp_dim=2048, **gemma),
        expert=TransformerConfig(width=256, depth=6, mlp_dim=1024, **gemma),
        tokenizer=TokenizerConfig(max_tokens=48),
    )


def stage_shapes(preset_name: str) -> tuple[dict[str, dict[str, Any]], int]:
    """Per stage: rows (tokens in one inference) and the (in, out) features of every linear, in order; and
    how many denoising steps one inference runs."""
    if preset_name == "smolvla":
        return smolvla_stage_shapes()
    if preset_name == "smolvla_attention":
        return smolvla_attention_shapes()
    if preset_name == "pi0_edge_attention":
        return pi0_edge_attention_shapes()
    from omni_ros.policy.pi0.presets import preset

    cfg = pi0_edge() if preset_name == "pi0_edge" else preset(preset_name)
    v, b, e = cfg.vision, cfg.backbone, cfg.expert

    def decoder(part, rows: int, layers: int) -> dict[str, Any]:
        q, kv = part.num_heads * part.head_dim, part.num_kv_heads * part.head_dim
        one: list[Any] = [group("attention", (part.width, q), (part.width, kv), (part.width, kv)), (q, part.width)]
        one += [group("mlp", (part.width, part.mlp_dim), (part.width, part.mlp_dim)), (part.mlp_dim, part.width)]
        return {"rows": rows, "linears": one * layers}

    vision_layer = [(v.width, 3 * v.width), (v.width, v.width), (v.width, v.mlp_dim), (v.mlp_dim, v.width)]
    shapes = {
        "vision": {"rows": len(cfg.camera_names) * v.num_tokens, "linears": vision_layer * v.depth},
        "prefill": decoder(b, cfg.prefix_len, b.depth),
        "denoise_step": decoder(e, cfg.action_horizon + 1, e.depth),
    }
    return shapes, cfg.num_steps


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


def on_image_threads(model: Any, threads: int) -> Any:
    """`model` called on `threads` parts of its rows at once, each part on one torch thread: the product's
    ImageThreads (omni_ros/policy/image_threads.py), as it runs a vision tower over several cameras."""
    import torch

    from omni_ros.policy.image_threads import ImageThreads

    # ImageThreads joins the parts' outputs with one cat: one element of each product stands for its output (the
    # products are what is timed, not a copy of them).
    return ImageThreads(lambda *xs: torch.stack([y[0, 0] for y in model(*xs)])[None], threads)


def export(stage: dict[str, Any], quantize: str, out: Path) -> None:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from omni_ros.policy.quantize import quantize_model

    kernel = "xnnpack_int8" if quantize != "none" else "xnnpack_fp32"
    model = quantize_model(build(chain(stage["linears"], kernel)), quantize)
    example = model.example(stage["rows"])
    with torch.no_grad():
        program = torch.export.export(model, example)
    edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    out.write_bytes(edge.to_executorch().buffer)


def read_ms(nbytes: int, runs: int) -> float:
    """One read of `nbytes` of memory (a float32 sum over a buffer that size, on torch's threads): a resident
    buffer, read again and again as a stage's weights are, call after call."""
    import torch

    buffer = torch.ones(max(nbytes // 4, 1))
    with torch.inference_mode(), cpu_idle.held():
        return median_ms(lambda: buffer.sum(), runs)


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    if args.kernel == READ:
        return {"ms": read_ms(args.bytes, args.runs)}
    stage = stage_shapes(args.preset)[0][args.stage]
    model = build(chain(stage["linears"], args.kernel))
    xs = model.example(stage["rows"])
    emulated = False
    if args.pte is None:
        if args.kernel == "eager_packed":
            from omni_ros.policy.cpu_linear import pack_linears, packed_linear_available

            if not packed_linear_available():
                return {"ms": None, "why": "no oneDNN packed linear in this torch build / CPU"}
            pack_linears(model)
        elif args.kernel in ("eager_bf16", "eager_int8_onednn", "eager_int_mm"):
            from omni_ros.policy.precision import PrecisionChoice, apply_precision, choose

            precision = "bf16" if args.kernel == "eager_bf16" else "int8"
            choice = choose(precision, int8_kernel="onednn")
            if args.kernel == "eager_int_mm":
                choice = PrecisionChoice("int8", "forced", kernel="onednn", native=True)
            apply_precision(model, choice)
            layer = model.layers[0]
            emulated = (not layer.packed) if precision == "bf16" else layer.kernel == "emulated"
        elif args.kernel == "eager_int8":
            import warnings

            from torch import nn

            with warnings.catch_warnings():  # torch.ao.quantization's deprecation notice
                warnings.simplefilter("ignore")
                model = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
        # Idle cores polling while timed, as while the product infers (policy.cpu_idle_poll auto; the pipeline
        # holds it around each chunk): with cores that halt, every parallel region waits for a vCPU to wake, and
        # the "floor" would be slower than a whole chunk.
        call = model
        if args.image_threads and args.stage == "vision" and args.threads > 1:
            call = on_image_threads(model, args.threads)
        with torch.inference_mode(), cpu_idle.held():
            out = {"ms": median_ms(lambda: call(*xs), args.runs)}
        return {**out, "emulated": True} if emulated else out
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
    from executorch.runtime import Runtime

    _unsafe_reset_threadpool(args.threads)
    method = Runtime.get().load_program(Path(args.pte)).load_method("forward")
    with cpu_idle.held():
        return {"ms": median_ms(lambda: method.execute(list(xs)), args.runs)}


def run_worker(
    args: argparse.Namespace, stage: str, kernel: str, pte: Path | None = None, nbytes: int = 0
) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", "--preset", args.preset, "--stage", stage, "--kernel", kernel]
    cmd += ["--bytes", str(nbytes)] if kernel == READ else []
    cmd += ["--threads", str(args.threads), "--runs", str(args.runs)] + (["--pte", str(pte)] if pte else [])
    cmd += ["--image-threads"] if getattr(args, "image_threads", False) else []
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {stage} {pte} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def attention_products(heads: int, keys: int, head_dim: int) -> list[tuple[int, int]]:
    """One attention call's products as linears, per query head: q k^T (head_dim -> keys) and p v (keys ->
    head_dim); the keys and values stand as the weights."""
    return [(head_dim, keys), (keys, head_dim)] * heads


def pi0_edge_attention_shapes() -> tuple[dict[str, dict[str, Any]], int]:
    """The products inside the edge pi0's attention (see `smolvla_attention_shapes`): the vision tower's per
    camera and head, the prefix's (every query head over the prefix) and a denoising step's (its rows over the
    prefix and themselves), each stage one layer's calls, run `per_inference` times."""
    cfg = pi0_edge()
    v, b, e = cfg.vision, cfg.backbone, cfg.expert
    cameras, rows = len(cfg.camera_names), cfg.action_horizon + 1
    shapes = {
        "vision_attention": {
            "rows": v.num_tokens,
            "linears": attention_products(cameras * v.num_heads, v.num_tokens, v.width // v.num_heads),
            "per_inference": v.depth,
        },
        "prefix_attention": {
            "rows": cfg.prefix_len,
            "linears": attention_products(b.num_heads, cfg.prefix_len, b.head_dim),
            "per_inference": b.depth,
        },
        "denoise_attention": {
            "rows": rows,
            "linears": attention_products(e.num_heads, cfg.prefix_len + rows, e.head_dim),
            "per_inference": e.depth * cfg.num_steps,
        },
    }
    return shapes, cfg.num_steps


def smolvla_attention_shapes() -> tuple[dict[str, dict[str, Any]], int]:
    """The products inside the full-size SmolVLA's vision attention, as linears: per head, q k^T (1024 patches x
    64 -> 1024 keys) and p v (1024 x 1024 keys -> 64), for every head of both cameras in one layer; an inference
    runs 12 such layers. The keys and values stand as weights: what those products would cost at each kernel's
    GEMM rate if attention ran on it (XNNPACK's int8 GEMMs take a static weight, so this is a bound a fused int8
    attention kernel could approach, not a kernel the product has)."""
    from omni_ros.policy.smolvla.configuration import SmolVLAConfig

    cfg = SmolVLAConfig()
    v = cfg.vision
    patches, head_dim = (cfg.tile_size // v.patch_size) ** 2, v.width // v.num_heads
    layer = attention_products(len(cfg.camera_names) * v.num_heads, patches, head_dim)
    return {"vision_attention": {"rows": patches, "linears": layer, "per_inference": v.depth}}, cfg.num_steps


def summarize(report: dict[str, Any], shapes: dict[str, dict[str, Any]], steps: int, kernels: list[str]) -> None:
    """Per kernel, the GEMM time of one inference (vision and prefill once, denoise_step `steps` times, another
    stage as often as its `per_inference` says) and its speedup over the baseline: the most that kernel can give
    the whole policy on this machine."""
    weights = {s: shapes[s].get("per_inference", steps if s == "denoise_step" else 1) for s in shapes}

    def total(kernel: str) -> float | None:
        times = [report["stages"][s][f"{kernel}_ms"] for s in weights]
        return None if None in times else sum(t * weights[s] for t, s in zip(times, weights, strict=True))

    totals = {k: total(k) for k in kernels}
    base = totals.get(BASELINE) or totals.get("eager_dense")
    report["inference_gemm_ms"] = {k: (round(t, 1) if t else None) for k, t in totals.items()}
    report["flop_weighted_speedup"] = {k: (round(base / t, 2) if t and base else None) for k, t in totals.items()}
    reads = [report["stages"][s].get("weight_read_ms") for s in weights]
    if all(reads):
        report["inference_weight_read_ms"] = {
            width: round(sum(r[width] * weights[s] for r, s in zip(reads, weights, strict=True)), 1)
            for width in reads[0]
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--preset",
        default="small",
        help="a pi0 preset (tiny, demo, small, pi0), pi0_edge (bench/vs_lerobot.py's size), smolvla, or "
        "smolvla_attention / pi0_edge_attention (the products inside that model's attention, keys and values "
        "as weights)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="kernels timed in turn this many times; the median round is kept"
    )
    parser.add_argument("--no-export", action="store_true", help="eager kernels only (no XNNPACK rows)")
    parser.add_argument(
        "--image-threads",
        action="store_true",
        help="the vision stage's rows split over the threads, each part on one torch thread, as the product runs "
        "a vision tower over several cameras (omni_ros/policy/image_threads.py); the eager kernels only",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stage", help=argparse.SUPPRESS)
    parser.add_argument("--pte", help=argparse.SUPPRESS)
    parser.add_argument("--kernel", help=argparse.SUPPRESS)
    parser.add_argument("--bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    shapes, steps = stage_shapes(args.preset)
    kernels = list(EAGER) + ([] if args.no_export else list(PTE))
    report: dict[str, Any] = {
        "benchmark": "gemm_kernels",
        "preset": args.preset,
        "threads": args.threads,
        "runs": args.runs,
        "rounds": args.rounds,
        "baseline": BASELINE,
        "image_threads": args.image_threads,
        "machine": cpu_facts(),
        "stages": {},
    }
    with tempfile.TemporaryDirectory(prefix="omni_gemm_") as tmp:
        for name, stage in shapes.items():
            linears = chain(stage["linears"])  # unstacked: the FLOPs and weights are the same stacked
            flop = 2.0 * stage["rows"] * sum(i * o for i, o in linears)
            print(f"[gemm] {name}: {stage['rows']} rows, {len(linears)} linears", file=sys.stderr, flush=True)
            params = sum(i * o for i, o in linears)
            row: dict[str, Any] = {"rows": stage["rows"], "linears": len(linears), "gflop": flop / 1e9}
            row["weights_m"] = round(params / 1e6, 2)
            widths = sorted({WEIGHT_BYTES[k] for k in kernels}, reverse=True)
            reads: dict[int, list[float]] = {w: [] for w in widths}
            ptes: dict[str, Path | None] = dict.fromkeys(kernels)
            for kernel in PTE.keys() & set(kernels):
                pte = ptes[kernel] = Path(tmp) / f"{name}_{kernel}.pte"
                export(stage, PTE[kernel], pte)
            # Kernels in turn, round after round: a slow spell of this shared VM lands on every kernel alike.
            samples: dict[str, list[float]] = {k: [] for k in kernels}
            for _ in range(args.rounds):
                for kernel in kernels:
                    result = run_worker(args, name, kernel, ptes[kernel])
                    if result["ms"] is not None:
                        samples[kernel].append(result["ms"])
                    if result.get("emulated"):
                        report["emulated"] = sorted(set(report.get("emulated", [])) | {kernel})
                for width in widths:
                    reads[width].append(run_worker(args, name, READ, nbytes=params * width)["ms"])
            for kernel in kernels:
                row[f"{kernel}_ms"] = round(statistics.median(samples[kernel]), 3) if samples[kernel] else None
                row[f"{kernel}_rounds_ms"] = samples[kernel]
                print(f"[gemm]   {kernel}: {samples[kernel]} ms", file=sys.stderr, flush=True)
            row["weight_read_ms"] = {f"{w}_byte": round(statistics.median(reads[w]), 3) for w in widths}
            print(f"[gemm]   weights read once: {row['weight_read_ms']} ms", file=sys.stderr, flush=True)
            base = row[f"{BASELINE}_ms"] or row["eager_dense_ms"]
            for kernel in kernels:
                ms = row[f"{kernel}_ms"]
                read = row["weight_read_ms"][f"{WEIGHT_BYTES[kernel]}_byte"]
                row[f"{kernel}_gflops"] = round(flop / ms / 1e6, 1) if ms else None
                row[f"{kernel}_speedup"] = round(base / ms, 2) if ms else None
                row[f"{kernel}_over_weight_read"] = round(ms / read, 2) if ms and read else None
            report["stages"][name] = row
    summarize(report, shapes, steps, kernels)
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
