"""A full-size pi0 (about 3.3 B parameters) in LeRobot's folder layout: load time, peak memory, one inference.

    .venv/bin/python bench/pi0_full.py [--work-dir DIR] [--dtype float32] [--device cpu] [--cameras 3]
        [--cpu-linear packed] [--out FILE]

Writes a random-weight pi0 at the real sizes (SigLIP So400m/14 at 224 px, Gemma 2B, the 300M expert, horizon
50, 32-wide state and actions) to DIR exactly as LeRobot's `save_pretrained` lays it out (config.json, bf16
model.safetensors streamed tensor by tensor, the processor files and statistics, a 257,152-token tokenizer),
reusing it when already there. Then, in a fresh process: `omni_ros.policy.load` time and peak RSS against the
model's bytes in the compute dtype (target <= 1.3x: the weights are memory-mapped, never held twice), and one
observation -> chunk with per-stage times. With `--device cuda` (where a GPU exists) the same in bfloat16 over
`--cameras` cameras and 10 steps (the pi0 paper reports 73 ms on an RTX 4090).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import emit

CAMERAS = ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
VOCAB = 257_152
STATE_DIM, ACTION_DIM = 8, 7


def pi0_config():
    from omni_ros.policy.pi0.configuration import ModelConfig, ProcessingConfig, TransformerConfig, VisionConfig
    from omni_ros.policy.tokenizer import TokenizerConfig

    return ModelConfig(
        name="pi0_full",
        camera_names=list(CAMERAS),
        state_dim=STATE_DIM,
        action_dim=ACTION_DIM,
        vision=VisionConfig(image_size=224, patch_size=14, width=1152, depth=27, num_heads=16, mlp_dim=4304),
        backbone=TransformerConfig(width=2048, depth=18, num_heads=8, num_kv_heads=1, head_dim=256, mlp_dim=16384),
        expert=TransformerConfig(width=1024, depth=18, num_heads=8, num_kv_heads=1, head_dim=256, mlp_dim=4096),
        tokenizer=TokenizerConfig(kind="hf", max_tokens=48),
        vocab_size=VOCAB,
        mlp_activation="gelu_tanh",
        max_state_dim=32,
        max_action_dim=32,
        processing=ProcessingConfig(convention="reference", prompt_format="newline", require_first_camera=False),
    )


def lerobot_names(name: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """Our parameter -> LeRobot's tensor(s) (q/k/v split back, the position embedding without its batch dim)."""
    p, e = "model.paligemma_with_expert.paligemma.model.", "model.paligemma_with_expert.gemma_expert.model."
    layer = {"input_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm"}
    parts = name.split(".")
    if name == "vision.pos_embed":
        return [(p + "vision_tower.vision_model.embeddings.position_embedding.weight", shape[1:])]
    if parts[0] == "vision":
        v = p + "vision_tower.vision_model."
        if parts[1] == "patch_embed":
            return [(v + "embeddings.patch_embedding." + parts[2], shape)]
        if parts[1] == "norm":
            return [(v + "post_layernorm." + parts[2], shape)]
        if parts[1] == "proj":
            return [(p + "multi_modal_projector.linear." + parts[2], shape)]
        i, sub, kind = parts[2], parts[3], parts[4]
        if sub == "qkv":
            third = (shape[0] // 3, *shape[1:])
            return [(f"{v}encoder.layers.{i}.self_attn.{x}_proj.{kind}", third) for x in "qkv"]
        mapped = {"norm1": "layer_norm1", "norm2": "layer_norm2", "proj": "self_attn.out_proj"}.get(sub, f"mlp.{sub}")
        return [(f"{v}encoder.layers.{i}.{mapped}.{kind}", shape)]
    if name == "backbone.embed_tokens.weight":
        return [(p + "language_model.embed_tokens.weight", shape)]
    if parts[0] in ("backbone", "expert") and parts[1] == "layers":
        base = (p + "language_model." if parts[0] == "backbone" else e) + f"layers.{parts[2]}."
        sub = ".".join(parts[3:])
        head = parts[3]
        if head in layer:
            return [(base + layer[head] + "." + ".".join(parts[4:]), shape)]
        if head in ("q_proj", "k_proj", "v_proj", "o_proj"):
            return [(base + "self_attn." + sub, shape)]
        return [(base + sub, shape)]
    if name.startswith("expert.final_norm."):
        return [(e + "norm." + parts[-1], shape)]
    top = {"time_mlp_in": "action_time_mlp_in", "time_mlp_out": "action_time_mlp_out"}
    return [(f"model.{top.get(parts[1], parts[1])}.{parts[2]}", shape)]


def write_folder(folder: Path) -> dict[str, Any]:
    """LeRobot's pi0 folder at full size with random bf16 weights, written tensor by tensor."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from omni_ros.policy.pi0.modeling import Pi0Model

    folder.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        model = Pi0Model(pi0_config())
    tensors = [(key, s) for name, prm in model.named_parameters() for key, s in lerobot_names(name, tuple(prm.shape))]
    header, offset = {}, 0
    for key, shape in tensors:
        size = int(np.prod(shape)) * 2
        header[key] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    gen = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for _, shape in tensors:
            scale = 0.02 if len(shape) > 1 else 0.1
            f.write((torch.randn(shape, generator=gen) * scale).to(torch.bfloat16).view(torch.int16).numpy().tobytes())
    features = {f"observation.images.{c}": {"type": "VISUAL", "shape": [3, 224, 224]} for c in CAMERAS}
    features["observation.state"] = {"type": "STATE", "shape": [STATE_DIM]}
    config = {
        "type": "pi0",
        "input_features": features,
        "output_features": {"action": {"type": "ACTION", "shape": [ACTION_DIM]}},
        "paligemma_variant": "gemma_2b",
        "action_expert_variant": "gemma_300m",
        "dtype": "bfloat16",
        "chunk_size": 50,
        "max_state_dim": 32,
        "max_action_dim": 32,
        "num_inference_steps": 10,
        "image_resolution": [224, 224],
        "tokenizer_max_length": 48,
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    stats = {
        "observation.state.mean": torch.zeros(STATE_DIM),
        "observation.state.std": torch.ones(STATE_DIM),
        "action.mean": torch.zeros(ACTION_DIM),
        "action.std": torch.ones(ACTION_DIM),
    }
    for which, step, name in (("pre", "normalizer_processor", 4), ("post", "unnormalizer_processor", 0)):
        file = f"policy_{which}processor_step_{name}_{step}.safetensors"
        save_file({k: v for k, v in stats.items() if (which == "pre") == k.startswith("obs")}, str(folder / file))
        steps = [{"registry_name": step, "config": {"eps": 1e-8}, "state_file": file}]
        if which == "pre":
            tok = {"tokenizer_name": "google/paligemma-3b-pt-224", "max_length": 48}
            steps.append({"registry_name": "tokenizer_processor", "config": tok})
        (folder / f"policy_{which}processor.json").write_text(json.dumps({"steps": steps}, indent=1))
    write_tokenizer(folder / "tokenizer.json")
    return {"write_s": round(time.perf_counter() - start, 1), "file_gb": round(offset / 1e9, 2)}


def write_tokenizer(path: Path) -> None:
    """A word-level tokenizer with exactly the PaliGemma vocabulary size and a BOS template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    tok.save(str(path))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """In this fresh process: load time and peak RSS, then one chunk."""
    import numpy as np
    import torch

    import omni_ros.policy

    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    policy = omni_ros.policy.load(args.work_dir, device=args.device, dtype=args.dtype, cpu_linear=args.cpu_linear)
    load_s = time.perf_counter() - start
    from omni_ros.policy.cpu_linear import weight_count

    params = weight_count(policy.runner.model)
    bytes_ = params * torch.empty((), dtype=policy.runner.dtype).element_size()
    rss_after_load = rss_mb()
    rng = np.random.default_rng(0)
    obs = {
        "images": {c: rng.integers(0, 256, (480, 640, 3), np.uint8) for c in CAMERAS[: args.cameras]},
        "state": rng.normal(size=STATE_DIM),
        "prompt": "pick up the cup",
    }
    runs = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        timing = policy.infer(obs)["policy_timing"]
        runs.append(
            {
                **{k: round(v, 1) for k, v in timing.items() if k.endswith("_ms")},
                "wall_ms": (time.perf_counter() - t0) * 1e3,
            }
        )
    peak = peak_rss_mb()
    return {
        "device": args.device,
        "dtype": args.dtype,
        "cpu_linear": args.cpu_linear,
        "packed_linears": policy.runner.packed_linears,
        "threads": torch.get_num_threads(),
        "parameters": params,
        "model_mb": round(bytes_ / 2**20, 1),
        "load_s": round(load_s, 1),
        "rss_after_load_mb": rss_after_load,
        "peak_rss_mb": peak,
        "peak_rss_over_model": round(peak / (bytes_ / 2**20), 3),
        "runs": runs,
    }


def rss_mb() -> float:
    return _status("VmRSS:")


def peak_rss_mb() -> float:
    return _status("VmHWM:")


def _status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default="/tmp/omni_pi0_full")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--cameras", type=int, default=3, choices=[1, 2, 3])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument(
        "--cpu-linear", default="packed", choices=["packed", "dense"], help="as policy.cpu_linear (default: as served)"
    )
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args)))
        return 0
    work = Path(args.work_dir)
    report: dict[str, Any] = {"benchmark": "pi0_full", "machine": {"cpu": platform.processor() or platform.machine()}}
    if not (work / "model.safetensors").is_file():
        print(f"[bench] writing a full-size pi0 (bf16) to {work} ...", file=sys.stderr, flush=True)
        report["written"] = write_folder(work)
    options = {"--work-dir": work, "--device": args.device, "--dtype": args.dtype, "--cameras": args.cameras,
               "--runs": args.runs, "--threads": args.threads, "--cpu-linear": args.cpu_linear}  # fmt: skip
    cmd = [sys.executable, __file__, "--measure", *(str(x) for item in options.items() for x in item)]
    print("[bench] loading and running it in a fresh process ...", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"measurement failed:\n{proc.stderr[-4000:]}")
    report["result"] = json.loads(proc.stdout.strip().splitlines()[-1])
    report["targets"] = {"peak_rss_at_most_1.3x_model": report["result"]["peak_rss_over_model"] <= 1.3}
    report["machine"]["load_average"] = os.getloadavg()
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
