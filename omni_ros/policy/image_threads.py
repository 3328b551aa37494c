"""The cameras' images through the vision tower on threads of their own, one torch thread each.

With torch's passive OpenMP waiting (omni_ros's default, omni_ros/cpu_threads.py) every parallel region wakes a
sleeping worker, and a vision tower is hundreds of regions: on the 2-vCPU Intel Xeon (AMX) a second torch thread
bought the edge pi0's two-camera vision stage little in bf16 and nothing in int8 (33 and 56 ms on 2 threads against
36 and 54 on 1, bench/results/vs_lerobot.json as committed before this module, 56fb13a). A tower computes each image
on its own until its output, so the images can go through it as separate calls, each on one torch thread, on as many
Python threads as torch has threads (torch releases the GIL inside its ops): 25 and 35 ms (scratch, alternating
chunks in one process); whole chunks bf16 216 -> 202 ms, int8 255 -> 229, fp32 359 -> 350; the full-size SmolVLA's
bf16 1,070 -> 1,054, int8 1,371 -> 1,277. With workers that spin before they sleep (`omp_wait_policy: brief`) the
split lost the int8 vision stage (38.5 against 31 ms), and with libgomp's own spinning its idle workers compete with
the extra threads: so only under passive waiting.

A transform from outside the model, as a precision is: a family names the modules whose batch items are
independent (`per_image_modules`, "vision"), and `use_image_threads` replaces each one's `forward` on the
instance (the module tree and its state dict are unchanged). Not applied on a GPU, with one torch thread, where
XNNPACK's kernels run the linears (one ExecuTorch method is not called from two threads at once), or under
autograd.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import torch
from torch import nn

from omni_ros.cpu_threads import torch_threads


class ImageThreads:
    """A module's `forward` run on parts of its batch at once: `threads` parts, each on one torch thread."""

    def __init__(self, forward: Callable[..., torch.Tensor], threads: int) -> None:
        if threads < 2:
            raise ValueError(f"ImageThreads needs at least 2 threads, got {threads}")
        self.forward, self.threads = forward, threads
        self._pool = ThreadPoolExecutor(threads - 1, thread_name_prefix="omni-images")

    def __call__(self, images: torch.Tensor, *rest: Any) -> torch.Tensor:
        parts = min(self.threads, images.shape[0])
        if parts < 2 or torch.is_grad_enabled():
            return self.forward(images, *rest)
        # Each argument that is a tensor is split along the batch as the images are (pi0's FiLM condition).
        pieces = [images.tensor_split(parts)] + [
            r.tensor_split(parts) if isinstance(r, torch.Tensor) else [r] * parts for r in rest
        ]
        calls = list(zip(*pieces, strict=True))
        # Inference and grad modes are thread-local: the workers take the caller's (no autograd: checked above).
        inference = torch.is_inference_mode_enabled()

        def run(args: tuple[Any, ...]) -> torch.Tensor:
            with torch.inference_mode(inference), torch.no_grad(), torch_threads(1):
                return self.forward(*args)

        # This thread on one torch thread first, so the workers' threads start at one too (torch reads the
        # process's count when a thread first runs an op).
        with torch_threads(1):
            futures: list[Future[torch.Tensor]] = [self._pool.submit(run, args) for args in calls[1:]]
            try:
                first = run(calls[0])
            finally:
                wait(futures)  # never leave a worker running on this call's tensors
            return torch.cat([first, *(f.result() for f in futures)])

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def use_image_threads(model: nn.Module, threads: int) -> list[ImageThreads]:
    """Run each of `model.per_image_modules` on `threads` threads, one image part each; returns what it set."""
    if threads < 2:
        return []
    applied = []
    for name in getattr(model, "per_image_modules", ()):
        module = getattr(model, name)
        split = ImageThreads(module.forward, threads)
        module.forward = split  # on the instance: nn.Module.__call__ reads self.forward
        applied.append(split)
    return applied
