"""The `omni-ros` command: one subcommand per module in omni_ros/commands."""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence

from omni_ros import __version__, commands
from omni_ros.errors import OmniRosError

# Order of subcommands in --help; modules not listed follow alphabetically.
ORDER = ["up", "policy", "serve", "say", "eval", "sim", "train", "export", "bag", "config", "doctor", "run"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omni-ros",
        description="Serve vision-language-action robot policies over ROS 2 and OpenPI WebSockets.",
        epilog="Run `omni-ros COMMAND --help` for the options of one command.",
    )
    parser.add_argument("--version", action="version", version=f"omni-ros {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    names = [m.name for m in pkgutil.iter_modules(commands.__path__) if m.name != "common"]
    for name in sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n)):
        importlib.import_module(f"omni_ros.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except OmniRosError as exc:
        print(f"omni-ros: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
