"""Helpers shared by subcommands."""

from __future__ import annotations

import argparse

from omni_ros import cpu_threads
from omni_ros.config import CONFIG_DIR, OmniConfig, load_config


def add_config_args(parser: argparse.ArgumentParser, sim: bool = True) -> None:
    parser.add_argument(
        "--config", help="YAML config file (default: config/default.yaml, or config/sim.yaml with --sim)"
    )
    if sim:
        parser.add_argument("--sim", action="store_true", help="the simulated robot: config/sim.yaml, dry_run off")


def config_from_args(args: argparse.Namespace) -> OmniConfig:
    sim = getattr(args, "sim", False)
    path = args.config or CONFIG_DIR / ("sim.yaml" if sim else "default.yaml")
    config = load_config(path)
    if sim:
        # The simulated robot is safe to drive, whatever the file says.
        config.robot.dry_run = False
    # Every command reads its config before it imports torch: the thread settings take effect here.
    cpu_threads.configure(config.policy)
    return config
