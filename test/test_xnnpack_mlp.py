"""int8 on XNNPACK runs each declared MLP (SigLIP's fc1 / fc2, Gemma's and Llama's gate / up / down) as one method:
its numbers are the per-linear methods' (per channel weights, per token activations, the hidden one included),
every activation the families use, more rows than a method takes, and the eager MLP on the int8 linears under
autograd and for a decode step's few rows."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from omni_ros import cpu_features
from omni_ros.cpu_features import CpuFeatures
from omni_ros.policy.layers import mlp
from omni_ros.policy.pi0.gemma import GatedMLP
from omni_ros.policy.pi0.vision import VitBlock
from omni_ros.policy.precision import PrecisionChoice, apply_precision, xnnpack_mlp
from omni_ros.policy.smolvla.modules import SiluMLP

pytestmark = pytest.mark.usefixtures("torch_one_thread")
VNNI = CpuFeatures("x86_64", "test xeon", frozenset({"avx2", "avx512f", "avx512_vnni"}))
INT8 = PrecisionChoice("int8", "test", kernel="xnnpack")
# int8 per token against float32 on random weights (they amplify rounding more than trained ones do).
INT8_REL_L2 = 0.04
# One method per MLP against one per linear: the same quantization (XNNPACK's, the hidden activation included);
# only float rounding of the activation (XNNPACK's elementwise kernels against torch's) can move a hidden value
# across a rounding step.
SAME_NUMBERS_REL_L2 = 2e-3


class _Mlps(torch.nn.Module):
    """One module of each MLP kind the families have."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.vit = VitBlock(SimpleNamespace(width=64, num_heads=4, mlp_dim=96), approximate="tanh")
        self.gated_tanh = GatedMLP(64, 96, approximate="tanh")
        self.gated_exact = GatedMLP(64, 80)
        self.silu = SiluMLP(64, 96)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [self.vit(x), self.gated_tanh(x), self.gated_exact(x), self.silu(x)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(np.linalg.norm((a - b).numpy()) / np.linalg.norm(b.numpy()))


class _TwoMlps(torch.nn.Module):
    """Two of them, with one XNNPACK method per linear: the reference numbers of the one-method MLPs."""

    def __init__(self) -> None:
        super().__init__()
        whole = _Mlps()
        self.gated_tanh, self.silu = whole.gated_tanh, whole.silu


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A float32 model, the same with int8 on XNNPACK (one method per MLP), two of its MLPs with one method per
    linear, and the first's applied precision."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu_features, "detect", lambda: VNNI)
        fp32, fused, per_linear = _Mlps(), _Mlps(), _TwoMlps()
        torch.set_num_threads(1)
        cache = tmp_path_factory.mktemp("kernels")
        applied = apply_precision(fused, INT8, cache_dir=cache, label="mlps")
        patch.setattr(xnnpack_mlp, "mlp_specs", lambda model, names: [])
        apply_precision(per_linear, INT8, cache_dir=cache, label="per_linear")
    return fp32, fused, per_linear, applied


def test_each_mlp_is_one_method_with_the_per_linear_numbers(models):
    fp32, fused, per_linear, applied = models
    assert applied.fused_mlps == 4
    manifest = json.loads((applied.cache / "manifest.json").read_text())
    assert sorted(manifest["mlps"].values()) == ["gated_exact", "gated_tanh", "silu", "vit"]
    # Only the attention's linears stay methods of their own: no MLP linear is in a linear method.
    assert sorted(map(sorted, manifest["methods"].values())) == [["vit.proj"], ["vit.qkv"]]
    assert fused.vit.fc1.kernel == "xnnpack (mlp)" and fused.silu.down_proj.kernel == "xnnpack (mlp)"
    assert per_linear.silu.down_proj.kernel == "xnnpack"
    x = torch.randn(2, 150, 64, generator=torch.Generator().manual_seed(1))  # 300 rows: more than a method takes
    with torch.no_grad():
        for name in ("gated_tanh", "silu"):
            one, linears = getattr(fused, name)(x), getattr(per_linear, name)(x)
            assert one.shape == linears.shape and _rel(one, linears) < SAME_NUMBERS_REL_L2, name
        for name, reference, one in zip(("vit", "gelu_tanh", "gelu", "silu"), fp32(x), fused(x), strict=True):
            assert 1e-4 < _rel(one, reference) < INT8_REL_L2, name  # int8, not float32 again


def test_gradients_and_a_few_rows_take_the_eager_mlp(models):
    _, fused, _, _ = models
    layer = fused.gated_tanh
    args = (layer.gate_proj, layer.up_proj, layer.down_proj, layer.activation)
    with torch.no_grad():
        few = torch.randn(1, 3, 64)  # a decode step: the int8 linears' matrix-vector path
        torch.testing.assert_close(layer(few), mlp(*args, few), rtol=0, atol=0)
    x = torch.randn(2, 40, 64, requires_grad=True)
    (grad,) = torch.autograd.grad(layer(x).square().sum(), x)  # guided RTC differentiates through a step
    (eager,) = torch.autograd.grad(mlp(*args, x).square().sum(), x)
    torch.testing.assert_close(grad, eager, rtol=0, atol=0)
