"""omni_ros/lowering.py: torch's composite-op walk done once inside the context, torch's own after it."""

from __future__ import annotations

import torch
import torch._export.utils as utils
import torch.export.exported_program as exported_program
from torch import nn

from omni_ros.lowering import NAME, cia_ops_collected_once


def test_the_walk_is_done_once_inside_and_restored_after():
    original = getattr(utils, NAME)
    assert getattr(exported_program, NAME) is original  # torch still imports it by name (else the context is a no-op)
    with cia_ops_collected_once():
        patched = getattr(exported_program, NAME)
        assert patched is not original
        first, second = patched(), patched()
        assert first is second and first == original()
    assert getattr(exported_program, NAME) is original
    assert getattr(utils, NAME) is original


def test_a_program_lowered_inside_computes_what_eager_does():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    programs = {f"m{i}": torch.export.export(model, (x,)) for i in range(2)}
    with cia_ops_collected_once():
        buffer = to_edge_transform_and_lower(programs, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    program = Runtime.get().load_program(buffer)
    for name in programs:
        (out,) = program.load_method(name).execute([x])
        # float32 XNNPACK GEMMs against torch's: summation order only
        torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
