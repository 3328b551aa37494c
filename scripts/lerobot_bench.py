#!/usr/bin/env python3
"""LeRobot's half of the side-by-side benchmarks: the real LeRobot 0.6.1 policy, timed observation -> chunk.

Runs in the LeRobot venv (`bash scripts/lerobot_venv.sh` makes it). Two policies:

  pi0      the edge size of the real-checkpoint benchmark: 2 cameras, 224 px, SigLIP 384 wide x 6 layers
           (16 heads, patch 14), VLM 512 x 6 (8 heads, 1 KV head, head_dim 64, MLP 2048), expert 256 x 6
           (MLP 1024), horizon 50, 10 denoising steps; vocabulary = the local tokenizer's.
  smolvla  full-size SmolVLA: LeRobot's default SmolVLA config over SmolVLM2-500M dimensions written locally
           (no hub access), random weights, 2 cameras, 512 px, vocabulary 49280.

First run for a policy builds it with seeded random weights and saves it with LeRobot's save_pretrained into
OUT/<name>/ (policy, processors, tokenizer.json; SmolVLA also OUT/<name>/vlm/), with the observation and noise
used in OUT/<name>_inputs.safetensors and OUT/<name>_inputs.json, so that another implementation can load the
very same weights and inputs. Then a fresh child process loads that folder the way LeRobot does and times it:
cold start (imports, from_pretrained + processors, first chunk), `--runs` chunks after `--warmup`, per stage
(preprocessor, vision per camera, prefix forward, one denoising step, postprocessor) and peak RSS. The result is
one JSON object on stdout (also written to OUT/lerobot_<policy>_t<threads>.json); progress goes to stderr.

    .venv-lerobot/bin/python scripts/lerobot_bench.py --policy pi0 --threads 1 --out /tmp/bench_lerobot
"""

from __future__ import annotations

import time

T_PROCESS = time.perf_counter()

import argparse  # noqa: E402  (the clock above starts before the imports it measures)
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent

PI0_EDGE = {
    "siglip": dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=16, patch_size=14),
    "gemma_2b": dict(width=512, depth=6, mlp_dim=2048, num_heads=8, num_kv_heads=1, head_dim=64),
    "gemma_300m": dict(width=256, depth=6, mlp_dim=1024, num_heads=8, num_kv_heads=1, head_dim=64),
    "image_size": 224,
    "chunk_size": 50,
    "num_inference_steps": 10,
}

# SmolVLM2-500M-Video-Instruct (HuggingFaceTB): text = SmolLM2-360M-class Llama decoder, vision = SigLIP
# base-patch16-512, pixel-shuffle scale 4 (64 tokens per 512 px tile). Numbers gathered from public code that
# parses the published config.json (see DESIGN.md section 8); SmolVLA keeps the first 16 text layers.
SMOLVLM2_500M = {
    "vision": dict(
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        image_size=512,
        patch_size=16,
        layer_norm_eps=1e-6,
        hidden_act="gelu_pytorch_tanh",
    ),
    "text": dict(
        model_type="llama",
        hidden_size=960,
        intermediate_size=2560,
        num_hidden_layers=32,
        num_attention_heads=15,
        num_key_value_heads=5,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        hidden_act="silu",
        tie_word_embeddings=False,
    ),
    "scale_factor": 4,
    "vocab_size": 49280,
}

STATE_DIM, ACTION_DIM = 8, 7
PROMPT = "Pick up the red cube and place it on the tray."
CAMERAS = ("observation.images.top", "observation.images.wrist")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def name_for(policy: str) -> str:
    return {"pi0": "pi0_edge", "smolvla": "smolvla_full"}[policy]


# ----------------------------------------------------------------------------------------------------------------
# Build (parent process)
# ----------------------------------------------------------------------------------------------------------------


def build(
    policy: str, out: Path, seed: int, camera_hw: tuple[int, int], dims: tuple[int, int] = (STATE_DIM, ACTION_DIM)
) -> dict:
    state_dim, action_dim = dims
    import contextlib
    import shutil

    import make_reference_fixtures as ref
    import numpy as np
    import torch
    from lerobot.configs import FeatureType, PolicyFeature
    from safetensors.torch import save_file

    name = name_for(policy)
    folder = out / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    h, w = camera_hw
    inputs = {k: PolicyFeature(type=FeatureType.VISUAL, shape=(3, h, w)) for k in CAMERAS}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(state_dim,))
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))}
    stats = ref.dataset_stats(seed + 1, 0, state_dim, action_dim)
    info: dict = {
        "policy": policy,
        "name": name,
        "seed": seed,
        "camera_hw": [h, w],
        "dims_state_action": [state_dim, action_dim],
    }

    t0 = time.perf_counter()
    with contextlib.chdir(folder) if policy == "smolvla" else contextlib.nullcontext():
        if policy == "pi0":
            from lerobot.policies.pi0.configuration_pi0 import PI0Config
            from lerobot.policies.pi0.modeling_pi0 import PI0Policy
            from lerobot.policies.pi0.processor_pi0 import make_pi0_pre_post_processors

            tok = ref.paligemma_hf_tokenizer()
            ref.PI_SIZES.gemma = {k: PI0_EDGE[k] for k in ("gemma_2b", "gemma_300m")}
            ref.PI_SIZES.siglip = PI0_EDGE["siglip"]
            ref.PI_SIZES.vocab = len(tok)
            ref.install_pi_patches()
            tok.save_pretrained(str(folder))
            ref._LocalAutoTokenizer.folders[ref.PALIGEMMA_TOKENIZER_NAME] = folder
            side = PI0_EDGE["image_size"]
            config = PI0Config(
                input_features=inputs,
                output_features=outputs,
                chunk_size=PI0_EDGE["chunk_size"],
                n_action_steps=PI0_EDGE["chunk_size"],
                num_inference_steps=PI0_EDGE["num_inference_steps"],
                image_resolution=(side, side),
                device="cpu",
            )
            with ref.quiet():
                model = PI0Policy(config)
            make = make_pi0_pre_post_processors
            info["dims"] = PI0_EDGE | {"vocab_size": len(tok)}
        else:
            from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
            from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
            from lerobot.policies.smolvla.processor_smolvla import make_smolvla_pre_post_processors

            tok = ref.smolvlm_hf_tokenizer(vocab_size=SMOLVLM2_500M["vocab_size"])
            ref.write_smolvlm_folder(
                folder / ref.SMOLVLM_DIRNAME,
                tok,
                vision=SMOLVLM2_500M["vision"],
                text=SMOLVLM2_500M["text"],
                scale_factor=SMOLVLM2_500M["scale_factor"],
            )
            shutil.copyfile(folder / ref.SMOLVLM_DIRNAME / "tokenizer.json", folder / "tokenizer.json")
            config = SmolVLAConfig(  # LeRobot's defaults otherwise: 16 VLM layers, expert x0.75, 512 px, chunk 50
                input_features=inputs,
                output_features=outputs,
                vlm_model_name=ref.SMOLVLM_DIRNAME,
                load_vlm_weights=False,
                device="cpu",
            )
            with ref.quiet():
                model = SmolVLAPolicy(config)
            make = make_smolvla_pre_post_processors
            info["dims"] = SMOLVLM2_500M | {
                "num_vlm_layers": config.num_vlm_layers,
                "expert_width_multiplier": config.expert_width_multiplier,
                "self_attn_every_n_layers": config.self_attn_every_n_layers,
                "resize_imgs_with_padding": list(config.resize_imgs_with_padding),
                "chunk_size": config.chunk_size,
                "num_steps": config.num_steps,
            }
        log(f"[build] {name}: constructed in {time.perf_counter() - t0:.1f} s; re-drawing weights (seed {seed})")
        ref.randomize_parameters(model, seed)
        pre, post = make(config, dataset_stats=stats)
        with ref.quiet():
            model.save_pretrained(str(folder))
        pre.save_pretrained(str(folder))
        post.save_pretrained(str(folder))
    info["param_count"] = sum(p.numel() for p in model.parameters())
    info["weights_fp32_mb"] = info["param_count"] * 4 / 2**20
    info["build_s"] = time.perf_counter() - t0

    rng = np.random.default_rng(seed + 2)
    tensors = {k: torch.from_numpy(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)) for k in CAMERAS}
    s = stats["observation.state"]
    tensors["observation.state"] = torch.from_numpy(
        (s["mean"] + s["std"] * rng.normal(0.0, 1.0, state_dim)).astype(np.float32)
    )
    gen = torch.Generator().manual_seed(seed + 3)
    tensors["noise"] = torch.randn((1, config.chunk_size, config.max_action_dim), generator=gen)
    save_file(tensors, str(out / f"{name}_inputs.safetensors"))
    (out / f"{name}_inputs.json").write_text(
        json.dumps(
            {
                "prompt": PROMPT,
                "cameras": list(CAMERAS),
                "observation_keys": [*CAMERAS, "observation.state"],
                "noise_shape": list(tensors["noise"].shape),
                "policy_folder": name,
                "build": info,
            },
            indent=1,
        )
    )
    log(f"[build] {name}: {info['param_count'] / 1e6:.1f} M parameters saved in {info['build_s']:.1f} s")
    return info


# ----------------------------------------------------------------------------------------------------------------
# Measure (fresh child process)
# ----------------------------------------------------------------------------------------------------------------


class StageTimer:
    """Wraps the model's own methods to time vision per camera, the prefix forward and each denoising step."""

    def __init__(self, policy, family: str):
        self.times: dict[str, list[float]] = {"vision_per_camera": [], "prefix_forward": [], "denoise_step": []}
        model = policy.model
        owner = model.vlm_with_expert if family == "smolvla" else model.paligemma_with_expert
        self._wrap(owner, "embed_image", "vision_per_camera")
        self._wrap(model, "denoise_step", "denoise_step")
        self._wrap(model, "embed_prefix", "embed_prefix")
        forward = owner.forward

        def timed_forward(*args, **kwargs):
            embeds = kwargs.get("inputs_embeds")
            t0 = time.perf_counter()
            out = forward(*args, **kwargs)
            if embeds is not None and embeds[1] is None:  # prefix only: the prefill that fills the KV cache
                self.times["prefix_forward"].append(time.perf_counter() - t0)
            return out

        owner.forward = timed_forward

    def _wrap(self, obj, attr: str, key: str) -> None:
        fn = getattr(obj, attr)
        self.times.setdefault(key, [])

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.times[key].append(time.perf_counter() - t0)
            return out

        setattr(obj, attr, timed)

    def reset(self) -> None:
        for v in self.times.values():
            v.clear()


def measure(policy_name: str, out: Path, threads: int, runs: int, warmup: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    t_torch = time.perf_counter()
    import make_reference_fixtures as ref
    from lerobot.policies import factory as policy_factory
    from lerobot.policies.utils import prepare_observation_for_inference
    from safetensors.torch import load_file

    t_imports = time.perf_counter()
    name = name_for(policy_name)
    folder = out / name
    meta = json.loads((out / f"{name}_inputs.json").read_text())
    inputs = load_file(str(out / f"{name}_inputs.safetensors"))
    obs = {k: inputs[k].numpy() for k in meta["observation_keys"]}
    noise = inputs["noise"]

    t0 = time.perf_counter()
    import contextlib

    with contextlib.chdir(folder) if policy_name == "smolvla" else contextlib.nullcontext():
        if policy_name == "pi0":
            from lerobot.policies.pi0.modeling_pi0 import PI0Policy as cls

            dims = meta["build"]["dims"]
            ref.PI_SIZES.gemma = {k: dims[k] for k in ("gemma_2b", "gemma_300m")}
            ref.PI_SIZES.siglip = dims["siglip"]
            ref.PI_SIZES.vocab = dims["vocab_size"]
            ref.install_pi_patches()
            ref._LocalAutoTokenizer.folders[ref.PALIGEMMA_TOKENIZER_NAME] = folder
        else:
            from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy as cls
        with ref.quiet():
            policy = cls.from_pretrained(str(folder))
        policy.eval()
        pre, post = policy_factory.make_pre_post_processors(policy.config, pretrained_path=str(folder))
    t_loaded = time.perf_counter()
    rss_loaded = current_rss_mb()
    timer = StageTimer(policy, policy_name)

    def chunk() -> tuple[torch.Tensor, dict[str, float]]:
        policy.reset()
        t_a = time.perf_counter()
        frame = prepare_observation_for_inference(
            {k: v.copy() for k, v in obs.items()}, torch.device("cpu"), task=meta["prompt"], robot_type=""
        )
        batch = pre(frame)
        t_b = time.perf_counter()
        actions = policy.predict_action_chunk(batch, noise=noise.clone())
        t_c = time.perf_counter()
        actions = post(actions)
        t_d = time.perf_counter()
        return actions, {"preprocess": t_b - t_a, "model": t_c - t_b, "postprocess": t_d - t_c, "total": t_d - t_a}

    with torch.inference_mode():
        first_actions, first = chunk()
        t_first = time.perf_counter()
        for _ in range(max(0, warmup - 1)):
            chunk()
        timer.reset()
        totals: dict[str, list[float]] = {}
        for _ in range(runs):
            _, t = chunk()
            for k, v in t.items():
                totals.setdefault(k, []).append(v)

    def summary(values: list[float]) -> dict[str, float]:
        ms = sorted(v * 1000 for v in values)
        return {
            "median_ms": statistics.median(ms),
            "min_ms": ms[0],
            "p90_ms": ms[min(len(ms) - 1, round(0.9 * (len(ms) - 1)))],
            "mean_ms": statistics.fmean(ms),
            "n": len(ms),
        }

    stages = {k: summary(v) for k, v in timer.times.items() if v}
    for k, v in totals.items():
        stages[k] = summary(v)
    return {
        "implementation": "lerobot",
        "lerobot": __import__("lerobot").__version__,
        "torch": torch.__version__.split("+")[0],
        "policy": policy_name,
        "folder": str(folder),
        "threads": threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),  # spin iterations before an idle worker sleeps
        "runs": runs,
        "warmup": warmup,
        "latency_ms": stages["total"]["median_ms"],
        "stages": stages,
        "cold_start": {
            "import_torch_s": t_torch - T_PROCESS,
            "import_lerobot_s": t_imports - t_torch,
            "load_s": t_loaded - t0,
            "first_chunk_s": t_first - t_loaded,
            "total_s": t_first - T_PROCESS,
            "first_chunk_stages_ms": {k: v * 1000 for k, v in first.items()},
        },
        "rss_after_load_mb": rss_loaded,
        "peak_rss_mb": peak_rss_mb(),
        "param_count": sum(p.numel() for p in policy.parameters()),
        "weights_fp32_mb": sum(p.numel() for p in policy.parameters()) * 4 / 2**20,
        "actions_shape": list(first_actions.shape),
        "actions_first_row": [float(x) for x in first_actions[0, 0]],
        "build": meta["build"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", choices=("pi0", "smolvla"), required=True)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the saved policy, inputs and result")
    parser.add_argument("--runs", type=int, default=5, help="timed chunks after warm-up (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed chunks first, the cold one included")
    parser.add_argument("--seed", type=int, default=0, help="weights / inputs seed")
    parser.add_argument("--camera-size", default="480x640", help="raw camera frames HxW (default 480x640)")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the policy even if OUT holds it")
    parser.add_argument(
        "--dims",
        default=f"{STATE_DIM}x{ACTION_DIM}",
        help=f"state x action dims (default {STATE_DIM}x{ACTION_DIM}; 6x6 is the SO-101 arm of bench/realtime.py)",
    )
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.threads < 1 or args.runs < 1 or args.warmup < 1:
        parser.error("--threads, --runs and --warmup must be >= 1")
    out = args.out.resolve()
    sys.path.insert(0, str(SCRIPTS))

    if args.measure_only:
        result = measure(args.policy, out, args.threads, args.runs, args.warmup)
        print(json.dumps(result))
        return 0

    h, w = (int(x) for x in args.camera_size.lower().split("x"))
    name = name_for(args.policy)
    meta_path = out / f"{name}_inputs.json"
    dims = tuple(int(x) for x in args.dims.lower().split("x"))
    want = {"seed": args.seed, "camera_hw": [h, w], "dims_state_action": list(dims)}
    have = json.loads(meta_path.read_text())["build"] if meta_path.exists() else None
    out.mkdir(parents=True, exist_ok=True)
    if args.rebuild or have is None or any(have.get(k) != v for k, v in want.items()):
        build(args.policy, out, args.seed, (h, w), (dims[0], dims[1]))
    else:
        log(f"[build] reusing {out / name} (seed {args.seed}, cameras {h}x{w})")

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--measure-only", "--policy", args.policy]
    cmd += ["--threads", str(args.threads), "--out", str(out), "--runs", str(args.runs), "--warmup", str(args.warmup)]
    log(f"[measure] {name}: {args.threads} thread(s), {args.warmup} warm-up + {args.runs} timed chunks")
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        log(f"[measure] failed with exit code {proc.returncode}")
        return proc.returncode
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    (out / f"lerobot_{args.policy}_t{args.threads}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
