"""`omni-ros up`: start the nodes."""

from __future__ import annotations

import argparse

from omni_ros.commands.common import add_config_args, config_from_args


def run(args: argparse.Namespace) -> int:
    from omni_ros.launcher import run_stack

    return run_stack(config_from_args(args), sim=args.sim, duration=args.duration)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="start the omni_ros nodes in one process (Ctrl-C stops them)")
    add_config_args(p)
    p.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: run until Ctrl-C)")
    p.set_defaults(func=run)
