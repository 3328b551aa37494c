"""`omni-ros config check|show`."""

from __future__ import annotations

import argparse
import json

from omni_ros.commands.common import add_config_args, config_from_args
from omni_ros.typed_config import to_dict


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.action == "show":
        print(json.dumps(to_dict(config), indent=2))
    else:
        print(f"{args.config or 'built-in config'}: ok")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="validate a config file, or print it with every default filled in")
    p.add_argument("action", choices=["check", "show"], help="check: validate only; show: print as JSON")
    add_config_args(p)
    p.set_defaults(func=run)
