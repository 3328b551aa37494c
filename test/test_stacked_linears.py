"""Linears that read one tensor as one product (omni_ros/policy/precision/stacked_linears.py): a module's
`shared_input_linears` become one int8 product whose columns are each member's own numbers, computed once
per input tensor, in eager and compiled graphs; bf16 and float32 stay unstacked.

Tolerances stated here: int8 members equal their own Int8Linear exactly (the same integers and scales); the
guided (autograd) gradient within 1e-5 of the float product's.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from omni_ros.policy.compiled_stages import CompiledStage, cxx_compiler
from omni_ros.policy.cpu_linear import weight_count
from omni_ros.policy.layers import MlpKernel, mlp
from omni_ros.policy.precision import PrecisionChoice, apply_precision
from omni_ros.policy.precision.bf16_linear import Bf16Linear
from omni_ros.policy.precision.int8_linear import Int8Linear
from omni_ros.policy.precision.stacked_linears import StackedLinears, StackedSlice

pytestmark = pytest.mark.usefixtures("torch_one_thread")
INT8 = PrecisionChoice("int8", "test", kernel="onednn")
BF16 = PrecisionChoice("bf16", "test")


class Mlp(nn.Module):
    mlp_kernel: MlpKernel = staticmethod(mlp)
    mlp_linears = ("gate", "up", "down")
    activation = "silu"
    shared_input_linears = (("gate", "up"),)

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(32, 48, bias=False), nn.Linear(32, 48, bias=False), nn.Linear(48, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp_kernel(self.gate, self.up, self.down, self.activation, x)


class Block(nn.Module):
    # q / k / v read one tensor; `other` reads another of another width and is never stacked.
    shared_input_linears = (("q", "k", "v"), ("other", "q"))

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 16), nn.Linear(32, 16)
        self.other = nn.Linear(16, 32)
        self.mlp = Mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        return self.mlp(x + q * (k * v).repeat(1, 2) + self.other(k))


def _block() -> Block:
    torch.manual_seed(0)
    return Block().eval()


def test_int8_members_are_their_own_products_computed_once_per_input():
    float_block = _block()
    block = copy.deepcopy(float_block)
    apply_precision(block, INT8)
    assert all(isinstance(getattr(block, n), StackedSlice) for n in ("q", "k", "v"))
    assert isinstance(block.other, Int8Linear)  # another input width: apart
    assert block.q.stacked is block.k.stacked is block.v.stacked
    assert isinstance(block.q.stacked.layer, Int8Linear)  # the precision swapped the stacked linear
    assert isinstance(block.mlp.gate, StackedSlice) and isinstance(block.mlp.down, Int8Linear)  # int8 MLPs stack
    calls = []
    block.q.stacked.layer.register_forward_hook(lambda *_: calls.append(1))  # the product, watched
    x = torch.randn(5, 32)
    with torch.inference_mode():
        for name in ("q", "k", "v"):
            own = Int8Linear(getattr(float_block, name))(x)
            assert torch.equal(getattr(block, name)(x), own), name  # the same integers, the same scales
        assert len(calls) == 1  # one product for the three members
        block.k(torch.randn(5, 32))  # another tensor: computed again, never another input's columns
        assert len(calls) == 2
        block(x)  # the whole block runs through the members
    with torch.no_grad():  # a tensor with a version counter (inference tensors have none: SharedInput's rule)
        y = x.clone()
        block.q(y)
        y.add_(1.0)  # modified in place: its version moved on, so the kept product is not its product
        assert torch.equal(block.q(y), Int8Linear(float_block.q)(y))
    # Each member counts its own weights once: the model holds the float model's weights.
    assert weight_count(block) == sum(p.numel() for p in float_block.parameters())


@pytest.mark.parametrize("choice", [PrecisionChoice("fp32", "test"), BF16], ids=["fp32", "bf16"])
def test_float32_and_bf16_are_not_stacked(choice):
    block = _block()
    apply_precision(block, choice)
    assert not any(isinstance(m, StackedSlice | StackedLinears) for m in block.modules())
    if choice.precision == "bf16":
        assert isinstance(block.q, Bf16Linear) and isinstance(block.mlp.gate, Bf16Linear)


def test_guided_steps_differentiate_through_the_members():
    float_block = _block()
    block = copy.deepcopy(float_block)
    apply_precision(block, INT8)
    x = torch.randn(4, 32, requires_grad=True)
    (block.q(x).sum() + block.v(x).square().sum()).backward()
    # Under autograd an int8 layer is the float product with its dequantized weight (int8_linear.py).
    ref = x.detach().clone().requires_grad_(True)
    q, v = Int8Linear(float_block.q), Int8Linear(float_block.v)
    (q(ref).sum() + v(ref).square().sum()).backward()
    assert x.grad is not None and ref.grad is not None
    torch.testing.assert_close(x.grad, ref.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(cxx_compiler() is None, reason="no C++ compiler for TorchInductor")
def test_a_compiled_graph_runs_each_stacked_product_once(monkeypatch):
    from torch._inductor import config as inductor_config
    from torch.profiler import ProfilerActivity, profile

    # The compiled graph's kernels as profiler events (they are not otherwise).
    monkeypatch.setattr(inductor_config.cpp, "enable_kernel_profile", True)
    float_block = _block()
    block = copy.deepcopy(float_block)
    apply_precision(block, INT8)
    if block.q.stacked.layer.packed is None:
        pytest.skip("no oneDNN int8 linear on this CPU (the int8 product is _int_mm or emulated)")
    stage = CompiledStage(block.forward, "block")
    x = torch.randn(6, 32)
    with torch.inference_mode():
        eager = block(x)
        stage(x)
        stage.seal()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = stage(x)
    assert stage.keys  # it compiled, and the call below ran the graph
    products = [e for e in prof.events() if "qlinear_pointwise" in e.name and "onednn::" not in e.name]
    products = products or [e for e in prof.events() if "qlinear_pointwise" in e.name]
    # q / k / v: one stacked product; other; gate / up: one; down: four in all, not seven.
    assert len(products) == 4, sorted({e.name for e in prof.events()})
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
