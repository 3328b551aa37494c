"""`omni-ros policy info|infer`: inspect a checkpoint or preset, run one inference."""

from __future__ import annotations

import argparse
import json
import sys
import time

from omni_ros.commands.common import add_precision_args


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _load(args: argparse.Namespace):
    from omni_ros.backends.factory import load_policy
    from omni_ros.policy.config import PolicyConfig

    config = PolicyConfig(
        preset=args.preset,
        checkpoint=args.checkpoint,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        num_steps=args.steps,
        num_threads=args.threads,
        tokenizer=args.tokenizer,
        precision=args.precision or "auto",
        int8_kernel=args.int8_kernel or "auto",
        action_dt=getattr(args, "action_dt", None),
        compile=bool(getattr(args, "compile", None)),
    )
    return load_policy(config)


def _duration(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 0.1 else f"{seconds * 1e3:.1f} ms"


def realtime_verdict(latency_s: float, horizon: int, dt: float) -> str:
    """Whether a chunk computed in `latency_s` keeps an arm moving: its motion, the latency's share of it, and
    what that means with one inference at a time (`pause_free_latency_s`; bench/realtime.py measures it live)."""
    from omni_ros.control.executor import held_share, pause_free_latency_s

    motion = horizon * dt
    budget = pause_free_latency_s(horizon, dt)
    head = (
        f"{horizon} actions x {dt:.4g} s = {motion:.2f} s of motion; observation -> chunk {_duration(latency_s)} "
        f"({latency_s / motion:.2f}x of it): "
    )
    if latency_s <= budget:
        return head + f"keeps an arm moving (a chunk may take up to half its motion, {budget:.2f} s)"
    share = held_share(latency_s, horizon, dt)
    if latency_s <= motion:
        return head + (
            f"the arm pauses between chunks, about {share:.0%} of the time: with one inference at a time a chunk "
            f"must take at most half its motion ({budget:.2f} s); try a faster --precision, --compile, more "
            "--threads, fewer cameras"
        )
    return head + (
        f"slower than the motion it plans: the arm moves, stops and waits for each chunk, about {share:.0%} of the "
        "time (control.run_late_chunks)"
    )


def describe(checkpoint) -> dict:
    """What `policy info` reports of a checkpoint read by its layout adapter (family-agnostic fields)."""
    cfg, stats = checkpoint.config, checkpoint.norm_stats
    era = checkpoint.extra.get("lerobot_era")
    return {
        "layout": checkpoint.layout,
        # Which LeRobot wrote a LeRobot folder: ">=0.4" (processor files) or "<=0.3" (statistics in the weights,
        # served with LeRobot 0.3's preprocessing).
        "lerobot_era": era,
        "family": checkpoint.family + (f" ({cfg.variant})" if getattr(cfg, "variant", None) else ""),
        "cameras": list(cfg.camera_names),
        "image_size": cfg.observation_spec().image_size,
        "state_dim": cfg.state_dim,
        "action_dim": cfg.action_dim,
        "model_widths": [
            getattr(cfg, "model_state_dim", cfg.state_dim),
            getattr(cfg, "model_action_dim", cfg.action_dim),
        ],
        "action_horizon": cfg.action_horizon,
        # LeRobot and openpi folders record no action rate: theirs is the default until policy.action_dt sets it.
        "action_dt": cfg.action_dt,
        "action_dt_recorded": checkpoint.layout == "omni_ros",
        "num_steps": cfg.num_steps,
        "normalization": {"state": stats.state_mode, "action": stats.action_mode, "epsilon": stats.eps_rule},
        "tokenizer": {
            "kind": cfg.tokenizer.kind,
            "max_tokens": cfg.tokenizer.max_tokens,
            "source": checkpoint.tokenizer_source or "built in",
        },
        **(
            {"fast_tokenizer": cfg.fast.path, "max_decoding_steps": cfg.max_decoding_steps}
            if checkpoint.family == "pi0_fast"
            else {}
        ),
        **(
            {"domain_id": cfg.domain_id, "num_domains": cfg.head.num_domains, "action_mode": cfg.action_mode}
            if checkpoint.family == "xvla"
            else {}
        ),
    }


def run_info(args: argparse.Namespace) -> int:
    import torch

    from omni_ros import cpu_idle
    from omni_ros.cpu_features import detect
    from omni_ros.policy import families, layouts
    from omni_ros.policy.pi0.modeling import count_parameters
    from omni_ros.policy.pi0.presets import build_preset, preset
    from omni_ros.policy.precision import choose

    if args.checkpoint:
        checkpoint = layouts.read(args.checkpoint, tokenizer=args.tokenizer)
        cfg, extra = checkpoint.config, checkpoint.extra
        summary = describe(checkpoint)
        stats = vars(checkpoint.norm_stats)
        # The meta device builds even pi0-sized models without allocating their weights.
        with torch.device("meta"):
            params = count_parameters(families.get(checkpoint.family).build_model(cfg))
    else:
        cfg, extra, stats = preset(args.preset), {}, None
        summary = {"layout": "preset", "family": "pi0", "cameras": list(cfg.camera_names)}
        with torch.device("meta"):
            params = count_parameters(build_preset(args.preset))
    cpu = detect()
    # pi0 configs count image tokens in vision.num_tokens; SmolVLA's (after its pixel shuffle) in tokens_per_camera.
    per_camera = getattr(cfg, "tokens_per_camera", None) or cfg.vision.num_tokens
    info = {
        "source": args.checkpoint or f"preset {args.preset} (random weights)",
        **summary,
        "parameters": params,
        "prefix_tokens": getattr(cfg, "prefix_len", None),
        "image_tokens_per_camera": per_camera,
        "precision": choose(args.precision or "auto", int8_kernel=args.int8_kernel or "auto").describe(),
        "cpu": {
            "model": cpu.model,
            "arch": cpu.arch,
            "gemm_flags": list(cpu.int8_dot + cpu.bf16),
            "idle_poll": cpu_idle.status().describe(),
        },
        "config": cfg.to_dict(),
        "norm_stats": stats,
        "extra": extra,
    }
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    print(f"source:       {info['source']}")
    saved_by = f" saved by LeRobot {summary['lerobot_era']}" if summary.get("lerobot_era") else ""
    print(f"layout:       {summary['layout']}{saved_by}, family {summary['family']}")
    tile = cfg.observation_spec().image_size
    print(f"cameras:      {', '.join(cfg.camera_names)} ({tile}px tile, {per_camera} tokens each)")
    recorded = summary.get("action_dt_recorded", True)
    dt = f"dt {cfg.action_dt} s" + ("" if recorded else ", not recorded: policy.action_dt")
    print(f"state/action: {cfg.state_dim} -> {cfg.action_horizon} x {cfg.action_dim} ({dt})")
    if args.checkpoint:
        norm, tok = summary["normalization"], summary["tokenizer"]
        widths = summary["model_widths"]
        print(f"model widths: state {widths[0]}, action {widths[1]} (zero-padded / truncated at the robot's dims)")
        print(f"normalize:    state {norm['state']}, action {norm['action']} ({norm['epsilon']} epsilon)")
        print(f"tokenizer:    {tok['kind']}, {tok['max_tokens']} tokens, from {tok['source']}")
    if getattr(cfg, "family", "") == "pi0_fast":
        print(f"decoder:      greedy, up to {cfg.max_decoding_steps} tokens, KV cache; FAST tokenizer {cfg.fast.path}")
    else:
        print(f"sampler:      {cfg.num_steps} Euler steps")
    print(f"precision:    {info['precision']} (on the torch backend here; --precision to choose)")
    print(f"cpu:          {cpu.model or cpu.arch}, GEMM instructions: {', '.join(info['cpu']['gemm_flags']) or 'none'}")
    print(f"idle cores:   polling while inferring {info['cpu']['idle_poll']} (policy.cpu_idle_poll)")
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
    latencies = []
    for _ in range(args.runs):
        start = time.perf_counter()
        result = policy.infer(obs)
        latencies.append(time.perf_counter() - start)
    actions = result["actions"]
    np.set_printoptions(precision=4, suppress=True, linewidth=120)
    print(
        f"model {meta.model} on {meta.backend}, precision {meta.precision}: "
        f"actions {actions.shape[0]} x {actions.shape[1]}"
    )
    rows = actions if args.all else actions[: min(5, len(actions))]
    print(rows)
    if not args.all and len(actions) > len(rows):
        print(f"... ({len(actions) - len(rows)} more rows; --all prints every row)")
    print(
        "timing (ms): "
        + ", ".join(f"{k.removesuffix('_ms')} {v:.1f}" for k, v in result["policy_timing"].items() if k.endswith("_ms"))
        + (
            f"; {result['policy_timing']['tokens_per_s']:.0f} tokens/s"
            if "tokens_per_s" in result["policy_timing"]
            else ""
        )
    )
    runs = f" (median of {args.runs} runs)" if args.runs > 1 else ""
    print(f"real time{runs}: " + realtime_verdict(float(np.median(latencies)), len(actions), meta.action_dt))
    if args.out:
        np.save(args.out, actions)
        print(f"saved {args.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("policy", help="inspect a policy (info) or run one inference (infer)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--checkpoint",
            help="checkpoint folder: omni_ros's, a LeRobot save_pretrained folder (pi0, pi05, smolvla; LeRobot "
            "0.3's too) or an openpi PyTorch one",
        )
        q.add_argument("--preset", default="small", help="built-in architecture when no checkpoint (tiny, small, pi0)")
        q.add_argument(
            "--tokenizer",
            help="tokenizer.json / tokenizer.model (or its folder) for a LeRobot or openpi checkpoint that ships none",
        )
        add_precision_args(q)

    info = actions.add_parser(
        "info",
        help="a checkpoint's layout, family, cameras, dims, normalization, tokenizer and parameter count",
    )
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
    infer.add_argument("--warmup", type=int, default=1, help="untimed runs before the timed ones")
    infer.add_argument(
        "--runs",
        type=_positive,
        default=1,
        help="timed runs; the real-time verdict is on their median (the stage timings are the last run's)",
    )
    infer.add_argument(
        "--action-dt",
        type=float,
        default=None,
        help="seconds between actions (1 / the training dataset's fps; overrides policy.action_dt): what the "
        "real-time verdict measures the chunk's motion with (a LeRobot checkpoint records none)",
    )
    infer.add_argument("--all", action="store_true", help="print every action row")
    infer.add_argument("--out", help="save the chunk as .npy")
    infer.set_defaults(func=run_infer)
