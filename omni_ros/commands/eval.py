"""`omni-ros eval BAG [BAG ...]`: replay recorded episodes through the robot's code path and score the policy."""

from __future__ import annotations

import argparse
import sys

from omni_ros.commands.common import add_config_args, config_from_args
from omni_ros.typed_config import ConfigError


def _config(args: argparse.Namespace, command: str = "omni-ros eval"):
    """--config / --sim when given; else the config the bags were recorded with; else config/default.yaml.

    Episode markers the chosen config lacks come from the bag when it recorded some.
    """
    from omni_ros.eval.recorded import apply_recorded_markers, recorded_config

    recorded = recorded_config(args.bags)
    if recorded is not None and args.config is None and not args.sim:
        print(f"{command}: using the {recorded.describe()}", file=sys.stderr)
        from omni_ros import cpu_threads

        cpu_threads.configure(recorded.config.policy)
        return recorded.config
    config = config_from_args(args)
    if recorded is not None and apply_recorded_markers(config, recorded):
        ev = config.eval
        print(
            f"{command}: episode markers from {recorded.bag}: {ev.episode_marker_topic or '-'}, "
            f"gap {ev.episode_gap_s:g} s",
            file=sys.stderr,
        )
    return config


def _instant_args(config, args: argparse.Namespace) -> None:
    """`--rate` / `--every`: when the inference instants fall (eval.rate_hz, eval.every_k_frames)."""
    if args.rate is not None:
        config.eval.rate_hz = args.rate
    if args.every is not None:
        config.eval.every_k_frames = args.every


def run_dataset(args: argparse.Namespace) -> int:
    """`eval --dataset DIR`: a LeRobotDataset folder through the same offline evaluation, its `action` the truth."""
    from omni_ros.dataset.reader import DatasetFolder
    from omni_ros.dataset.replay_source import dataset_config, opener
    from omni_ros.eval.evaluate import evaluate

    if args.bags:
        raise ConfigError("give bags or --dataset, not both")
    if args.realtime or args.ray:
        raise ConfigError("--dataset is evaluated offline (no --realtime / --ray)")
    config = config_from_args(args)
    _instant_args(config, args)
    config = dataset_config(config, DatasetFolder(args.dataset))
    if args.prompt is not None:
        config.eval.prompt = args.prompt
    evaluation = evaluate(
        [args.dataset], config, out_dir=args.out, progress=not args.quiet, opener=opener(config, args.episodes)
    )
    print(evaluation.summary)
    sys.stdout.flush()
    return 0


def run(args: argparse.Namespace) -> int:
    if args.dataset is not None:
        return run_dataset(args)
    if not args.bags:
        raise ConfigError("no bags given (or --dataset DIR)")
    config = _config(args)
    _instant_args(config, args)
    if args.prompt is not None:
        config.eval.prompt = args.prompt
    if args.ray and args.realtime:
        raise ConfigError("--ray and --realtime do not combine: real time plays one bag to one running node")
    if args.ray:
        from omni_ros.eval.distributed import evaluate_ray

        evaluation = evaluate_ray(
            args.bags, config, out_dir=args.out, progress=not args.quiet, address=args.ray_address
        )
    elif args.realtime:
        from omni_ros.eval.realtime import evaluate_realtime

        evaluation = evaluate_realtime(
            args.bags, config, out_dir=args.out, progress=not args.quiet, discovery_timeout_s=args.wait
        )
    else:
        from omni_ros.eval.evaluate import evaluate

        evaluation = evaluate(args.bags, config, out_dir=args.out, progress=not args.quiet)
    print(evaluation.summary)
    sys.stdout.flush()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="replay rosbags through the assembler and policy; metrics.json, report.html and a summary",
        description="Replay recorded rosbag2 episodes (mcap or sqlite3) through the policy node's observation "
        "assembly and the configured policy, and score the predicted chunks against the recorded commands. "
        "Topics and scoring come from the config's eval: section; without --config or --sim, a bag written by "
        "`omni-ros bag record-sim` brings the config it was recorded with (robot, topics, episode markers). "
        "With --realtime the bag is instead played with its original timing to a running policy node over ROS, "
        "and what the node publishes is scored.",
    )
    p.add_argument("bags", nargs="*", metavar="BAG", help="rosbag2 directory, .mcap or .db3 file")
    p.add_argument(
        "--dataset",
        metavar="DIR",
        help="evaluate on a LeRobotDataset v3.0 folder instead of bags: its frames through the same feed, assembler "
        "and policy, its `action` as the ground truth (cameras, state and task from the dataset; policy, robot and "
        "control from --config)",
    )
    p.add_argument("--episodes", type=int, nargs="+", metavar="N", help="with --dataset: only these episode indices")
    add_config_args(p, policy=True)
    p.add_argument("--out", default="eval_out", help="output directory (default: eval_out)")
    p.add_argument("--rate", type=float, help="inference instants at this rate in Hz (overrides eval.rate_hz)")
    p.add_argument("--every", type=int, help="an inference instant every k-th trigger frame (eval.every_k_frames)")
    p.add_argument("--prompt", help="a fixed prompt instead of the bag's prompt topic (eval.prompt)")
    p.add_argument("--realtime", action="store_true", help="play the bag to a running policy node over ROS")
    p.add_argument("--wait", type=float, default=30.0, help="real time: seconds to wait for the policy node")
    p.add_argument(
        "--ray",
        action="store_true",
        help="replay the bags in parallel as Ray tasks (a local Ray cluster unless --ray-address); same report",
    )
    p.add_argument("--ray-address", metavar="ADDRESS", help="with --ray: run the tasks on this running Ray cluster")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
