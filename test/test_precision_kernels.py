"""The pieces a bf16 / int8 precision adds around the linears: the shared input conversion and bf16 attention."""

from __future__ import annotations

import torch
from torch import nn

from omni_ros.policy.layers import sdpa
from omni_ros.policy.precision.attention import bf16_sdpa, use_attention_kernel
from omni_ros.policy.precision.bf16_linear import Bf16Linear
from omni_ros.policy.precision.int8_linear import Int8Linear
from omni_ros.policy.precision.shared_input import SharedInput


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_projections_of_one_input_share_its_conversion():
    """q / k / v reading one tensor convert it once; each result equals the unshared layer's."""
    torch.manual_seed(0)
    linears = [nn.Linear(64, n) for n in (64, 16, 16)]
    x = torch.randn(2, 9, 64)
    for make in (lambda lin, shared: Int8Linear(lin, shared=shared), lambda lin, shared: Bf16Linear(lin, shared)):
        shared = SharedInput()
        calls = []
        get = shared.get

        def counting(t, convert, get=get, calls=calls):
            return get(t, lambda u: calls.append(1) or convert(u))

        shared.get = counting  # type: ignore[method-assign]
        with torch.inference_mode():
            together = [make(lin, shared)(x) for lin in linears]
            alone = [make(lin, None)(x) for lin in linears]
        assert len(calls) == 1
        for a, b in zip(together, alone, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_changed_or_new_input_is_converted_again():
    shared = SharedInput()
    seen = []

    def convert(t):
        seen.append(t.clone())
        return t.sum()

    x = torch.ones(3)
    assert shared.get(x, convert) == 3
    assert shared.get(x, convert) == 3 and len(seen) == 1  # same tensor, unchanged: reused
    x.mul_(2)  # in place: its version moves on
    assert shared.get(x, convert) == 6 and len(seen) == 2
    assert shared.get(torch.ones(3), convert) == 3 and len(seen) == 3  # equal values, another tensor


def test_bf16_attention_is_close_to_float32_and_differentiable():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 8, 51, 64), torch.randn(1, 1, 120, 64), torch.randn(1, 1, 120, 64)
    mask = torch.rand(1, 1, 51, 120) > 0.2
    mask[..., 0] = True
    reference = sdpa(q, k, v, mask)
    with torch.inference_mode():
        out = bf16_sdpa(q, k, v, mask)
    assert out.dtype == torch.float32
    assert 1e-5 < _rel(out, reference) < 0.01  # bf16 rounding of q, k, v: not float32 again, within 1%
    q.requires_grad_(True)
    (grad,) = torch.autograd.grad(bf16_sdpa(q, k, v, mask).sum(), q)  # guided RTC: the float32 kernel
    assert torch.isfinite(grad).all()


class _Attends(nn.Module):
    attention_kernel = staticmethod(sdpa)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return self.attention_kernel(q, q, q, None)


def test_the_attention_kernel_is_swapped_from_outside():
    model = nn.Sequential(_Attends(), nn.Linear(4, 4), _Attends())
    assert use_attention_kernel(model, bf16_sdpa) == 2
    assert all(m.attention_kernel is bf16_sdpa for m in model if isinstance(m, _Attends))
    assert _Attends.attention_kernel is sdpa  # the class default is untouched: other models keep float32
