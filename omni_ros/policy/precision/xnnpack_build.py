"""The XNNPACK kernel program is lowered in a process of its own, never in the one that serves the policy.

Lowering (torch.export, decompositions, XNNPACK's passes) is heavy and leaves its mark on the process that runs
it: on the AMD EPYC with AVX-512 VNNI the edge pi0's int8 chunk ran 431 ms at one thread in the process that had
just built its kernels against 333 ms in a fresh process reading the same cache (scratch, same machine, minutes
apart), and a full-size SmolVLA's process held 3.0 GB after its first load against 1.7 GB of float32 weights
(bench/results/smolvla_eager_vnni.json). So the serving process writes the float32 linears it wants lowered to
the build folder (safetensors) with the plan (groups, MLPs), a child `python -m
omni_ros.policy.precision.xnnpack_build FOLDER` lowers them into `linears.pte` and says what it built, and the
inputs are removed before the cache entry is sealed. The child's progress lines reach the parent's log; a
child that fails is an error with the end of its output, and an interrupted parent stops its child.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omni_ros.errors import OmniRosError
from omni_ros.policy.precision.xnnpack_mlp import MlpSpec

logger = logging.getLogger("omni_ros.policy")
INPUTS = "_inputs.safetensors"
PLAN = "_plan.json"
RESULT = "_result.json"


class KernelBuildError(OmniRosError, RuntimeError):
    """The child that lowers the kernel program failed."""


def build_in_subprocess(
    linears: dict[str, nn.Linear], folder: Path, grouping: list[list[str]], mlps: list[MlpSpec]
) -> dict[str, Any]:
    """Lower `linears` (groups and MLPs as planned) into `folder` in a child process; returns the manifest fields."""
    from omni_ros.policy.layouts.weights import save_float32

    named = []
    for name, linear in linears.items():
        named.append((f"{name}.weight", linear.weight))
        if linear.bias is not None:
            named.append((f"{name}.bias", linear.bias))
    save_float32(named, folder / INPUTS)  # a tensor at a time: the float weights are never all resident at once
    plan = {"linears": list(linears), "grouping": grouping, "mlps": [dataclasses.asdict(m) for m in mlps]}
    (folder / PLAN).write_text(json.dumps(plan), encoding="utf-8")
    command = [sys.executable, "-m", "omni_ros.policy.precision.xnnpack_build", str(folder)]
    try:
        run_child(command, "building the int8 XNNPACK kernels")
        if not (folder / RESULT).is_file():
            raise KernelBuildError(f"building the int8 XNNPACK kernels wrote no {RESULT}")
        return json.loads((folder / RESULT).read_text(encoding="utf-8"))
    finally:
        for name in (INPUTS, PLAN, RESULT):
            (folder / name).unlink(missing_ok=True)


def run_child(command: list[str], what: str, progress: str = "[omni_ros") -> None:
    """Run a build `command` in a child process: its lines starting with `progress` reach this process's log, a
    failure is a KernelBuildError with the end of its output, and an interrupted parent stops the child."""
    tail: collections.deque[str] = collections.deque(maxlen=20)
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as child:
        try:
            assert child.stdout is not None
            for line in child.stdout:
                tail.append(line.rstrip())
                if line.startswith(progress):
                    logger.info("%s", line.rstrip().split("] ", 1)[-1])
            code = child.wait()
        except BaseException:
            child.kill()  # an interrupted load leaves no lowering behind
            raise
    if code != 0:
        lines = "\n".join(tail)
        raise KernelBuildError(f"{what} failed (exit {code}):\n{lines}")


def _linears(folder: Path, names: list[str]) -> dict[str, nn.Linear]:
    from safetensors.torch import load_file

    tensors = load_file(str(folder / INPUTS))
    out = {}
    for name in names:
        weight, bias = tensors[f"{name}.weight"], tensors.get(f"{name}.bias")
        linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
        with torch.no_grad():
            linear.weight.copy_(weight)
            if bias is not None:
                linear.bias.copy_(bias)
        out[name] = linear
    return out


def main(argv: list[str] | None = None) -> int:
    from omni_ros.policy.precision.xnnpack_linears import lower_program

    (folder,) = argv if argv is not None else sys.argv[1:]
    path = Path(folder)
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s", stream=sys.stderr)
    plan = json.loads((path / PLAN).read_text(encoding="utf-8"))
    linears = _linears(path, plan["linears"])
    mlps = [MlpSpec(**m) for m in plan["mlps"]]
    result = lower_program(linears, path, plan["grouping"], mlps)
    (path / RESULT).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
