"""`omni-ros sim collect|eval`: demonstrations from the scripted expert, closed-loop evaluation of a policy."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from omni_ros.commands.common import add_precision_args, apply_precision_args


def _sim_config(args: argparse.Namespace) -> Any:
    from omni_ros.config import CONFIG_DIR, load_config

    return load_config(args.config or CONFIG_DIR / "sim.yaml")


def _policy(
    args: argparse.Namespace, checkpoint: str | None, preset_name: str | None, rtc_method: str | None = None
) -> Any:
    from omni_ros.backends.factory import load_policy
    from omni_ros.policy.config import PolicyConfig

    config = PolicyConfig(
        checkpoint=checkpoint,
        preset=preset_name or "demo",
        device=args.device,
        num_threads=args.threads,
        seed=0,
        precision=getattr(args, "precision", None) or "auto",
        int8_kernel=getattr(args, "int8_kernel", None) or "auto",
        compile=bool(getattr(args, "compile", None)),
    )
    return load_policy(config, camera_names=["base", "wrist"], rtc_method=rtc_method)


def run_collect(args: argparse.Namespace) -> int:
    from omni_ros.progress import Progress
    from omni_ros.sim.collect import CollectOptions, collect
    from omni_ros.sim.dataset import DatasetMeta, DatasetWriter
    from omni_ros.typed_config import to_dict

    config = _sim_config(args)
    sim = config.sim
    if args.n_blocks is not None:
        sim.n_blocks = args.n_blocks
    options = CollectOptions()
    for key in ("horizon", "action_dt", "latency", "episode_time_s", "noise_prob", "noise_xy", "driver_prob"):
        value = getattr(args, key)
        if value is not None:
            setattr(options, key, value)
    driver = None
    if args.driver:
        policy = _policy(args, args.driver, None)
        if options.driver_prob <= 0:
            options.driver_prob = 0.5
        driver = lambda obs: policy.infer(obs)["actions"]  # noqa: E731
    seeds = range(args.seed, args.seed + args.episodes)
    info = {
        "seeds": [seeds.start, seeds.stop],
        "options": to_dict(options),
        "driver": args.driver,
        "sim": to_dict(sim),
    }
    meta = DatasetMeta(
        cameras=list(sim.cameras),
        state_dim=sim.n_joints,
        action_dim=sim.n_joints,
        horizon=options.horizon,
        action_dt=options.action_dt,
        info=info,
    )
    writer = DatasetWriter(args.out, meta, shard_size=args.shard_size, append=args.append)
    bar = Progress(args.episodes, "collect", every=max(1, args.episodes // 20))
    stats = {"samples": 0, "success": 0}

    def on_episode(samples: list, result: Any) -> None:
        for sample in samples:
            writer.add(sample)
        stats["samples"] += len(samples)
        stats["success"] += int(result.success)
        bar.update(1, samples=stats["samples"])

    collect(sim, options, seeds, on_episode, driver=driver, noise_seed=args.seed)
    meta.info["executed_success_rate"] = stats["success"] / max(1, args.episodes)
    writer.close()
    print(
        f"omni-ros sim collect: {args.episodes} episodes (seeds {seeds.start}..{seeds.stop - 1}), "
        f"{stats['samples']} samples -> {args.out} ({meta.samples} in the dataset); "
        f"executed episodes reached the block in {100 * meta.info['executed_success_rate']:.0f}%"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="the simulated robot: collect demonstrations, evaluate a policy closed-loop")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    c = actions.add_parser(
        "collect",
        help="record expert demonstrations (noise-injected, optionally DAgger) as a training dataset",
        description="Run the scripted expert in the simulator and record, at every chunk request, the camera "
        "images, joint state, prompt and the expert's action chunk (compressed .npz shards in --out).",
    )
    c.add_argument("--episodes", type=int, default=100, help="episodes (one layout each)")
    c.add_argument("--out", required=True, help="dataset folder")
    c.add_argument("--seed", type=int, default=0, help="first episode seed (episodes use seed..seed+N-1)")
    c.add_argument(
        "--config",
        help="config whose sim: section describes the robot (default config/sim.yaml, the planar arm; "
        "config/sim_so101.yaml: the SO-101 in MuJoCo)",
    )
    c.add_argument("--append", action="store_true", help="add episodes to an existing dataset in --out")
    c.add_argument("--n-blocks", type=int, help="blocks on the table (default: sim.n_blocks; 1 is a warm-up)")
    c.add_argument("--horizon", type=int, help="actions per expert chunk (default 16, the demo preset's)")
    c.add_argument("--action-dt", type=float, help="seconds between actions (default 0.05)")
    c.add_argument("--latency", type=float, help="simulated inference latency, s (default 0.1)")
    c.add_argument("--episode-time-s", type=float, help="episode length, s (default 5)")
    c.add_argument("--noise-prob", type=float, help="probability an executed chunk is perturbed (default 0.4)")
    c.add_argument("--noise-xy", type=float, help="std of a perturbed chunk's goal offset, m (default 0.08)")
    c.add_argument("--driver", metavar="CHECKPOINT", help="DAgger: a policy whose chunks run, labelled by the expert")
    c.add_argument("--driver-prob", type=float, help="probability the driver's chunk runs (default 0.5 with --driver)")
    c.add_argument("--shard-size", type=int, default=500, help="samples per .npz shard")
    c.add_argument("--device", default="cpu", help="device of the --driver policy")
    c.add_argument("--threads", type=int, default=0, help="torch threads of the --driver policy")
    add_precision_args(c)
    c.set_defaults(func=run_collect)
    _register_eval(actions)


def _random_like(policy: Any) -> Any:
    """The same architecture with seeded random weights and the same normalization: the chance baseline
    (None for a policy whose architecture is not known here, e.g. a remote one)."""
    from omni_ros.policy.loading import from_model
    from omni_ros.policy.pi0.presets import seeded_model
    from omni_ros.policy.pi0.processing import Pi0Processor

    if not isinstance(getattr(policy, "processor", None), Pi0Processor):
        return None

    cfg, stats = policy.processor.cfg, policy.processor.norm_stats
    return from_model(
        seeded_model(cfg, 1234), stats, device=str(policy.runner.device), name=f"{cfg.name} (random weights)"
    )


def run_eval(args: argparse.Namespace) -> int:
    from omni_ros.control.executor import check_rtc_support, rtc_method
    from omni_ros.progress import Progress
    from omni_ros.sim.evaluate import EpisodeRecord, EvalOptions, action_error, evaluate, write_video

    config = _sim_config(args)
    if args.blending:  # replace, not assign: the control config checks itself again (rtc needs latency comp.)
        config.control = dataclasses.replace(config.control, blending=args.blending)
    # The RTC method it will ask for: `int8_kernel: auto` picks a kernel that serves it.
    rtc = rtc_method(config.control)
    if args.checkpoint or args.preset:
        policy = _policy(args, args.checkpoint, args.preset, rtc)
    else:
        from omni_ros.backends.factory import load_policy

        if args.threads:
            config.policy.num_threads = args.threads
        apply_precision_args(config, args)
        names = [c.name for c in config.topics.cameras]
        policy = load_policy(config.policy, camera_names=names, state_dim=config.sim.n_joints, rtc_method=rtc)
    meta = policy.metadata
    check_rtc_support(config.control, policy)
    report: dict[str, Any] = {
        "policy": meta.model,
        "backend": meta.backend,
        "latency_s": args.latency,
        "blending": config.control.blending,
    }

    def chunks(p: Any):
        def run(obs: dict, rtc: Any = None) -> Any:
            return (p.infer(obs) if rtc is None else p.infer(obs, rtc=rtc))["actions"]

        return run

    if args.offline:
        from itertools import islice

        from omni_ros.sim.dataset import iter_samples

        samples = list(islice(iter_samples(args.offline), args.offline_samples))
        report["offline"] = {meta.model: action_error(chunks(policy), samples)}
        print(f"offline action error on {len(samples)} samples of {args.offline}:")
        for name, row in report["offline"].items():
            print(f"  {name}: policy {row['policy_mae_rad']:.4f} rad vs holding still {row['hold_still_mae_rad']:.4f}")
    options = EvalOptions(
        episodes=args.episodes,
        seed=args.seed,
        latency=args.latency,
        prompt_following=not args.no_prompt_following,
        video_episodes=args.video_episodes if args.video else 0,
    )
    candidates = [(meta.model, policy)]
    baseline = _random_like(policy) if args.baseline else None
    if baseline is not None:
        candidates.append((baseline.metadata.model, baseline))
    report["results"] = []
    for name, p in candidates:
        runs = options.episodes * (2 if options.prompt_following else 1)
        bar = Progress(runs, f"eval {name}", every=max(1, runs // 10))

        def on_episode(r: EpisodeRecord, bar: Progress = bar) -> None:
            bar.update(1, ok=int(r.success))

        score, clips = evaluate(
            name,
            chunks(p),
            config.sim,
            options,
            action_dt=p.metadata.action_dt,
            control=config.control,
            on_episode=on_episode,
        )
        report["results"].append(score.summary())
        if clips and p is policy:
            path = write_video(clips, args.video, scale=args.video_scale)
            report["video"] = str(path)
    for row in report["results"]:
        pf = row["prompt_following_rate"]
        tts = row["mean_time_to_success"]
        print(
            f"{row['name']}: success {100 * row['success_rate']:.0f}% of {row['episodes']} "
            f"(seeds {args.seed}..{args.seed + args.episodes - 1})"
            + (f", prompt following {100 * pf:.0f}%" if pf is not None else "")
            + (f", time to success {tts:.2f} s" if tts is not None else "")
            + f", wrong block {100 * row['wrong_block_rate']:.0f}%"
        )
    if "video" in report:
        print(f"video: {report['video']}")
    if args.json:
        from pathlib import Path

        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.min_success is not None and report["results"][0]["success_rate"] < args.min_success:
        print(f"success below --min-success {args.min_success}", file=sys.stderr)
        return 1
    return 0


def _register_eval(actions: argparse._SubParsersAction) -> None:
    from omni_ros.sim.evaluate import HELD_OUT_SEED

    e = actions.add_parser(
        "eval",
        help="closed-loop success rate, prompt following and time to success of a policy in the simulator",
        description="Run a policy closed-loop on held-out seeds through the real chunk executor, next to a "
        "random-weight policy of the same size. Default policy: the one config/sim.yaml names (the shipped demo).",
    )
    e.add_argument("--episodes", type=int, default=50, help="held-out layouts (each also run with another prompt)")
    e.add_argument("--seed", type=int, default=HELD_OUT_SEED, help=f"first seed (default {HELD_OUT_SEED})")
    e.add_argument("--checkpoint", help="checkpoint folder (default: the policy of --config)")
    e.add_argument("--preset", help="evaluate a built-in architecture with random weights instead")
    e.add_argument(
        "--config",
        help="config with sim:, control: and policy: sections (default config/sim.yaml; config/sim_so101.yaml: "
        "the SO-101 in MuJoCo)",
    )
    e.add_argument("--latency", type=float, default=0.1, help="simulated inference latency, s")
    e.add_argument(
        "--blending",
        choices=["latest", "linear", "ensemble", "rtc"],
        help="how a new chunk takes over (default: control.blending of --config); rtc: real-time chunking",
    )
    e.add_argument("--no-baseline", dest="baseline", action="store_false", help="skip the random-weight policy")
    e.add_argument("--no-prompt-following", action="store_true", help="skip the second prompt per layout")
    e.add_argument("--video", help="write the first episodes as .gif/.webp/.mp4")
    e.add_argument("--video-episodes", type=int, default=3, help="layouts in the video (each with both prompts)")
    e.add_argument("--video-scale", type=float, default=1.0, help="scale of the video frames")
    e.add_argument("--offline", metavar="DATASET", help="also report action error on recorded expert samples")
    e.add_argument("--offline-samples", type=int, default=500, help="samples read from --offline")
    e.add_argument("--json", help="write the report as JSON")
    e.add_argument("--min-success", type=float, help="exit 1 if the success rate is below this fraction")
    e.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    e.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    add_precision_args(e)
    e.set_defaults(func=run_eval)
