"""The pieces a bf16 / int8 precision adds around the linears: the shared input conversion, bf16 attention and the
fused bf16 MLP."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.int8_reference import exact_int8_product
from omni_ros.policy.layers import mlp, sdpa
from omni_ros.policy.pi0.gemma import GatedMLP
from omni_ros.policy.precision.attention import bf16_sdpa, native_bf16, use_attention_kernel
from omni_ros.policy.precision.bf16_linear import Bf16Linear
from omni_ros.policy.precision.fused_mlp import bf16_mlp, use_mlp_kernel
from omni_ros.policy.precision.int8_linear import Int8Linear, integer_products_exact
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


def _mlp_layers(gated: bool, bias: bool) -> tuple[nn.Linear, nn.Linear | None, nn.Linear]:
    torch.manual_seed(1)
    first, down = nn.Linear(96, 256, bias=bias), nn.Linear(256, 96, bias=bias)
    return first, nn.Linear(96, 256, bias=bias) if gated else None, down


@pytest.mark.parametrize(
    "activation,gated,bias",
    [("gelu_tanh", False, True), ("gelu", False, True), ("gelu_tanh", True, False), ("silu", True, False)],
)
def test_fused_bf16_mlp_matches_float32_as_the_unfused_one_does(activation: str, gated: bool, bias: bool):
    """SigLIP's fc1 / fc2 and the gated Gemma / Llama MLPs: the activation (and the gate's product) as post-ops of
    the bf16 products. Both bf16 forms stay within 1% of float32; where oneDNN packs bf16 the fused one runs (not
    the unfused numbers again), elsewhere it is the unfused kernel exactly."""
    first, up, down = _mlp_layers(gated, bias)
    x = torch.randn(2, 33, 96)
    with torch.inference_mode():
        reference = mlp(first, up, down, activation, x)
        shared = SharedInput()
        b_first, b_down = Bf16Linear(first, shared), Bf16Linear(down, shared)
        b_up = None if up is None else Bf16Linear(up, shared)
        unfused = mlp(b_first, b_up, b_down, activation, x)
        fused = bf16_mlp(b_first, b_up, b_down, activation, x)
    assert fused.dtype == torch.float32 and fused.shape == reference.shape
    assert _rel(unfused, reference) < 0.01 and _rel(fused, reference) < 0.01
    if b_first.packed:
        assert _rel(fused, unfused) > 0  # the fused path ran: its activation saw the unrounded accumulator
    else:
        torch.testing.assert_close(fused, unfused, rtol=0, atol=0)


def test_fused_mlp_falls_back_under_autograd_and_for_float_layers():
    first, up, down = _mlp_layers(True, False)
    x = torch.randn(1, 5, 96, requires_grad=True)
    # Plain float32 layers (the robot-side ones, an fp32 model): exactly the eager kernel.
    torch.testing.assert_close(bf16_mlp(first, up, down, "silu", x), mlp(first, up, down, "silu", x), rtol=0, atol=0)
    b = [Bf16Linear(layer) for layer in (first, up, down)]
    (grad,) = torch.autograd.grad(bf16_mlp(b[0], b[1], b[2], "gelu_tanh", x).sum(), x)  # guided RTC
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_the_mlp_kernel_is_swapped_from_outside():
    model = nn.Sequential(GatedMLP(16, 32, "tanh"), nn.Linear(16, 16), GatedMLP(16, 32))
    assert use_mlp_kernel(model, bf16_mlp) == 2
    assert all(m.mlp_kernel is bf16_mlp for m in model if isinstance(m, GatedMLP))
    assert GatedMLP.mlp_kernel is mlp  # the class default is untouched


def _pretend_cpu(monkeypatch: pytest.MonkeyPatch, flags: str, model: str = "test") -> None:
    from omni_ros import cpu_features

    monkeypatch.setattr(
        cpu_features, "detect", lambda: cpu_features.CpuFeatures("x86_64", model, frozenset(flags.split()))
    )


@pytest.mark.skipif(not integer_products_exact(), reason="needs a CPU with an int8 dot product (VNNI / AMX): none here")
@pytest.mark.parametrize("model", ["AMD EPYC", "Intel(R) Xeon(R) Platinum 8488C"])
def test_int8_products_skip_onednn_qlinear_on_amd(monkeypatch, model: str):
    """oneDNN's qlinear ran ~1,000x slower than `_int_mm` on an AMD EPYC with VNNI: `_int_mm` there, same sums."""
    from omni_ros.policy.precision.int8_linear import qlinear_available

    _pretend_cpu(monkeypatch, "avx512_vnni avx512_bf16", model)
    torch.manual_seed(3)
    linear = nn.Linear(64, 32)
    layer = Int8Linear(linear)
    amd = model.startswith("AMD")
    assert layer.kernel == ("int_mm" if amd or not qlinear_available() else "onednn")
    assert (layer.packed is None) == (amd or not qlinear_available())
    x = torch.randn(9, 64)
    with torch.inference_mode():
        rel = float((layer(x) - linear(x)).norm() / linear(x).norm())
    assert 1e-5 < rel < 0.02  # int8 per channel x per token at width 64: near, not float32 again


def test_int8_layers_emulate_where_the_hardware_lacks_an_int8_dot_product_whatever_the_flags(monkeypatch):
    """Flags may claim VNNI ($OMNI_ROS_CPU_FLAGS, a patched detect) on a CPU without it; the integer kernels would
    saturate there, so the layer takes the emulated product: the exact int8 sums up to float32 rounding."""
    from omni_ros import cpu_features

    _pretend_cpu(monkeypatch, "avx2 avx512_vnni")
    avx2 = cpu_features.CpuFeatures("x86_64", "test", frozenset({"avx2", "fma"}))
    monkeypatch.setattr(cpu_features, "hardware", lambda: avx2)
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    layer = Int8Linear(linear)
    assert layer.kernel == "emulated"
    x = torch.randn(9, 64)
    with torch.inference_mode():
        got = layer(x)
    torch.testing.assert_close(got, exact_int8_product(layer, x), rtol=1e-5, atol=1e-5)
    assert 1e-5 < _rel(got, linear(x)) < 0.04  # int8, not float32 again


@pytest.mark.skipif(not native_bf16(), reason="needs a CPU with native bf16 (AVX512_BF16 / AMX): none here")
@pytest.mark.parametrize(
    "flags,expected", [("avx512_bf16 amx_bf16 amx_int8", "bf16"), ("avx512_bf16 avx512_vnni", "fp32")]
)
def test_bf16_attention_only_where_the_cpu_has_bf16_tiles(monkeypatch, flags: str, expected: str):
    """AVX512_BF16 without AMX ran torch's bf16 flash attention slower than float32's: float32 stays there."""
    from omni_ros.policy.pi0.presets import build_preset
    from omni_ros.policy.precision import PrecisionChoice, apply_precision

    _pretend_cpu(monkeypatch, flags)
    model = build_preset("tiny").eval()
    applied = apply_precision(model, PrecisionChoice("bf16", "test"))
    kernels = {m.attention_kernel for m in model.modules() if hasattr(type(m), "attention_kernel")}
    assert applied.attention == expected
    assert kernels == ({bf16_sdpa} if expected == "bf16" else {sdpa})


@pytest.mark.skipif(not native_bf16(), reason="needs a CPU with native bf16 (AVX512_BF16 / AMX): none here")
def test_bf16_precision_fuses_every_mlp_of_a_model_where_the_cpu_has_bf16():
    from omni_ros.policy.pi0.presets import build_preset
    from omni_ros.policy.precision import PrecisionChoice, apply_precision

    model = build_preset("tiny").eval()
    mlps = sum(hasattr(type(m), "mlp_kernel") for m in model.modules())
    applied = apply_precision(model, PrecisionChoice("bf16", "test"))
    assert mlps > 0 and applied.fused_mlps == mlps


@pytest.mark.skipif(not native_bf16(), reason="needs a CPU with native bf16 (AVX512_BF16 / AMX): none here")
def test_a_projection_only_bf16_attention_reads_answers_in_bf16_with_the_same_numbers(monkeypatch):
    """SigLIP's qkv feeds nothing but the attention kernel, which rounds it to bfloat16: returned in bfloat16
    (two passes fewer), the block's output is the same to the bit."""
    from types import SimpleNamespace

    from omni_ros.policy.pi0.vision import VitBlock
    from omni_ros.policy.precision import PrecisionChoice, apply_precision

    _pretend_cpu(monkeypatch, "avx512_bf16 amx_bf16")  # bf16 attention runs only where it pays (AMX)
    torch.manual_seed(2)
    block = VitBlock(SimpleNamespace(width=64, num_heads=4, mlp_dim=128), "tanh").eval()
    apply_precision(block, PrecisionChoice("bf16", "test"))
    assert isinstance(block.qkv, Bf16Linear) and block.qkv.bf16_out
    x = torch.randn(2, 17, 64)
    with torch.inference_mode():
        fast = block(x)
        block.qkv.bf16_out = False
        plain = block(x)
    assert fast.dtype == torch.float32
    torch.testing.assert_close(fast, plain, rtol=0, atol=0)


def test_a_few_rows_read_the_int8_weight_with_bf16_activations():
    """A decoding step's single row takes the int8 weight times the bfloat16-rounded input (float32 sums); the
    GEMM path with per-token int8 activations still serves more rows. Both stay within the int8 bound of float32
    (4%, the issue's), and the single row is the product of exactly those operands (the kernel's bfloat16 output
    rounding: 2^-8 relative at most)."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    layer = Int8Linear(linear)
    assert layer.vector
    one, many = torch.randn(1, 1, 64), torch.randn(1, 9, 64)
    with torch.inference_mode():
        out_one, out_many, float_one = layer(one), layer(many), linear(one)
        operands = one.bfloat16().float() @ layer.dequantized_weight().t()
        gemm_one = layer(torch.cat([one, many], dim=1))[:, :1]  # the same row inside a 10-row GEMM
    assert out_one.shape == (1, 1, 48) and out_one.dtype == torch.float32
    # The rounding is the product's, before the bias: compare the product itself.
    torch.testing.assert_close(out_one - linear.bias.detach(), operands, rtol=2**-8, atol=1e-6)
    assert _rel(out_one, float_one) < 0.04 and _rel(out_many, linear(many).detach()) < 0.04
    assert _rel(out_one, gemm_one) > 1e-6  # the single row did not go through the per-token GEMM


def test_a_width_the_vector_kernel_cannot_take_keeps_the_gemm():
    """torch's int8-weight kernel needs an input width that is a multiple of 16 (24 gave wrong sums): such layers
    answer a single row through the GEMM path, with the same numbers as that row inside a larger call."""
    torch.manual_seed(0)
    linear = nn.Linear(24, 40)
    layer = Int8Linear(linear)
    assert not layer.vector
    x = torch.randn(1, 6, 24)
    with torch.inference_mode():
        alone, inside = layer(x[:, :1]), layer(x)[:, :1]
    torch.testing.assert_close(alone, inside, rtol=0, atol=0)
    assert _rel(alone, linear(x[:, :1]).detach()) < 0.04
