"""The schema of `metrics.json` (version 1) and a small validator for it.

The schema is plain Python data: a dict lists the exact keys of an object, `MapOf` an object with free
keys (joint names, skip reasons), `ListOf` an array, `Nullable` a value that may be null (a mean over
nothing). `validate(doc)` returns the problems as "path: what" strings ([] when the document conforms).

Compatibility rule: adding a key or changing a meaning bumps SCHEMA_VERSION; readers check it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SCHEMA_NAME = "omni_ros.eval.metrics"
SCHEMA_VERSION = 3


@dataclass(frozen=True)
class Nullable:
    inner: Any


@dataclass(frozen=True)
class ListOf:
    item: Any
    length_of: str = ""  # documentation only: which count the length matches


@dataclass(frozen=True)
class MapOf:
    value: Any


@dataclass(frozen=True)
class Const:
    value: Any


@dataclass(frozen=True)
class OneOf:
    choices: tuple


NUMBER = float  # int or float, never bool
OPT_NUMBER = Nullable(NUMBER)

STATS = {"count": int, "mean": OPT_NUMBER, "p50": OPT_NUMBER, "p95": OPT_NUMBER, "max": OPT_NUMBER}

# Errors of predicted actions against the recorded ground truth (units of the joints: rad, m, ...).
SCORES = {
    "aligned_samples": int,  # predictions with at least one scored horizon step
    "scored_values": int,  # (step, joint) values scored
    "mse": OPT_NUMBER,
    "mae": OPT_NUMBER,
    "mse_per_joint": MapOf(OPT_NUMBER),
    "mae_per_joint": MapOf(OPT_NUMBER),
    "mse_per_step": ListOf(OPT_NUMBER, "horizon"),
    "mae_per_step": ListOf(OPT_NUMBER, "horizon"),
    "first_action": {"samples": int, "mse": OPT_NUMBER, "mae": OPT_NUMBER},
    "end_point": {"samples": int, "mse": OPT_NUMBER, "mae": OPT_NUMBER},
    # Largest per-joint jump from the previous chunk's plan to the next chunk's first action.
    "chunk_boundary": STATS,
    "latency_ms": STATS,
    # Version 2: the constant baseline "hold the joint positions observed at the instant", scored on the same
    # values (offline replay; no values in --realtime mode, which sees no observations).
    "baseline_hold": {"scored_values": int, "mae": OPT_NUMBER, "mae_per_joint": MapOf(OPT_NUMBER)},
}

BLOCK = {
    "instants": int,  # inference instants reached
    "evaluated": int,  # instants that produced a chunk
    "skipped": {"total": int, "reasons": MapOf(int)},
    "dropped_out_of_order": int,
    "image_errors": MapOf(int),
    "ground_truth_rejected": MapOf(int),
    **SCORES,
}

EPISODE = {
    "index": int,
    "bag": str,
    "start_s": NUMBER,  # seconds after the bag's first message
    "duration_s": NUMBER,
    "prompt": str,
    **BLOCK,
}

BAG = {
    "path": str,
    "storage": str,
    "duration_s": NUMBER,
    "messages_read": int,
    "messages_decoded": int,
    "episodes": int,
    "skipped_messages": {"undecodable": MapOf(int), "truncated": str},
}

REALTIME = Nullable(
    {
        "chunks_received": int,
        "commands_received": int,
        "messages_published": int,
        "lateness_ms": STATS,  # how far publishing fell behind the bag's timing
        # Executed commands (after blending and limits) against the recorded ground truth.
        "executed": {"samples": int, "mse": OPT_NUMBER, "mae": OPT_NUMBER, "mae_per_joint": MapOf(OPT_NUMBER)},
    }
)

SCHEMA = {
    "schema": Const(SCHEMA_NAME),
    "schema_version": Const(SCHEMA_VERSION),
    "created": str,
    "mode": OneOf(("offline", "realtime")),
    "policy": {
        "model": str,
        "backend": str,
        "precision": str,  # what the GEMMs computed in, and why (policy.precision)
        "camera_names": ListOf(str),
        "image_size": int,
        "state_dim": int,
        "action_dim": int,
        "action_horizon": int,
        "action_dt": NUMBER,
    },
    "joint_names": ListOf(str),
    "settings": {
        "cameras": MapOf(str),
        "joint_states": str,
        "prompt": str,
        "ground_truth": {"source": str, "topic": str, "offset_s": NUMBER},
        "instants": str,
        "episode_split": str,
        "stale_s": {"camera": NUMBER, "state": NUMBER, "prompt": OPT_NUMBER},
    },
    "bags": ListOf(BAG),
    "timing": {
        "read_decode_s": NUMBER,
        "assemble_s": NUMBER,
        "inference_s": NUMBER,
        "other_s": NUMBER,
        "total_s": NUMBER,
    },
    "overall": {"episodes": int, **BLOCK},
    "episodes": ListOf(EPISODE),
    "realtime": REALTIME,
}


def validate(doc: Any, schema: Any = SCHEMA, path: str = "$") -> list[str]:
    """Problems of `doc` against `schema`, as "path: problem" strings; [] when it conforms."""
    if isinstance(schema, Nullable):
        return [] if doc is None else validate(doc, schema.inner, path)
    if isinstance(schema, Const):
        return [] if doc == schema.value else [f"{path}: expected {schema.value!r}, got {doc!r}"]
    if isinstance(schema, OneOf):
        return [] if doc in schema.choices else [f"{path}: expected one of {list(schema.choices)}, got {doc!r}"]
    if isinstance(schema, ListOf):
        if not isinstance(doc, list):
            return [f"{path}: expected an array, got {type(doc).__name__}"]
        return [e for i, item in enumerate(doc) for e in validate(item, schema.item, f"{path}[{i}]")]
    if isinstance(schema, MapOf):
        if not isinstance(doc, dict):
            return [f"{path}: expected an object, got {type(doc).__name__}"]
        errors = [f"{path}: key {k!r} is not a string" for k in doc if not isinstance(k, str)]
        return errors + [e for k, v in doc.items() for e in validate(v, schema.value, f"{path}.{k}")]
    if isinstance(schema, dict):
        if not isinstance(doc, dict):
            return [f"{path}: expected an object, got {type(doc).__name__}"]
        errors = [f"{path}: missing key '{k}'" for k in schema if k not in doc]
        errors += [f"{path}: unexpected key '{k}'" for k in doc if k not in schema]
        return errors + [e for k, v in schema.items() if k in doc for e in validate(doc[k], v, f"{path}.{k}")]
    if schema is NUMBER:
        ok = isinstance(doc, (int, float)) and not isinstance(doc, bool) and doc == doc and abs(doc) != float("inf")
        return [] if ok else [f"{path}: expected a finite number, got {doc!r}"]
    if schema is int:
        ok = isinstance(doc, int) and not isinstance(doc, bool)
        return [] if ok else [f"{path}: expected an integer, got {doc!r}"]
    if schema in (str, bool):
        return [] if type(doc) is schema else [f"{path}: expected {schema.__name__}, got {doc!r}"]
    raise TypeError(f"unsupported schema node at {path}: {schema!r}")


def check(doc: Any) -> None:
    """Raise ValueError listing the first problems when `doc` does not conform."""
    errors = validate(doc)
    if errors:
        more = f" (+{len(errors) - 10} more)" if len(errors) > 10 else ""
        raise ValueError("metrics.json does not match its schema: " + "; ".join(errors[:10]) + more)
