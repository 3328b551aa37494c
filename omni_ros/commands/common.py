"""Helpers shared by subcommands."""

from __future__ import annotations

import argparse
import dataclasses
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


def add_config_args(parser: argparse.ArgumentParser, sim: bool = True, policy: bool = False) -> None:
    """`--config` (and `--sim`); `policy=True` for commands that load a policy: `--precision`, `--int8-kernel`."""
    parser.add_argument(
        "--config", help="YAML config file (default: config/default.yaml, or the simulator's with --sim)"
    )
    if sim:
        add_sim_arg(parser)
    if policy:
        add_precision_args(parser)


# The choices are spelled here, not imported: the CLI parses its arguments before it imports torch.
PRECISION_CHOICES = ("auto", "fp32", "bf16", "int8")
INT8_KERNEL_CHOICES = ("auto", "onednn", "xnnpack", "program")


def add_precision_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--precision",
        choices=PRECISION_CHOICES,
        help="what the policy's GEMMs compute in (overrides policy.precision): auto picks from this CPU's "
        "instructions (bf16 on AMX, int8 where there is an int8 dot product, fp32 otherwise); fp32, bf16 (bf16 "
        "GEMMs, float32 elsewhere) and int8 (weights per channel, activations per token) force one",
    )
    parser.add_argument(
        "--int8-kernel",
        choices=INT8_KERNEL_CHOICES,
        help="the int8 GEMM kernel (overrides policy.int8_kernel): auto, onednn (torch), xnnpack (ExecuTorch's per "
        "linear, built on first load and cached) or program (the checkpoint's stages exported whole to one XNNPACK "
        "int8 program on first load and cached; auto picks it on x86 CPUs with VNNI and no AMX where it serves the "
        "load; the policy node runs it in a child process)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        default=None,
        help="compile the vision tower, prefill and denoising step with TorchInductor on the first inference (sets "
        "policy.compile; needs a C++ compiler, takes tens of seconds once; pi0, pi0.5, SmolVLA on the CPU)",
    )


def precision_argv(args: argparse.Namespace) -> list[str]:
    """`--precision` / `--int8-kernel` / `--compile` as given, to hand on to node processes."""
    out = []
    if getattr(args, "precision", None):
        out += ["--precision", args.precision]
    if getattr(args, "int8_kernel", None):
        out += ["--int8-kernel", args.int8_kernel]
    if getattr(args, "compile", None):
        out += ["--compile"]
    return out


def apply_precision_args(config: OmniConfig, args: argparse.Namespace) -> None:
    """Put `--precision` / `--int8-kernel` / `--compile` into `config.policy`, checked as the YAML's values are."""
    keys = ("precision", "int8_kernel", "compile")
    changes = {key: getattr(args, key) for key in keys if getattr(args, key, None) is not None}
    if changes:
        config.policy = dataclasses.replace(config.policy, **changes)


def config_from_args(args: argparse.Namespace) -> OmniConfig:
    sim = getattr(args, "sim", None)
    path = args.config or (sim_config_path(sim) if sim else CONFIG_DIR / "default.yaml")
    config = load_config(path)
    if sim:
        # The simulated robot is safe to drive, whatever the file says.
        config.robot.dry_run = False
    apply_precision_args(config, args)
    # Every command reads its config before it imports torch: the thread settings take effect here.
    cpu_threads.configure(config.policy)
    return config
