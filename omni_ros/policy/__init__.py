"""Policies: the `Policy` contract, the one inference path, model families and checkpoint layouts.

    base.py        Policy / PolicyMetadata: what every entry point (node, bridge, evaluator) holds
    pipeline.py    InferencePipeline: observation -> processor -> runner.sample -> actions (every backend)
    inputs.py      ModelInputs: the one struct a model takes
    torch_runner.py  eager PyTorch runner (CPU / CUDA); other runners live in omni_ros.backends
    families.py    model families (pi0/ ...), each a folder: configuration, modules, processing, stages
    methods.py     StagePlan: a family's inference stages as program methods (exporters and runtimes consume it)
    layouts/       checkpoint folders (omni_ros ...) -> family config, weights, norm stats, tokenizer
    loading.py     load(path) / from_preset(name) / from_model(model, stats)
    sampler.py, normalize.py, tokenizer.py, layers.py, train.py   shared pieces

Kept import-light: `omni_ros.config` imports `omni_ros.policy.config`, and the CLI must start without
loading OpenCV or torch, so the names below are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["BasePolicy", "Policy", "PolicyMetadata", "from_model", "from_preset", "load"]


def __getattr__(name: str) -> Any:
    if name in ("load", "from_model", "from_preset"):
        module = "loading"
    elif name in ("BasePolicy", "Policy", "PolicyMetadata"):
        module = "base"
    else:
        raise AttributeError(f"module 'omni_ros.policy' has no attribute {name!r}")
    return getattr(importlib.import_module(f"omni_ros.policy.{module}"), name)
