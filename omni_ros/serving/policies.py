"""The policy a server serves: the config's, or one from a `MODULE:CALLABLE` factory, shaped by the key map."""

from __future__ import annotations

import importlib
from typing import Any

from omni_ros.policy.base import Policy
from omni_ros.policy.config import PolicyConfig
from omni_ros.serving.keymap import KeyMap
from omni_ros.typed_config import ConfigError


def load_served_policy(policy: PolicyConfig, keymap: KeyMap | None, factory: str | None = None) -> Policy:
    """`factory(camera_names=, state_dim=, action_dim=)` when given, else `load_policy(policy, ...)`."""
    dims: dict[str, Any] = {}
    if keymap is not None:
        dims = {"camera_names": keymap.camera_names, "state_dim": keymap.state_dim, "action_dim": keymap.action_dim}
    if factory:
        module_name, _, attr = factory.partition(":")
        if not attr:
            raise ConfigError(f"--policy-factory: expected MODULE:CALLABLE, got {factory!r}")
        return getattr(importlib.import_module(module_name), attr)(**dims)
    from omni_ros.backends.factory import load_policy

    return load_policy(policy, **dims)
