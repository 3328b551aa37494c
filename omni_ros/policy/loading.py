"""Build a `Policy` on the torch runner: from a checkpoint folder, a built-in preset or a model in memory.

policy = omni_ros.policy.load("checkpoints/demo")                 # any known checkpoint layout
policy = from_preset("small", camera_names=["base"], seed=0)       # random weights, seeded
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from omni_ros.policy import families, layouts
from omni_ros.policy.layouts.common import CheckpointError
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.pipeline import InferencePipeline
from omni_ros.policy.precision import PrecisionChoice, PrecisionError, choose
from omni_ros.policy.tokenizer import Tokenizer
from omni_ros.policy.torch_runner import TorchRunner, resolve_dtype

logger = logging.getLogger("omni_ros.policy")
# Checkpoint folders already warned about in this process (a node reloads on reconfigure).
_rate_warned: set[str] = set()


def _default_precision(precision: str | None, dtype: str) -> str:
    """The API's default: float32 GEMMs for a float32 model, the dtype's own for a bfloat16 one."""
    if precision is not None:
        return precision
    return "auto" if dtype == "bfloat16" else "fp32"


def resolve_precision(
    precision: str | None, *, device: str = "cpu", dtype: str = "float32", int8_kernel: str = "auto"
) -> PrecisionChoice:
    """What `load` computes in on this CPU, and why, with the API's default for `precision` None."""
    return choose(_default_precision(precision, dtype), device=device, dtype=dtype, int8_kernel=int8_kernel)


def load(
    path: str | Path,
    *,
    tokenizer: Tokenizer | str | Path | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int | None = 0,
    num_steps: int | None = None,
    name: str | None = None,
    cpu_linear: str = "dense",
    precision: str | None = None,
    int8_kernel: str = "auto",
    cache_dir: str | None = None,
    domain_id: int | None = None,
    action_dt: float | None = None,
    compile: bool = False,
) -> InferencePipeline:
    """The policy in checkpoint folder `path` (its layout detected), on the torch runner.

    `action_dt`: seconds between a chunk's actions (1 / the training data's fps); None keeps what the checkpoint
    records, and warns where its layout records none (LeRobot, openpi: 0.02 s then).

    `precision` ("auto", "fp32", "bf16", "int8"; omni_ros/policy/precision; default fp32) swaps the model's
    linear layers for that precision's kernels: "auto" picks the fastest this CPU runs accurately, as the node,
    server and evaluator do. With "fp32", `cpu_linear="packed"` runs the linears from oneDNN-packed weights on an
    x86 CPU (faster; `policy.cpu_linear`); the defaults keep `runner.model` plain modules, as code that exports,
    trains or inspects it expects. `cache_dir`: where kernels built on first load are kept (kernel_cache.py).
    `compile`: the vision tower, prefill and denoising step compiled by TorchInductor on the first inference
    (compiled_stages.py).
    """
    checkpoint = layouts.read(path, tokenizer=tokenizer)
    family = families.get(checkpoint.family)
    if domain_id is not None:
        # The embodiment an observation without `domain_id` is for (cross-embodiment checkpoints only).
        set_domain(checkpoint, domain_id)
    if action_dt is not None:
        checkpoint.config.action_dt = float(action_dt)
    elif checkpoint.layout != "omni_ros":
        _warn_unknown_rate(checkpoint)
    choice = resolve_precision(precision, device=device, dtype=dtype, int8_kernel=int8_kernel)
    if choice.kernel == "program":
        # An exported program on the ExecuTorch runner: the backends' layer serves it, not the torch runner.
        raise PrecisionError(
            "policy.int8_kernel program runs an exported program: load it with "
            "omni_ros.backends.stage_program.load_checkpoint (as the node, serve and eval do)"
        )
    label = name or Path(path).name
    model = layouts.build_model(checkpoint, lambda: family.build_model(checkpoint.config), resolve_dtype(dtype))
    processor = family.build_processor(checkpoint.config, checkpoint.norm_stats, checkpoint.tokenizer)
    options: dict[str, Any] = {"cpu_linear": cpu_linear, "precision": choice, "cache_dir": cache_dir, "label": label}
    options |= {"compile": compile, "source": str(Path(path).resolve())}  # the kernel cache's build's origin
    if family.build_runner is not None:  # a family with its own loop (pi0-FAST's token decoder)
        runner = family.build_runner(model, checkpoint.config, device=device, dtype=dtype, **options)
    else:
        runner = TorchRunner(model, device, dtype, **options)
    steps = num_steps or checkpoint.config.num_steps
    return InferencePipeline(processor, runner, num_steps=steps, seed=seed, name=label)


def _warn_unknown_rate(checkpoint: Any) -> None:
    """A checkpoint that records no action rate plays at its config's default: said, once per folder."""
    key = str(checkpoint.path)
    if key in _rate_warned:
        return
    _rate_warned.add(key)
    dt = checkpoint.config.action_dt
    logger.warning(
        "%s: a %s checkpoint records no action rate; its actions play %.4g s apart (%.4g Hz). Set policy.action_dt "
        "to 1 / the training dataset's fps (0.0333 for 30 fps), or the robot moves at another speed than trained",
        checkpoint.path,
        checkpoint.layout,
        dt,
        1.0 / dt,
    )


def set_domain(checkpoint: Any, domain_id: int) -> None:
    cfg = checkpoint.config
    domains = getattr(getattr(cfg, "head", None), "num_domains", None)
    if domains is None:
        raise CheckpointError(f"{checkpoint.path}: policy.domain_id is for cross-embodiment (X-VLA) checkpoints only")
    if not 0 <= int(domain_id) < domains:
        raise CheckpointError(
            f"{checkpoint.path}: policy.domain_id {domain_id} is not one of its domains 0..{domains - 1}"
        )
    cfg.domain_id = int(domain_id)


def from_model(
    model: nn.Module,
    norm_stats: NormStats,
    *,
    tokenizer: Tokenizer | None = None,
    family: str = "pi0",
    device: str = "cpu",
    dtype: str = "float32",
    seed: int | None = 0,
    num_steps: int | None = None,
    name: str | None = None,
    cpu_linear: str = "dense",
    precision: str | None = None,
    int8_kernel: str = "auto",
    cache_dir: str | None = None,
    compile: bool = False,
) -> InferencePipeline:
    """A policy around a model in memory (its `cfg` says the architecture), e.g. one being trained.

    With `cpu_linear="packed"` or a `precision` other than fp32 the model's linears are replaced in place (see
    `load`): not for a model that goes on training."""
    cfg: Any = model.cfg
    choice = resolve_precision(precision, device=device, dtype=dtype, int8_kernel=int8_kernel)
    if choice.kernel == "program":
        raise CheckpointError(
            "policy.int8_kernel program exports a checkpoint folder's stages; a preset or a model in memory has no "
            "folder: load a checkpoint, or set policy.int8_kernel auto"
        )
    fam = families.get(family)
    processor = fam.build_processor(cfg, norm_stats, tokenizer)
    label = name or cfg.name
    options: dict[str, Any] = {"cpu_linear": cpu_linear, "precision": choice, "cache_dir": cache_dir, "label": label}
    options["compile"] = compile
    if fam.build_runner is not None:
        runner = fam.build_runner(model, cfg, device=device, dtype=dtype, **options)
    else:
        runner = TorchRunner(model, device, dtype, **options)
    return InferencePipeline(processor, runner, num_steps=num_steps or cfg.num_steps, seed=seed, name=label)


def from_preset(
    name: str,
    *,
    camera_names: Sequence[str] | None = None,
    state_dim: int | None = None,
    action_dim: int | None = None,
    action_horizon: int | None = None,
    weights_seed: int = 0,
    **kwargs: Any,
) -> InferencePipeline:
    """A randomly initialised model of a built-in pi0-family architecture (weights seeded, so reproducible)."""
    from omni_ros.policy.pi0.presets import build_preset

    model = build_preset(
        name,
        weights_seed,
        camera_names=camera_names,
        state_dim=state_dim,
        action_dim=action_dim,
        action_horizon=action_horizon,
    )
    cfg = model.cfg
    stats = NormStats.identity(cfg.state_dim, cfg.action_dim)
    return from_model(model, stats, name=f"{name} (random weights)", **kwargs)
