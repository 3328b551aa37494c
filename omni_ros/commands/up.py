"""`omni-ros up`: start the nodes."""

from __future__ import annotations

import argparse

from omni_ros.commands.common import add_config_args, config_from_args, precision_argv, sim_config_path


def run(args: argparse.Namespace) -> int:
    from omni_ros.launcher import run_stack

    # With --processes every node reads the file itself: hand on the simulator's when none was given.
    config_path = args.config or (str(sim_config_path(args.sim)) if args.sim else None)
    return run_stack(
        config_from_args(args),
        sim=bool(args.sim),
        duration=args.duration,
        bridge=args.bridge,
        tts=args.tts,
        processes=args.processes,
        config_path=config_path,
        policy_args=precision_argv(args),
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up",
        help="start the nodes: policy (+ sim robot with --sim, + OpenPI bridge, + TTS); Ctrl-C stops them",
        description="Start the omni_ros nodes in one process (shared policy and executor) or, with "
        "--processes, one process per node. With --sim the simulated robot is started too and commands flow "
        "(dry_run off): `--sim` the planar arm, `--sim so101` the SO-101 in MuJoCo; on a real robot the default "
        "config is a dry run until you turn it off.",
    )
    add_config_args(p, policy=True)
    p.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: run until Ctrl-C)")
    p.add_argument("--bridge", action="store_true", help="also serve the policy over the OpenPI WebSocket bridge")
    p.add_argument("--tts", action="store_true", help="also start the voice-feedback (TTS) node")
    p.add_argument("--processes", action="store_true", help="one OS process per node instead of one for all")
    p.set_defaults(func=run)
