"""make_backward_delegable: a traced backward's ops rewritten into forms XNNPACK delegates, with the same numbers.

The traced function is a block of the shape the families' guided steps differentiate: a LayerNorm in its export form
(4-D means, rsqrt), a slice of the tokens, a residual; its gradient with respect to the input, by autograd inside
make_fx (as export/rtc_step.py traces the guided step). Tolerance 1e-6 abs: a sum written as a mean times the count
rounds differently by an ulp or so, on values of order 1.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from omni_ros.export.backward_ops import make_backward_delegable
from omni_ros.export.report import delegation_report
from omni_ros.export.rtc_step import constant_products_to_linears
from omni_ros.lowering import lower_to_xnnpack, provenance_shared
from omni_ros.policy.layers import layer_norm

TOL = 1e-6
# What autograd's decomposed backward of that block leaves to ExecuTorch's portable kernels without the pass
# (each also splits the graph into another XNNPACK call).
NOT_DELEGATED = {"sum", "slice_scatter", "pow", "expand_copy", "alias_copy", "full", "mul", "div"}


class Block(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, width)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.proj(layer_norm(self.norm, x, export_form=True)).tanh()
        return y[:, 2:7] / 3.0


def _input_gradient(block: Block):
    def grad(x: torch.Tensor, cotangent: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            leaf = x.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(block(leaf), leaf, cotangent)
        return g

    return grad


def _traced(block: Block, inputs: tuple[torch.Tensor, ...]) -> torch.fx.GraphModule:
    for p in block.parameters():
        p.requires_grad_(False)
    return make_fx(_input_gradient(block), decomposition_table=core_aten_decompositions())(*inputs)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(1, 9, 16, generator=generator), torch.randn(1, 5, 16, generator=generator)


def _ops(graph: torch.fx.GraphModule) -> set[str]:
    return {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}


def _lowered(graph: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """`graph` lowered to XNNPACK as the guided step is (its products with weights as linears first)."""
    constant_products_to_linears(graph)
    with torch.no_grad(), provenance_shared():
        edge = lower_to_xnnpack({"forward": torch.export.export(graph, inputs)})
    return delegation_report(edge, ["forward"])["forward"]


def test_the_rewritten_backward_computes_the_same_gradient():
    block, inputs = Block(), _inputs()
    want = _input_gradient(block)(*inputs)
    graph = _traced(block, inputs)
    before = _ops(graph)
    # The block's backward holds each pattern the pass knows (else this test would check nothing).
    for op in ("sum.dim_IntList", "slice_scatter", "pow.Tensor_Scalar", "expand.default", "div.Scalar"):
        assert any(op in name for name in before), (op, sorted(before))
    done = make_backward_delegable(graph)
    assert sum(done.values()) > 0
    after = _ops(graph)
    for op in ("sum.dim_IntList", "slice_scatter", "pow.Tensor_Scalar", "expand.default", "mul.Scalar", "div.Scalar"):
        assert not any(op in name for name in after), (op, sorted(after))
    got = graph(*inputs)
    assert torch.allclose(got, want, rtol=0, atol=TOL), float((got - want).abs().max())
    assert float(got.abs().max()) > 0.1  # a gradient, not zeros


def test_xnnpack_takes_the_whole_rewritten_backward():
    block, inputs = Block(), _inputs()
    plain = _lowered(_traced(block, inputs), inputs)
    assert NOT_DELEGATED & set(plain["portable"]), plain["portable"]  # what the pass is for
    graph = _traced(block, inputs)
    make_backward_delegable(graph)
    rewritten = _lowered(graph, inputs)
    assert not NOT_DELEGATED & set(rewritten["portable"]), rewritten["portable"]
    assert rewritten["delegated_subgraphs"] == 1 < plain["delegated_subgraphs"]


def test_integer_arithmetic_is_left_alone():
    """Sums and expands of integer tensors (positions, masks) keep their ops: a mean of int64 does not exist."""

    def positions(mask: torch.Tensor) -> torch.Tensor:
        return mask.sum(dim=-1, keepdim=True).expand(2, 6) * 2

    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0]])
    graph = make_fx(positions, decomposition_table=core_aten_decompositions())(mask)
    assert make_backward_delegable(graph) == {}
    assert torch.equal(graph(mask), positions(mask))
