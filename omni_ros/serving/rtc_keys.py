"""Real-time chunking over the OpenPI wire: optional request keys beside the observation.

A client that wants the next chunk to continue the one its robot executes adds flat keys to its
observation dict (openpi's own keys are flat too, `observation/...`):

    "rtc/prev_actions":        (R, action_dim) float, robot units: the executing plan at the new chunk's
                               action times (row i due at the observation + i * action_dt)
    "rtc/inference_delay":     int d, actions that pass before the answer arrives (run from the old plan)
    "rtc/execution_horizon":   int s, actions of the old chunk executed before this request (the paper's s;
                               LeRobot's `execution_horizon` is H - s), optional
    "rtc/method":              "guided" (default) or "inpaint", optional
    "rtc/schedule":            "exp" (default), "linear", "ones", "zeros", optional
    "rtc/max_guidance_weight": float beta, optional (default: the policy's number of denoising steps)

Our server announces what it supports in its metadata frame (`"rtc": {"methods": [...], "keys": [...]}`);
without these keys a request is an ordinary openpi request, so an unmodified openpi-client is unaffected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from omni_ros.policy.rtc_request import METHODS, SCHEDULES, RtcError, RtcRequest

PREFIX = "rtc/"
PREV_ACTIONS = "rtc/prev_actions"
INFERENCE_DELAY = "rtc/inference_delay"
EXECUTION_HORIZON = "rtc/execution_horizon"
METHOD = "rtc/method"
SCHEDULE = "rtc/schedule"
MAX_GUIDANCE_WEIGHT = "rtc/max_guidance_weight"
KEYS = (PREV_ACTIONS, INFERENCE_DELAY, EXECUTION_HORIZON, METHOD, SCHEDULE, MAX_GUIDANCE_WEIGHT)


def rtc_metadata(methods: tuple[str, ...]) -> dict[str, Any]:
    """The metadata entry a client reads to know whether it may send the keys."""
    if not methods:
        return {"methods": []}
    return {
        "methods": list(methods),
        "keys": list(KEYS),
        "required": [PREV_ACTIONS, INFERENCE_DELAY],
        "schedules": list(SCHEDULES),
    }


def split_rtc(obs: Any) -> tuple[Any, RtcRequest | None]:
    """(the observation without rtc/ keys, the request they make or None). Malformed keys raise RtcError."""
    if not isinstance(obs, Mapping):
        return obs, None
    for key in obs:  # a plain loop: this runs on every request, and almost every request has no rtc/ key
        if isinstance(key, str) and key.startswith(PREFIX):
            break
    else:
        return obs, None
    rest = {k: v for k, v in obs.items() if not (isinstance(k, str) and k.startswith(PREFIX))}
    given = {k: v for k, v in obs.items() if isinstance(k, str) and k.startswith(PREFIX)}
    unknown = sorted(set(given) - set(KEYS))
    if unknown:
        raise RtcError(f"unknown rtc key(s) {unknown}; known: {', '.join(KEYS)}")
    missing = [k for k in (PREV_ACTIONS, INFERENCE_DELAY) if k not in given]
    if missing:
        raise RtcError(f"an rtc request needs {', '.join(missing)} (got {sorted(given)})")
    prev = given[PREV_ACTIONS]
    if not isinstance(prev, np.ndarray) or prev.dtype.kind not in "fiu":
        raise RtcError(f"'{PREV_ACTIONS}' must be a numeric array (R, action_dim), got {_describe(prev)}")
    kwargs: dict[str, Any] = {
        "prev_actions": prev,
        "inference_delay": _integer(given[INFERENCE_DELAY], INFERENCE_DELAY),
    }
    if given.get(EXECUTION_HORIZON) is not None:
        kwargs["execution_horizon"] = _integer(given[EXECUTION_HORIZON], EXECUTION_HORIZON)
    for key, name in ((METHOD, "method"), (SCHEDULE, "schedule")):
        if given.get(key) is not None:
            kwargs[name] = _text(given[key], key)
    if given.get(MAX_GUIDANCE_WEIGHT) is not None:
        value = given[MAX_GUIDANCE_WEIGHT]
        if isinstance(value, np.generic):
            value = value.item()
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise RtcError(f"'{MAX_GUIDANCE_WEIGHT}' must be a number, got {_describe(value)}")
        kwargs["max_guidance_weight"] = float(value)
    return rest, RtcRequest(**kwargs)


def rtc_keys(request: RtcRequest) -> dict[str, Any]:
    """The keys a client adds to its observation for `request`."""
    keys: dict[str, Any] = {
        PREV_ACTIONS: np.ascontiguousarray(request.actions, dtype=np.float32),
        INFERENCE_DELAY: int(request.inference_delay),
        METHOD: request.method,
        SCHEDULE: request.schedule,
    }
    if request.max_guidance_weight is not None:
        keys[MAX_GUIDANCE_WEIGHT] = float(request.max_guidance_weight)
    if request.execution_horizon is not None:
        keys[EXECUTION_HORIZON] = int(request.execution_horizon)
    return keys


def methods_of(metadata: Mapping[str, Any]) -> tuple[str, ...]:
    """RTC methods a server's metadata announces (none for openpi's own servers)."""
    entry = metadata.get("rtc")
    if not isinstance(entry, Mapping) or not isinstance(entry.get("methods"), (list, tuple)):
        return ()
    return tuple(m for m in entry["methods"] if m in METHODS)


def _integer(value: Any, key: str) -> int:
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value.item()
    if isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, int) or isinstance(value, bool):
        raise RtcError(f"'{key}' must be an integer, got {_describe(value)}")
    return value


def _text(value: Any, key: str) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if not isinstance(value, str):
        raise RtcError(f"'{key}' must be a string, got {_describe(value)}")
    return value


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"array {value.dtype} {value.shape}"
    return type(value).__name__
