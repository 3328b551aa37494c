"""`omni-ros checkpoint migrate`: rewrite a LeRobot <= 0.3 policy folder in LeRobot >= 0.4's layout."""

from __future__ import annotations

import argparse
import json


def run_migrate(args: argparse.Namespace) -> int:
    from omni_ros.policy.layouts.migrate import migrate

    report = migrate(args.old, args.out, force=args.force)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"migrated {report['type']} {report['from']} -> {report['to']} (LeRobot >= 0.4 layout)")
    print(
        f"  weights: {report['tensors']} tensors, statistics buffers moved to {', '.join(report['statistics_files'])}"
    )
    if report["dropped_config_fields"]:
        print(f"  config fields LeRobot >= 0.4 does not have, left out: {', '.join(report['dropped_config_fields'])}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("checkpoint", help="convert checkpoint folders (migrate a LeRobot <= 0.3 folder)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    m = actions.add_parser(
        "migrate",
        help="write a LeRobot <= 0.3 pi0 / SmolVLA folder (statistics in the weights) in LeRobot >= 0.4's layout",
    )
    m.add_argument("old", help="the folder LeRobot <= 0.3 saved (config.json + model.safetensors)")
    m.add_argument("--out", required=True, help="the new folder")
    m.add_argument("--force", action="store_true", help="replace --out if it exists")
    m.add_argument("--json", action="store_true", help="print the report as JSON")
    m.set_defaults(func=run_migrate)
