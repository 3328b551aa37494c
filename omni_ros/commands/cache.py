"""`omni-ros cache list | prune | clear`: the kernel cache that int8 loads build (policy/precision/cache_admin.py)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omni_ros.policy.precision.cache_admin import CachedBuild


def _root(args: argparse.Namespace) -> Path:
    from omni_ros.policy.precision.kernel_cache import cache_root

    configured = args.cache_dir
    if configured is None and args.config:
        from omni_ros.config import load_config

        configured = load_config(args.config).policy.cache_dir
    return cache_root(configured)


def _when(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp)) if stamp else "-"


def _table(rows: list[tuple[CachedBuild, str | None]]) -> None:
    print(f"{'last used':16}  {'built':16}  {'MB':>7}  {'kind':16}  what / why it can go")
    for b, why in rows:
        what = b.field("source") or "(checkpoint not recorded)"
        built = _when(b.field("built_at"))
        print(f"{_when(b.last_used):16}  {built:16}  {b.bytes / 1e6:7.1f}  {b.kind:16}  {what}")
        print(f"{'':62}{b.folder}" + (f"\n{'':62}can go: {why}" if why else ""))


def _plan(args: argparse.Namespace, builds: list[CachedBuild]) -> list[tuple[CachedBuild, str]]:
    from omni_ros import cpu_features
    from omni_ros.policy.precision.cache_admin import prune_plan

    return prune_plan(
        builds, cpu_key=cpu_features.detect().key(), unused_days=args.unused_days, other_cpus=args.other_cpus
    )


def run_list(args: argparse.Namespace) -> int:
    from omni_ros.policy.precision.cache_admin import scan

    root = _root(args)
    builds = scan(root)
    reasons = {b.folder: why for b, why in _plan(args, builds)}
    if args.json:
        print(json.dumps([{**b.describe(), "can_go": reasons.get(b.folder)} for b in builds], indent=1))
        return 0
    if not builds:
        print(f"{root / 'kernels'}: empty")
        return 0
    _table([(b, reasons.get(b.folder)) for b in builds])
    total = sum(b.bytes for b in builds)
    freeable = sum(b.bytes for b in builds if b.folder in reasons)
    print(
        f"{len(builds)} entries, {total / 1e6:.0f} MB in {root / 'kernels'}; `omni-ros cache prune` frees "
        f"{freeable / 1e6:.0f} MB with these options"
    )
    return 0


def _remove(args: argparse.Namespace, root: Path, plan: list[tuple[CachedBuild, str | None]]) -> int:
    """Remove (or, with --dry-run, name) the builds of `plan`, each with why where there is a why."""
    from omni_ros.policy.precision.cache_admin import remove

    for build, why in plan:
        said = f"{'would remove' if args.dry_run else 'removing'} {build.folder} ({build.bytes / 1e6:.0f} MB)"
        print(said + (f": {why}" if why else ""))
        if not args.dry_run:
            remove(build)
    verb = "would free" if args.dry_run else "freed"
    print(f"{len(plan)} entries, {verb} {sum(b.bytes for b, _ in plan) / 1e6:.0f} MB in {root / 'kernels'}")
    return 0


def run_prune(args: argparse.Namespace) -> int:
    from omni_ros.policy.precision.cache_admin import scan

    root = _root(args)
    return _remove(args, root, list(_plan(args, scan(root))))


def run_clear(args: argparse.Namespace) -> int:
    from omni_ros.policy.precision.cache_admin import scan

    root = _root(args)
    return _remove(args, root, [(build, None) for build in scan(root)])


def _prune_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--unused-days",
        type=float,
        metavar="N",
        help="also remove entries no load has read for N days (a load touches its entry's manifest)",
    )
    p.add_argument(
        "--other-cpus",
        action="store_true",
        help="also remove entries built for another CPU (kept by default: a cache folder may be shared by machines)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cache",
        help="list, prune or clear the kernel cache: the int8 programs and kernels a checkpoint's first int8 load "
        "builds for this CPU (minutes each, 0.5 GB for a full-size SmolVLA), reused by later loads",
        description="The kernel cache holds what int8 loads build once per checkpoint, CPU and tool versions. A "
        "build removes its own earlier builds (same checkpoint folder, CPU and kind); `prune` removes what this "
        "install can never load (built by other omni_ros / torch / ExecuTorch / torchao versions, a program built "
        "from other omni_ros model or export code, unreadable, a build stopped a day ago) and, when asked, what "
        "went unused or belongs to other CPUs. A removed entry is "
        "rebuilt by the next load that needs it.",
    )
    actions = p.add_subparsers(dest="action", required=True)
    subcommands = (
        (
            "list",
            run_list,
            "every entry: last use, build time, size, checkpoint, and whether `prune` (with the same "
            "options) would remove it",
        ),
        (
            "prune",
            run_prune,
            "remove the entries this install can never load (and, when asked, those unused for N "
            "days or built for other CPUs)",
        ),
        ("clear", run_clear, "remove every entry (the next int8 load rebuilds what it needs)"),
    )
    for name, func, help in subcommands:
        action = actions.add_parser(name, help=help)
        action.add_argument(
            "--cache-dir",
            help="the cache folder (default: --config's policy.cache_dir, else $OMNI_ROS_CACHE_DIR, else "
            "$XDG_CACHE_HOME/omni_ros or ~/.cache/omni_ros)",
        )
        action.add_argument("--config", help="YAML config whose policy.cache_dir to use")
        if name != "clear":
            _prune_options(action)
        if name == "list":
            action.add_argument("--json", action="store_true", help="print JSON instead of a table")
        else:
            action.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
        action.set_defaults(func=func)
