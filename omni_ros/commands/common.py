"""Helpers shared by subcommands."""

from __future__ import annotations

import argparse
from pathlib import Path

from omni_ros import cpu_threads
from omni_ros.config import CONFIG_DIR, OmniConfig, load_config

# `--sim NAME`: the simulator's config file (`--sim` alone: the planar arm).
SIM_CONFIGS = {"planar": "sim.yaml", "so101": "sim_so101.yaml"}


def sim_config_path(name: str | bool) -> Path:
    """The built-in config of simulator `name` (True, from a bare `--sim`, is the planar arm)."""
    return CONFIG_DIR / SIM_CONFIGS["planar" if name is True else str(name)]


def add_sim_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sim",
        nargs="?",
        const="planar",
        choices=sorted(SIM_CONFIGS),
        metavar="NAME",
        help="the simulated robot, dry_run off: 'planar' (the default of a bare --sim, config/sim.yaml) or "
        "'so101' (the SO-101 arm in MuJoCo, config/sim_so101.yaml)",
    )


def add_config_args(parser: argparse.ArgumentParser, sim: bool = True) -> None:
    parser.add_argument(
        "--config", help="YAML config file (default: config/default.yaml, or the simulator's with --sim)"
    )
    if sim:
        add_sim_arg(parser)


def config_from_args(args: argparse.Namespace) -> OmniConfig:
    sim = getattr(args, "sim", None)
    path = args.config or (sim_config_path(sim) if sim else CONFIG_DIR / "default.yaml")
    config = load_config(path)
    if sim:
        # The simulated robot is safe to drive, whatever the file says.
        config.robot.dry_run = False
    # Every command reads its config before it imports torch: the thread settings take effect here.
    cpu_threads.configure(config.policy)
    return config
