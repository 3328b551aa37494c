"""omni_ros/lowering.py: torch's composite-op walk done once inside its context, torch's own after it; node
provenance shared inside the other, and the same programs either way; the tanh GELU written out for XNNPACK."""

from __future__ import annotations

import contextlib
import copy

import torch
import torch._export.utils as utils
import torch.export.exported_program as exported_program
import torch.fx.traceback as fx_traceback
from torch import nn

from omni_ros.lowering import NAME, cia_ops_collected_once, lower_to_xnnpack, provenance_shared, write_out_tanh_gelu


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


class TanhGelu(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x, approximate="tanh") + torch.nn.functional.gelu(x)


def test_the_tanh_gelu_reaches_xnnpack_written_out():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    x = torch.linspace(-6, 6, 4096).reshape(8, 512)
    want = TanhGelu()(x)

    def run(buffer: bytes) -> torch.Tensor:
        return Runtime.get().load_program(buffer).load_method("forward").execute([x])[0]

    # XNNPACK's partitioner takes aten.gelu(approximate="tanh") and computes the exact GELU: up to 4.7e-4 apart
    # over this range (measured). If this stops failing, XNNPACK honours the tanh form and the pass can go.
    raw = to_edge_transform_and_lower(
        {"forward": torch.export.export(TanhGelu(), (x,))}, partitioner=[XnnpackPartitioner()]
    )
    assert (run(raw.to_executorch().buffer) - want).abs().max() > 1e-4
    program = torch.export.export(TanhGelu(), (x,))
    assert write_out_tanh_gelu(copy.deepcopy(program)) == 1  # the exact GELU is left to XNNPACK's own op
    buffer = lower_to_xnnpack({"forward": program}).to_executorch().buffer
    torch.testing.assert_close(run(buffer), want, atol=1e-5, rtol=0)  # float32 ops on values to 12: measured 1.9e-6


def _provenance_records() -> list:
    program = torch.export.export(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),))
    graph = program.run_decompositions().graph  # a pass: its nodes record where they came from
    records = [n.meta["from_node"] for n in graph.nodes if n.meta.get("from_node")]
    assert records, "torch.export no longer records node provenance: the context has nothing to share"
    return records


def test_provenance_is_shared_inside_and_copied_after():
    records = _provenance_records()
    with provenance_shared():
        copied = copy.deepcopy(records)
        assert copied is not records and copied[0] is not records[0]  # the lists are new ...
        assert copied[0][0] is records[0][0]  # ... the records in them the same (never changed once built)
    assert not hasattr(fx_traceback.NodeSource, "__deepcopy__")
    after = copy.deepcopy(records)
    assert after[0][0] is not records[0][0]
    assert after[0][0].to_dict() == records[0][0].to_dict()


def _lowered(model: nn.Module, x: torch.Tensor, shared: bool) -> bytes:
    with provenance_shared() if shared else contextlib.nullcontext():
        program = torch.export.export(model, (x,))
        return lower_to_xnnpack({"forward": program}).to_executorch().buffer


def test_programs_lowered_with_shared_provenance_are_the_same_bytes():
    from omni_ros.policy.quantize import quantize_model

    torch.manual_seed(0)
    x = torch.randn(4, 16)
    for quantize in ("none", "int8-dynamic"):
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
        model = quantize_model(model, quantize)
        with torch.no_grad():
            assert _lowered(model, x, shared=True) == _lowered(model, x, shared=False), quantize
