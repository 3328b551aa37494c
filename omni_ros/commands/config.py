"""`omni-ros config init|check|show`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omni_ros.commands.common import add_config_args, config_from_args
from omni_ros.typed_config import to_dict


def run(args: argparse.Namespace) -> int:
    if args.action == "init":
        return run_init(args)
    config = config_from_args(args)
    if args.action == "show":
        print(json.dumps(to_dict(config), indent=2))
        return 0
    source = args.config or "built-in config"
    checkpoint = args.checkpoint or config.policy.checkpoint
    if not checkpoint:
        print(f"{source}: ok (schema only: no checkpoint to check against; pass --checkpoint DIR)")
        return 0
    from omni_ros.bringup.checkpoint_config import check, inspect

    io = inspect(checkpoint, tokenizer=args.tokenizer or config.policy.tokenizer)
    problems, warnings = check(config, io)
    for warning in warnings:
        print(f"{source}: warning: {warning}", file=sys.stderr)
    if problems:
        for problem in problems:
            print(f"{source}: {problem}", file=sys.stderr)
        print(f"{source}: does not fit checkpoint {io.path} ({len(problems)} problem(s))", file=sys.stderr)
        return 1
    print(f"{source}: ok against checkpoint {io.path} (cameras {io.cameras}, {len(config.robot.joint_names)} joints)")
    return 0


def run_init(args: argparse.Namespace) -> int:
    from omni_ros.bringup.checkpoint_config import inspect, render

    if not args.checkpoint:
        print("omni-ros config init: --checkpoint DIR is required", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists() and not args.force:
        print(f"omni-ros config init: {out} exists (--force overwrites)", file=sys.stderr)
        return 2
    io = inspect(args.checkpoint, tokenizer=args.tokenizer)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(io, out), encoding="utf-8")
    names = f"from {io.names_source}" if io.joint_names is not None else "PLACEHOLDERS: replace them"
    print(f"wrote {out}: cameras {io.cameras}, {io.action_dim} joints ({names})")
    problem = io.dim_problem()
    if problem:
        print(f"warning: {problem}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "config",
        help="make a config for a checkpoint, validate one (against its checkpoint), or print it with defaults",
    )
    p.add_argument(
        "action",
        choices=["init", "check", "show"],
        help="init: write a commented config for --checkpoint to --out; check: validate (against the checkpoint "
        "when the config or --checkpoint names one); show: print as JSON",
    )
    add_config_args(p)
    p.add_argument("--checkpoint", help="checkpoint folder (init: required; check: overrides policy.checkpoint)")
    p.add_argument("--tokenizer", help="tokenizer file or folder for a checkpoint that ships none (openpi)")
    p.add_argument("--out", default="robot.yaml", help="init: the config file to write (default: robot.yaml)")
    p.add_argument("--force", action="store_true", help="init: overwrite --out")
    p.set_defaults(func=run)
