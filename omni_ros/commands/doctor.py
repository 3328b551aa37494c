"""`omni-ros doctor`: a live check of the ROS graph against the config (omni_ros/bringup/doctor.py)."""

from __future__ import annotations

import argparse

from omni_ros.commands.common import add_config_args, config_from_args


def run(args: argparse.Namespace) -> int:
    from omni_ros.bringup import doctor

    return doctor.run(config_from_args(args), args.seconds)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="join the ROS graph and report, per input the config expects, publishers, type, rate, age, image "
        "size/encoding and joint names; exit 0 only when the policy node would have what it needs",
    )
    add_config_args(p)
    p.add_argument("--seconds", type=float, default=5.0, help="how long to listen (default 5)")
    p.set_defaults(func=run)
