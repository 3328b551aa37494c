"""One place that turns `policy:` config into a `Policy`, whatever the backend."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omni_ros.config import ConfigError, PolicyConfig
from omni_ros.policy.base import Policy


def load_policy(
    config: PolicyConfig,
    camera_names: Sequence[str] | None = None,
    state_dim: int | None = None,
    action_dim: int | None = None,
    base_dir: str | Path | None = None,
) -> Policy:
    """Build the configured policy.

    camera_names/state_dim/action_dim shape a preset (random weights) to a
    robot; a checkpoint carries its own and they must agree with it.
    `base_dir` resolves a relative checkpoint path (the config file's folder).
    """
    if config.num_threads > 0:
        import torch

        torch.set_num_threads(config.num_threads)
    if config.backend == "torch":
        from omni_ros.policy.torch_policy import TorchPolicy

        common = {"device": config.device, "dtype": config.dtype, "seed": config.seed, "num_steps": config.num_steps}
        if config.checkpoint:
            path = Path(config.checkpoint)
            if base_dir is not None and not path.is_absolute() and not path.exists():
                path = Path(base_dir) / path
            policy = TorchPolicy.from_checkpoint(path, **common)
            _check_agrees(policy, camera_names, state_dim, action_dim, str(path))
            return policy
        return TorchPolicy.from_preset(
            config.preset, camera_names=camera_names, state_dim=state_dim, action_dim=action_dim, **common
        )
    if config.backend == "executorch":
        return _load_executorch(config, camera_names, state_dim, action_dim, base_dir)
    if config.backend == "onnxruntime":
        return _load_onnxruntime(config, camera_names, state_dim, action_dim, base_dir)
    raise ConfigError(f"policy.backend '{config.backend}' is not available in this build; use policy.backend: torch")


def _load_executorch(config: PolicyConfig, camera_names, state_dim, action_dim, base_dir) -> Policy:
    if not config.pte:
        raise ConfigError("policy.backend 'executorch' needs policy.pte (a .pte written by `omni-ros export`)")
    if config.dtype != "float32":
        raise ConfigError("policy.dtype is fixed by the exported program for backend 'executorch'; use float32")
    path = _resolve(config.pte, base_dir)
    from omni_ros.backends.executorch_backend import ExecuTorchPolicy

    return ExecuTorchPolicy(path, device=config.device, **_exported(config, camera_names, state_dim, action_dim))


def _load_onnxruntime(config: PolicyConfig, camera_names, state_dim, action_dim, base_dir) -> Policy:
    if not config.onnx:
        raise ConfigError("policy.backend 'onnxruntime' needs policy.onnx (a folder written by `omni-ros export`)")
    if config.dtype != "float32" or config.device != "cpu":
        raise ConfigError(
            "backend 'onnxruntime' takes policy.providers (cpu, qnn-htp, cuda, tensorrt), not dtype/device"
        )
    from omni_ros.backends.onnx_backend import OnnxPolicy

    path = _resolve(config.onnx, base_dir)
    return OnnxPolicy(path, providers=config.providers, **_exported(config, camera_names, state_dim, action_dim))


def _exported(config: PolicyConfig, camera_names, state_dim, action_dim) -> dict:
    """What every exported-program backend takes from the config and the robot (its sidecar must agree)."""
    return {
        "seed": config.seed,
        "num_steps": config.num_steps,
        "num_threads": config.num_threads,
        "camera_names": camera_names,
        "state_dim": state_dim,
        "action_dim": action_dim,
    }


def _resolve(path: str, base_dir: str | Path | None) -> Path:
    """A relative path that does not exist here is relative to the config file's folder."""
    resolved = Path(path)
    if base_dir is not None and not resolved.is_absolute() and not resolved.exists():
        resolved = Path(base_dir) / resolved
    return resolved


def _check_agrees(policy: Policy, camera_names, state_dim, action_dim, source: str) -> None:
    meta = policy.metadata
    if camera_names is not None and tuple(camera_names) != tuple(meta.camera_names):
        raise ConfigError(f"{source}: checkpoint cameras {list(meta.camera_names)} != configured {list(camera_names)}")
    if state_dim is not None and state_dim != meta.state_dim:
        raise ConfigError(f"{source}: checkpoint state_dim {meta.state_dim} != configured {state_dim}")
    if action_dim is not None and action_dim != meta.action_dim:
        raise ConfigError(f"{source}: checkpoint action_dim {meta.action_dim} != configured {action_dim}")
