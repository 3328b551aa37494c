#!/usr/bin/env python3
"""LeRobot's half of bench/pi0_fast.py: an edge-size pi0-FAST built, saved and timed by LeRobot 0.6.1 itself.

Runs in the LeRobot venv. The model has bench/vs_lerobot.py's pi0 dimensions without the expert (2 cameras at
480x640 -> 224 px, SigLIP 384 x 6, VLM 512 x 6, head_dim 64, MLP 2048), the tiny PaliGemma-shaped tokenizer of
the reference fixtures (640 pieces) and a FAST tokenizer fitted locally; seeded random weights. Random weights
never emit the end marker, so every chunk decodes `--steps` tokens (max_decoding_steps) in both implementations:
the same work, token for token. `validate_action_token_prefix` is off (random weights emit no "Action:").

    build:    .venv-lerobot/bin/python scripts/lerobot_pi0fast_bench.py --out DIR --build
    measure:  .venv-lerobot/bin/python scripts/lerobot_pi0fast_bench.py --out DIR --threads 1 --runs 3

Measure prints one JSON object: chunk time (median of `--runs` after one warm-up), time to first token, tokens/s
(decode phase) and the generated tokens of the last chunk.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_reference_fixtures as ref
import numpy as np
import torch

NAME = "pi0fast_edge"
EDGE = {
    "siglip": dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=16, patch_size=14),
    "gemma_2b": dict(width=512, depth=6, mlp_dim=2048, num_heads=8, num_kv_heads=1, head_dim=64),
    "gemma_300m": dict(width=256, depth=6, mlp_dim=1024, num_heads=8, num_kv_heads=1, head_dim=64),
}
CAMERAS = ("observation.images.top", "observation.images.wrist")
STATE_DIM, ACTION_DIM, CHUNK = 8, 7, 50
PROMPT = "Pick up the red cube and place it on the tray."
TEXT_VOCAB, FAST_VOCAB = 1024, 256  # a 50 x 7 chunk needs a wider FAST alphabet than the fixtures' 10-step ones


def setup(folder: Path) -> None:
    ref.PI_SIZES.gemma, ref.PI_SIZES.siglip = dict(EDGE), EDGE["siglip"]
    ref.FAST_SIZES.update(image_size=224, vocab=TEXT_VOCAB)
    ref.install_fast_patches()
    ref._LocalAutoTokenizer.folders[ref.PALIGEMMA_TOKENIZER_NAME] = folder
    ref._LocalAutoProcessor.folder = folder


def build(out: Path, steps: int, seed: int) -> None:
    import shutil

    from lerobot.configs import FeatureType, PolicyFeature
    from safetensors.torch import save_file

    folder = out / NAME
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    setup(folder)
    config_cls, policy_cls, make = ref.fast_policy_classes()
    tok = ref.fast_text_tokenizer(TEXT_VOCAB)
    tok.save_pretrained(str(folder))
    ref.fit_fast_tokenizer(folder / ref.FAST_DIRNAME, seed, CHUNK, ACTION_DIM, vocab=FAST_VOCAB)
    inputs = {k: PolicyFeature(type=FeatureType.VISUAL, shape=(3, 480, 640)) for k in CAMERAS}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))}
    config = config_cls(
        input_features=inputs,
        output_features=outputs,
        chunk_size=CHUNK,
        n_action_steps=CHUNK,
        device="cpu",
        action_tokenizer_name=f"./{ref.FAST_DIRNAME}",
        max_decoding_steps=steps,
        validate_action_token_prefix=False,
    )
    with ref.quiet():
        policy = policy_cls(config)
    ref.randomize_parameters(policy, seed)
    with torch.no_grad():
        ref._fast_embed_tokens(policy).weight.copy_(ref._fast_lm_head(policy).weight)
    stats = ref.dataset_stats(seed + 1, 0, STATE_DIM, ACTION_DIM)
    pre, post = make(config, dataset_stats=stats)
    with ref.quiet():
        policy.save_pretrained(str(folder))
    pre.save_pretrained(str(folder))
    post.save_pretrained(str(folder))
    rng = np.random.default_rng(seed + 2)
    tensors = {k: torch.from_numpy(rng.integers(0, 256, size=(480, 640, 3), dtype=np.uint8)) for k in CAMERAS}
    s = stats["observation.state"]
    tensors["observation.state"] = torch.from_numpy(
        (s["mean"] + s["std"] * rng.normal(size=STATE_DIM)).astype(np.float32)
    )
    save_file(tensors, str(out / f"{NAME}_inputs.safetensors"))
    (out / f"{NAME}_inputs.json").write_text(json.dumps({"prompt": PROMPT, "cameras": list(CAMERAS), "steps": steps}))
    print(f"[build] {NAME}: {sum(p.numel() for p in policy.parameters()) / 1e6:.1f} M parameters", file=sys.stderr)


def measure(out: Path, threads: int, runs: int) -> dict:
    from lerobot.policies import factory
    from lerobot.policies.utils import prepare_observation_for_inference
    from safetensors.torch import load_file

    torch.set_num_threads(threads)
    folder = out / NAME
    setup(folder)
    _, policy_cls, _ = ref.fast_policy_classes()
    with ref.quiet():
        policy = policy_cls.from_pretrained(str(folder))
    policy.eval()
    pre, post = factory.make_pre_post_processors(policy.config, pretrained_path=str(folder))
    raw = {k: v.numpy() for k, v in load_file(str(out / f"{NAME}_inputs.safetensors")).items()}
    stamps: list[float] = []
    generated: list[torch.Tensor] = []
    handle = ref._fast_lm_head(policy).register_forward_hook(lambda *_: stamps.append(time.perf_counter()))
    orig = policy.model.sample_actions_fast_kv_cache

    def sample(*args, **kwargs):
        tokens = orig(*args, **kwargs)
        generated.append(tokens)
        return tokens

    policy.model.sample_actions_fast_kv_cache = sample

    def chunk() -> dict:
        stamps.clear()
        start = time.perf_counter()
        frame = prepare_observation_for_inference(
            {k: v.copy() for k, v in raw.items()}, torch.device("cpu"), task=PROMPT, robot_type=""
        )
        post(policy.predict_action_chunk(pre(frame)))
        end = time.perf_counter()
        n = len(stamps)
        return {
            "chunk_ms": (end - start) * 1e3,
            "time_to_first_token_ms": (stamps[0] - start) * 1e3,
            "tokens_per_s": (n - 1) / (stamps[-1] - stamps[0]) if n > 1 else 0.0,
            "tokens": n,
        }

    chunk()  # warm-up
    rows = [chunk() for _ in range(runs)]
    handle.remove()
    result = {k: float(np.median([r[k] for r in rows])) for k in rows[0]}
    result["generated"] = generated[-1][0, : int(result["tokens"])].tolist()
    result["threads"] = threads
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--build", action="store_true")
    parser.add_argument("--steps", type=int, default=64, help="max_decoding_steps of the built model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.build:
        build(args.out, args.steps, args.seed)
        return 0
    print(json.dumps(measure(args.out, args.threads, args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
