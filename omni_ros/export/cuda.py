"""CUDA lowering through ExecuTorch's CUDA backend (AOTInductor-compiled kernels inside the `.pte`).

It needs a CUDA build of torch with a visible GPU at export time, and an ExecuTorch
runtime built with the CUDA backend to run the result. Both are checked up
front so a CPU-only machine fails with one clear sentence.
"""

from __future__ import annotations

import torch

from omni_ros.errors import OmniRosError


class CudaUnavailableError(OmniRosError, RuntimeError):
    """CUDA export or execution was asked for on a machine that cannot do it."""


def check_cuda_export() -> None:
    if not torch.cuda.is_available():
        raise CudaUnavailableError(
            f"--target cuda needs a CUDA GPU and a CUDA build of torch at export time; this torch is "
            f"{torch.__version__} (CUDA: {torch.version.cuda or 'not built with CUDA'}). Export on the GPU machine, "
            "or use --target xnnpack for CPUs"
        )
    try:
        from executorch.backends.cuda.cuda_partitioner import CudaPartitioner  # noqa: F401
    except ImportError as exc:
        raise CudaUnavailableError(
            f"this ExecuTorch has no CUDA backend ({exc}); install executorch with CUDA"
        ) from exc


def lower_cuda(programs: dict):
    """Lower exported programs (name -> ExportedProgram, already on the GPU) with the CUDA partitioner."""
    check_cuda_export()
    from executorch.backends.cuda.cuda_backend import CudaBackend
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner
    from executorch.exir import to_edge_transform_and_lower

    partitioners = {name: [CudaPartitioner([CudaBackend.generate_method_name_compile_spec(name)])] for name in programs}
    return to_edge_transform_and_lower(programs, partitioner=partitioners)
