"""One place that turns the `policy:` config section into a `Policy`, whatever the backend.

torch       a checkpoint folder (any layout omni_ros.policy.load reads) or a preset with random weights
executorch  a `.pte` written by `omni-ros export` (its sidecar beside it)
remote      an OpenPI WebSocket server (ours, openpi's, a relay), reached with `policy.remote`
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from omni_ros import cpu_features, cpu_threads
from omni_ros.policy.base import Policy
from omni_ros.policy.config import PolicyConfig
from omni_ros.typed_config import ConfigError

logger = logging.getLogger("omni_ros.policy")
# Fallback warnings already given in this process: one per missing feature, not one per load.
_warned: set[str] = set()


def load_policy(
    config: PolicyConfig,
    camera_names: Sequence[str] | None = None,
    state_dim: int | None = None,
    action_dim: int | None = None,
    *,
    control_loop: bool = False,
    rtc_method: str | None = None,
) -> Policy:
    """Build the configured policy.

    camera_names/state_dim/action_dim shape a preset (random weights) to a robot; a checkpoint, a program
    or a remote server carries its own, and they must agree with it. Relative paths in the config were
    resolved against the config file's folder when it was loaded.

    `control_loop`: a control loop shares this process (the policy node), so `policy.program_process: auto` runs
    an ExecuTorch program in a child process. `rtc_method`: the real-time-chunking method the caller will ask for
    (the node's `control.rtc.method` under `blending: rtc`); an int8 program exported for it carries the guided
    step where that is "guided".
    """
    # Before the backend imports torch where it can (the CLI and nodes did it already): threads and waiting.
    cpu_threads.configure(config)
    loaders = {
        "torch": _load_torch,
        "executorch": _load_executorch,
        "onnxruntime": _load_onnxruntime,
        "remote": _load_remote,
    }
    if config.backend not in loaders:
        raise ConfigError(f"unknown policy.backend '{config.backend}'; use torch, executorch, onnxruntime or remote")
    host = Host(child_process(config.program_process, control_loop), rtc_method)
    policy = loaders[config.backend](config, camera_names, state_dim, action_dim, host)
    if config.action_dt is not None and policy.metadata.action_dt != config.action_dt:
        # The period the actions play at is the robot's to know (a LeRobot checkpoint records none): every reader
        # of the chunk (executor, bridge metadata, evaluator) takes it from the metadata.
        policy.metadata = replace(policy.metadata, action_dt=config.action_dt)
    return policy


@dataclass(frozen=True)
class Host:
    """What the process loading a policy needs of it: programs in a child process; the RTC method it will ask."""

    child_process: bool = False
    rtc_method: str | None = None


def child_process(setting: str, control_loop: bool) -> bool:
    """`policy.program_process` resolved: auto runs programs in a child where a control loop shares the process."""
    return setting == "child" or (setting == "auto" and control_loop)


def _load_torch(config: PolicyConfig, camera_names, state_dim, action_dim, host: Host) -> Policy:
    from omni_ros.backends.stage_program import load_checkpoint
    from omni_ros.policy.loading import from_preset

    dtype = runtime_dtype(config)
    common: dict[str, Any] = {
        "device": config.device,
        "dtype": dtype,
        "seed": config.seed,
        "num_steps": config.num_steps,
        "cpu_linear": config.cpu_linear,
        "precision": config.precision,
        "int8_kernel": config.int8_kernel,
        "cache_dir": config.cache_dir,
        "compile": config.compile,
    }
    if config.checkpoint:
        policy = load_checkpoint(
            config.checkpoint,
            tokenizer=config.tokenizer,
            domain_id=config.domain_id,
            action_dt=config.action_dt,
            program_process=host.child_process,
            rtc_method=host.rtc_method,
            **common,
        )
        check_agrees(policy, camera_names, state_dim, action_dim, config.checkpoint)
        return policy
    return from_preset(config.preset, camera_names=camera_names, state_dim=state_dim, action_dim=action_dim, **common)


def runtime_dtype(config: PolicyConfig) -> str:
    """`policy.dtype`, unless it is bfloat16 on a CPU that would only emulate it (minutes per large matmul):
    then float32 with one warning naming the missing feature, or an error when `policy.strict_dtype` is set."""
    if config.dtype != "bfloat16" or not config.device.startswith("cpu"):
        return config.dtype
    missing = cpu_features.missing_bf16_feature()
    if missing is None:
        return config.dtype
    if config.strict_dtype:
        from omni_ros.policy.torch_runner import DeviceError

        raise DeviceError(
            f"policy.dtype is bfloat16 but this CPU lacks {missing}, so torch would emulate bf16 (a large matmul "
            f"takes minutes); use dtype float32, a CPU with {missing}, or policy.strict_dtype: false to fall back"
        )
    if missing not in _warned:
        _warned.add(missing)
        logger.warning(
            "policy.dtype bfloat16: this CPU lacks %s (bf16 would be emulated, minutes per large matmul); running "
            "float32 instead (policy.strict_dtype: true refuses)",
            missing,
        )
    return "float32"


def _load_executorch(config: PolicyConfig, camera_names, state_dim, action_dim, host: Host) -> Policy:
    # PolicyConfig checked itself: a pte is given and the dtype is float32.
    from omni_ros.backends.executorch_runner import load_pte

    policy = load_pte(
        Path(config.pte or ""),
        device=config.device,
        process=host.child_process,
        **_exported(config, camera_names, state_dim, action_dim),
    )
    return _checked_precision(policy, config, str(config.pte))


def _load_onnxruntime(config: PolicyConfig, camera_names, state_dim, action_dim, host: Host) -> Policy:
    # PolicyConfig checked itself: a folder is given, and no dtype or device beside the providers.
    from omni_ros.backends.onnx_runner import load_onnx

    folder = Path(config.onnx or "")
    policy = load_onnx(folder, providers=config.providers, **_exported(config, camera_names, state_dim, action_dim))
    return _checked_precision(policy, config, str(folder))


def _checked_precision(policy: Any, config: PolicyConfig, source: str) -> Policy:
    """An exported program computes in the precision it was exported with: `policy.precision` must agree."""
    from omni_ros.policy.precision.choice import PrecisionError, program_choice

    try:
        program_choice(policy.runner.sidecar.quantize, config.precision, source)
    except PrecisionError:
        policy.close()
        raise
    return policy


def _exported(config: PolicyConfig, camera_names, state_dim, action_dim) -> dict:
    """What every exported-program backend takes from the config and the robot (its sidecar must agree)."""
    return {
        "seed": config.seed,
        "num_steps": config.num_steps,
        "num_threads": config.num_threads,
        "camera_names": camera_names,
        "state_dim": state_dim,
        "action_dim": action_dim,
        "domain_id": config.domain_id,
    }


def _load_remote(config: PolicyConfig, camera_names, state_dim, action_dim, host: Host) -> Policy:
    remote = config.remote  # PolicyConfig checked itself: the url is set
    from omni_ros.backends.remote import RemotePolicy

    policy = RemotePolicy(
        remote.url,
        keymap=remote.keymap or None,
        api_key=remote.api_key or os.environ.get(remote.api_key_env) or None,
        connect_timeout_s=remote.connect_timeout_s,
        deadline_s=remote.deadline_s,
        retries=remote.retries,
        ca_file=remote.ca_file or None,
    )
    try:
        check_agrees(policy, camera_names, state_dim, action_dim, remote.url)
    except ConfigError:
        policy.close()
        raise
    return policy


def check_agrees(
    policy: Policy,
    camera_names: Sequence[str] | None,
    state_dim: int | None,
    action_dim: int | None,
    source: str,
) -> None:
    """The policy's cameras and dims are the configured robot's, or a ConfigError naming the difference."""
    meta = policy.metadata
    if camera_names is not None and tuple(camera_names) != tuple(meta.camera_names):
        raise ConfigError(f"{source}: checkpoint cameras {list(meta.camera_names)} != configured {list(camera_names)}")
    if state_dim is not None and state_dim != meta.state_dim:
        raise ConfigError(f"{source}: checkpoint state_dim {meta.state_dim} != configured {state_dim}")
    if action_dim is not None and meta.action_dim and action_dim != meta.action_dim:
        raise ConfigError(f"{source}: checkpoint action_dim {meta.action_dim} != configured {action_dim}")
