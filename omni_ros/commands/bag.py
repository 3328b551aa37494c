"""`omni-ros bag`: write episodes of the simulated robot as rosbag2, and list what a bag holds."""

from __future__ import annotations

import argparse
import sys

from omni_ros.commands.common import add_config_args, config_from_args


def record_sim(args: argparse.Namespace) -> int:
    from omni_ros.eval.record_sim import record_sim as record

    if args.episodes < 1:
        print("omni-ros bag record-sim: --episodes must be >= 1", file=sys.stderr)
        return 2
    args.sim = True
    config = config_from_args(args)

    def report(k: int, ep) -> None:
        outcome = f"success at {ep.time_to_success:.2f} s" if ep.success else "time-out"
        print(f"episode {k}: seed {ep.seed}, '{ep.prompt}': {outcome}, {ep.duration_s:.2f} s", file=sys.stderr)

    episodes = record(
        config,
        args.out,
        args.episodes,
        storage=args.storage,
        seed=args.seed,
        duration_s=args.duration,
        gap_s=args.gap,
        progress=None if args.quiet else report,
    )
    ok = sum(e.success for e in episodes)
    print(f"wrote {args.out} ({args.storage}): {len(episodes)} episode(s), {ok} successful")
    return 0


def info(args: argparse.Namespace) -> int:
    from omni_ros.eval.bag import Bag

    with Bag(args.bag) as bag:
        print(f"{bag.name}: {bag.storage}, {bag.duration_s:.2f} s, {sum(bag.counts.values())} messages")
        for topic in sorted(bag.topics):
            print(f"  {topic:<45} {bag.topics[topic]:<40} {bag.counts[topic]:>8}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bag", help="rosbag2 tools: record the simulated robot, list a bag's topics")
    bag_sub = p.add_subparsers(dest="bag_command", metavar="SUBCOMMAND", required=True)

    rec = bag_sub.add_parser(
        "record-sim",
        help="write episodes of the simulated robot with the scripted expert as rosbag2",
        description="Run the simulated robot with the scripted expert in simulated time and write what the sim "
        "and policy nodes would publish (camera Images, JointState, prompt, JointTrajectory commands, "
        "ActionChunk) as a rosbag2, ready for `omni-ros eval`.",
    )
    rec.add_argument("--episodes", type=int, default=3, help="number of episodes (default 3)")
    rec.add_argument("--out", required=True, help="bag directory to create (must not exist)")
    rec.add_argument("--storage", choices=["mcap", "sqlite3"], default="mcap", help="storage plugin (default mcap)")
    add_config_args(rec, sim=False)
    rec.add_argument("--seed", type=int, help="seed of the first episode (default: sim.seed)")
    rec.add_argument("--duration", type=float, help="longest episode, s (default: sim.episode_time_s)")
    rec.add_argument("--gap", type=float, default=1.0, help="silence between episodes, s (default 1)")
    rec.add_argument("-q", "--quiet", action="store_true", help="no per-episode lines")
    rec.set_defaults(func=record_sim)

    inf = bag_sub.add_parser("info", help="list the topics, types and message counts of a bag")
    inf.add_argument("bag", help="rosbag2 directory, .mcap or .db3 file")
    inf.set_defaults(func=info)
