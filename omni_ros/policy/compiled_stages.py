"""The vision tower, the prefill and the denoising step compiled by TorchInductor (`policy.compile`).

At a chunk's few rows a denoising step is mostly per-call cost: the edge pi0's int8 step was 899 torch calls on
one thread, 42 of them GEMMs (3 ms of 13), the rest norms, rotary, casts, the row quantization and Python between
them; the prefill and the vision tower have the same ops over a few hundred rows. Inductor traces a stage once into
one graph, fuses those elementwise ops into a few C++ loops and keeps the GEMM kernels the precision chose (oneDNN's
packed fp32 / bf16 / int8 products, frozen as constants). It needs a C++ compiler on the robot's computer and takes
tens of seconds on the first inference (the node's warm-up, not mid-motion). A vision tower is compiled per image
part, on the threads omni_ros/policy/image_threads.py runs them on.

Graphs are built for the calls of the first inference: their shapes (`dynamic=False`: the runner keeps every
camera slot and prompt token so that observations do not change them), grad mode and thread count (inductor's
loops keep the count they were generated for, so the runner sets the step's from the wait policy instead of
timing it). A later call that differs runs the eager stage, with one warning, rather than stall the robot for a
recompilation.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from omni_ros.errors import OmniRosError

logger = logging.getLogger(__name__)

COMPILERS = ("g++", "c++", "clang++")


class CompileError(OmniRosError, RuntimeError):
    """`policy.compile` cannot run here (no C++ compiler, a runner with no stages to compile)."""


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would use: $CXX if it names one on PATH, else the first of `COMPILERS` found."""
    for name in (os.environ.get("CXX", ""), *COMPILERS):
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


def check_compilable(device: torch.device) -> None:
    """A clear error saying why the stages cannot be compiled here, if they cannot."""
    if device.type != "cpu":
        raise CompileError(f"policy.compile compiles the CPU stages; the policy runs on {device}")
    if cxx_compiler() is None:
        raise CompileError(
            "policy.compile needs a C++ compiler (TorchInductor builds the stages' kernels with it): none of "
            f"$CXX, {', '.join(COMPILERS)} is on PATH. Install one (apt install g++) or set policy.compile: false"
        )


# Graphs torch may keep per compiled function in a process (each policy loaded, each thread count).
RECOMPILE_LIMIT = 64


def _shapes(value: Any) -> Any:
    """The shapes, dtypes and kinds (inference tensor or not) of the tensors in a (nested) argument: what a
    compiled graph is specialized to (torch guards on the kind too)."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype, value.is_inference())
    if isinstance(value, list | tuple):
        return tuple(_shapes(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _shapes(v)) for k, v in sorted(value.items()))
    return value


class CompiledStage:
    """`stage(*args)` compiled for the calls of a policy's first inference (`seal` ends it), then run compiled for
    calls like those and eager for any other."""

    def __init__(self, stage: Callable[..., Any], name: str) -> None:
        self.eager, self.name = stage, name
        self.compiled: Callable[..., Any] | None = None
        # (argument shapes and kinds, inference mode, grad mode, torch threads) compiled for
        self.keys: set[Any] = set()
        self.sealed = False
        # Compilation is one call at a time (the vision tower's images arrive from several threads at once).
        self._lock = threading.Lock()
        self._warned = False

    def seal(self) -> None:
        """No more compiling: from now on a call unlike the ones compiled runs eager (a recompilation would stall
        the robot for tens of seconds)."""
        self.sealed = True

    def __call__(self, *args: Any) -> Any:
        key = (_shapes(args), torch.is_inference_mode_enabled(), torch.is_grad_enabled(), torch.get_num_threads())
        if not self.sealed:
            with self._lock:
                return self._warm(key, args)
        if key not in self.keys:
            return self._eager(args, "differs from the calls it was compiled for (shapes, grad mode or threads)")
        assert self.compiled is not None
        try:
            # Any guard of torch's own that fails here raises instead of recompiling.
            with torch.compiler.set_stance("fail_on_recompile"):
                return self.compiled(*args)
        except RuntimeError as error:
            if "recompile" not in str(error):
                raise
            # This call only: the key stays, so the calls the graph was built for keep running it (dropping the
            # key sent every later call of a compiled policy to the eager stage after one odd call).
            return self._eager(args, "would need a recompilation")

    def _eager(self, args: tuple[Any, ...], why: str) -> Any:
        if not self._warned:
            self._warned = True
            logger.warning("compiled %s: a call %s; such calls run the eager %s", self.name, why, self.name)
        return self.eager(*args)

    def _warm(self, key: Any, args: tuple[Any, ...]) -> Any:
        if key in self.keys:
            assert self.compiled is not None
            return self.compiled(*args)
        start = time.perf_counter()
        logger.info("compiling the %s with TorchInductor (on the first inference; tens of seconds)", self.name)
        # Freezing makes the weights constants, so the lowering keeps oneDNN's packed GEMMs and folds what depends
        # on weights alone. Set for the process, not patched around this call: a compiled function guards on
        # inductor's config, so a later call without it recompiled, unfrozen, and that lowering failed on the
        # packed weights (torch 2.13); given as torch.compile's `options`, it failed the same way.
        torch._inductor.config.freezing = True
        # The graph called from C++, not from generated Python: 1.3 ms less a pi0 edge int8 step (10.5 -> 9.3 ms).
        torch._inductor.config.cpp_wrapper = True
        # torch keeps a function's graphs per code object, one per policy instance it ran on (its guards match the
        # modules) and thread count; at its default of 8 the ninth compiled policy of a family in one process (a
        # test session, an evaluator going through checkpoints) failed to compile and served eager.
        dynamo = torch._dynamo.config
        dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
        dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)
        if self.compiled is None:
            self.compiled = torch.compile(self.eager, dynamic=False, fullgraph=True)
        try:
            out = self.compiled(*args)  # a second key: torch's guards fail and it compiles a second graph
        except Exception as error:  # any failure of the compiler: the eager stage still serves
            logger.warning("compiled %s: compilation failed, the eager one runs instead: %s", self.name, error)
            self.sealed, self._warned = True, True
            return self.eager(*args)
        self.keys.add(key)
        logger.info("%s compiled in %.1f s", self.name, time.perf_counter() - start)
        return out
