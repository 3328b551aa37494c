"""`omni-ros node NAME`: run one node in its own process (what launch files and `up --processes` start)."""

from __future__ import annotations

import argparse
import importlib

from omni_ros.commands.common import add_sim_arg, sim_config_path
from omni_ros.config import CONFIG_DIR

NODES = {
    "policy": "omni_ros.nodes.policy_node",
    "sim": "omni_ros.nodes.sim_robot_node",
    "bridge": "omni_ros.nodes.bridge_node",
    "tts": "omni_ros.nodes.tts_node",
}


def run(args: argparse.Namespace) -> int:
    config = args.config or str(sim_config_path(args.sim) if args.sim else CONFIG_DIR / "default.yaml")
    argv = ["--config", config, *args.rest]
    if args.sim and args.name == "policy":
        argv.append("--sim")
    return importlib.import_module(NODES[args.name]).main(argv)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("node", help="run one node (policy, sim, bridge, tts) in this process")
    p.add_argument("name", choices=sorted(NODES), help="which node")
    p.add_argument("--config", help="YAML config (default: config/default.yaml, or the simulator's with --sim)")
    add_sim_arg(p)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="node options and --ros-args ...")
    p.set_defaults(func=run)
