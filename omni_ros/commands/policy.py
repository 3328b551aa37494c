"""`omni-ros policy info|infer`: inspect a checkpoint or preset, run one inference."""

from __future__ import annotations

import argparse
import json
import sys


def _load(args: argparse.Namespace):
    from omni_ros.backends.factory import load_policy
    from omni_ros.config import PolicyConfig

    config = PolicyConfig(
        preset=args.preset,
        checkpoint=args.checkpoint,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        num_steps=args.steps,
        num_threads=args.threads,
    )
    return load_policy(config)


def run_info(args: argparse.Namespace) -> int:
    from omni_ros.policy import families, layouts
    from omni_ros.policy.pi0.modeling import count_parameters
    from omni_ros.policy.pi0.presets import preset

    if args.checkpoint:
        # Any layout (omni_ros, LeRobot pi0 / pi0.5 / SmolVLA, openpi): config, stats and tokenizer, no weights.
        checkpoint = layouts.read(args.checkpoint)
        cfg, stats = checkpoint.config, checkpoint.norm_stats
        extra = {**checkpoint.extra, "layout": checkpoint.layout, "family": checkpoint.family}
        if checkpoint.tokenizer_source:
            extra["tokenizer"] = checkpoint.tokenizer_source
    else:
        cfg, stats, extra = preset(args.preset), None, {}
    import torch

    # The meta device builds even pi0-sized models without allocating their weights.
    with torch.device("meta"):
        params = count_parameters(families.get(getattr(cfg, "family", "pi0")).build_model(cfg))
    per_camera = cfg.tokens_per_camera if hasattr(cfg, "tokens_per_camera") else cfg.vision.num_tokens
    tile = cfg.tile_size if hasattr(cfg, "tile_size") else cfg.vision.image_size
    info = {
        "source": args.checkpoint or f"preset {args.preset} (random weights)",
        "parameters": params,
        "prefix_tokens": cfg.prefix_len,
        "image_tokens_per_camera": per_camera,
        "config": cfg.to_dict(),
        "norm_stats": None if stats is None else vars(stats),
        "extra": extra,
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"source:      {info['source']}")
    print(f"cameras:     {', '.join(cfg.camera_names)} ({tile}px tile, {per_camera} tokens each)")
    print(f"state/action: {cfg.state_dim} -> {cfg.action_horizon} x {cfg.action_dim} (dt {cfg.action_dt} s)")
    print(f"prefix:      {cfg.prefix_len} tokens ({cfg.tokenizer.max_tokens} prompt, tokenizer {cfg.tokenizer.kind})")
    print(f"sampler:     {cfg.num_steps} Euler steps")
    for part, count in params.items():
        print(f"params {part:>9}: {count:,} ({count / 1e6:.1f}M)")
    return 0


def run_infer(args: argparse.Namespace) -> int:
    import numpy as np

    policy = _load(args)
    meta = policy.metadata
    images = {}
    if args.image:
        import cv2

        for item in args.image:
            name, _, path = item.rpartition("=")
            name = name or meta.camera_names[0]
            bgr = cv2.imread(path, cv2.IMREAD_COLOR)
            if bgr is None:
                print(f"omni-ros: cannot read image '{path}'", file=sys.stderr)
                return 2
            images[name] = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    else:
        rng = np.random.default_rng(0)
        images = {n: rng.integers(0, 255, (480, 640, 3), dtype=np.uint8) for n in meta.camera_names}
    state = np.array(args.state, dtype=np.float32) if args.state else np.zeros(meta.state_dim, np.float32)
    obs = {"images": images, "state": state, "prompt": args.prompt}
    for _ in range(args.warmup):
        policy.infer(obs)
    result = policy.infer(obs)
    actions = result["actions"]
    np.set_printoptions(precision=4, suppress=True, linewidth=120)
    print(f"model {meta.model} on {meta.backend}: actions {actions.shape[0]} x {actions.shape[1]}")
    rows = actions if args.all else actions[: min(5, len(actions))]
    print(rows)
    if not args.all and len(actions) > len(rows):
        print(f"... ({len(actions) - len(rows)} more rows; --all prints every row)")
    print(
        "timing (ms): "
        + ", ".join(f"{k.removesuffix('_ms')} {v:.1f}" for k, v in result["policy_timing"].items() if k.endswith("_ms"))
    )
    if args.out:
        np.save(args.out, actions)
        print(f"saved {args.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("policy", help="inspect a policy (info) or run one inference (infer)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--checkpoint", help="checkpoint directory (config.json + model.safetensors)")
        q.add_argument("--preset", default="small", help="built-in architecture when no checkpoint (tiny, small, pi0)")

    info = actions.add_parser("info", help="a checkpoint's (or preset's) config and parameter count")
    common(info)
    info.add_argument("--json", action="store_true", help="print everything as JSON")
    info.set_defaults(func=run_info)

    infer = actions.add_parser("infer", help="run one inference on image files or synthetic input")
    common(infer)
    infer.add_argument(
        "--image",
        action="append",
        metavar="[CAMERA=]PATH",
        help="image file for a camera (repeatable); default: synthetic 640x480 frames",
    )
    infer.add_argument("--state", type=float, nargs="+", help="proprioceptive state (default zeros)")
    infer.add_argument("--prompt", default="reach the red block", help="task prompt")
    infer.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    infer.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    infer.add_argument("--seed", type=int, default=0, help="noise seed")
    infer.add_argument("--steps", type=int, default=None, help="Euler steps (default: the model's)")
    infer.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    infer.add_argument("--warmup", type=int, default=1, help="untimed runs before the reported one")
    infer.add_argument("--all", action="store_true", help="print every action row")
    infer.add_argument("--out", help="save the chunk as .npy")
    infer.set_defaults(func=run_infer)
