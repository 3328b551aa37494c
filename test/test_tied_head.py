"""A tied output head (logits = hidden x the token embedding) follows `policy.precision` as the linears do."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import omni_ros.policy
from omni_ros.policy.precision import apply_precision, choose
from omni_ros.policy.precision.bf16_linear import Bf16Linear
from omni_ros.policy.precision.int8_linear import Int8Linear

REFERENCE = Path(__file__).parent / "fixtures" / "reference"
# Relative L2 of one row of logits against float32: bf16 rounds the hidden state and the table (2^-9 each), int8
# quantizes the table per row and, past a few rows, the activations per row.
BOUNDS = {"bf16": 0.01, "int8": 0.04}


def _choice(precision: str):
    # As a policy load resolves it: on a CPU without an int8 dot product (what the suite believes, conftest.py)
    # oneDNN's int8 product is emulated, since there the int8 kernels saturate their 16-bit sums (measured with
    # oneDNN held to AVX2: 10% off float32).
    return choose(precision, int8_kernel="onednn")


class TinyDecoder(nn.Module):
    tied_head = "embed"
    head_kernel = staticmethod(F.linear)

    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.proj = nn.Linear(width, width)  # a decoder's linears (the precision swaps those too)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head_kernel(hidden, self.embed.weight)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("precision", ["bf16", "int8"])
@pytest.mark.parametrize(("width", "rows"), [(32, 1), (32, 9), (24, 1)])  # 32: int8's one-row path; 24: its GEMM
def test_the_tied_head_computes_in_the_precision_and_stays_close_to_float32(precision, width, rows):
    torch.manual_seed(0)
    model = TinyDecoder(300, width)
    hidden = torch.randn(rows, width)
    exact = F.linear(hidden, model.embed.weight).detach()
    table = model.embed.weight.detach().clone()
    apply_precision(model, _choice(precision))
    assert model.head_kernel is not F.linear
    with torch.inference_mode():
        got = model.logits(hidden)
        other = torch.randn(5, width)
        # Another weight through the slot is the float32 product, exactly.
        torch.testing.assert_close(model.head_kernel(hidden, other), F.linear(hidden, other), rtol=0, atol=0)
    assert got.dtype == torch.float32 and got.shape == exact.shape
    error = _relative(got, exact)
    assert 1e-6 < error < BOUNDS[precision], error  # rounded (the kernel ran), and not far off
    # The embedding the token lookups read is untouched.
    torch.testing.assert_close(model.embed.weight.detach(), table, rtol=0, atol=0)


def test_under_autograd_the_tied_head_is_the_float32_product():
    torch.manual_seed(0)
    model = TinyDecoder(50, 32)
    apply_precision(model, _choice("int8"))
    hidden = torch.randn(1, 32, requires_grad=True)
    got = model.logits(hidden)
    torch.testing.assert_close(got, F.linear(hidden, model.embed.weight), rtol=0, atol=0)
    got.sum().backward()
    assert hidden.grad is not None


@pytest.mark.parametrize(("precision", "layer"), [("bf16", Bf16Linear), ("int8", Int8Linear)])
def test_a_pi0fast_policy_reads_its_logits_through_the_precisions_head(precision, layer):
    policy = omni_ros.policy.load(REFERENCE / "pi0fast_1cam", precision=precision)
    model = policy.runner.model
    kernel = model.head_kernel
    assert kernel is not F.linear
    cells = [c.cell_contents for c in (kernel.__closure__ or ())]
    assert any(isinstance(c, layer) for c in cells), cells
    float32 = omni_ros.policy.load(REFERENCE / "pi0fast_1cam", precision="fp32").runner.model
    assert float32.head_kernel is F.linear
    torch.manual_seed(0)
    hidden = torch.randn(2, model.cfg.backbone.width)
    with torch.inference_mode():
        error = _relative(model.logits(hidden), float32.logits(hidden))
    assert 1e-6 < error < BOUNDS[precision], error
