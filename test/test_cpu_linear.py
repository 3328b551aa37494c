"""oneDNN-packed linear layers (`policy.cpu_linear: packed`, the node's and server's default on x86 CPUs):
the same products as nn.Linear, gradients where guided RTC needs them, LeRobot's actions from real layouts,
and a checkpoint's mapped pages let go once a layer holds its packed copy."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import omni_ros.policy
from omni_ros.backends.factory import load_policy
from omni_ros.config import ConfigError, PolicyConfig
from omni_ros.policy.cpu_linear import (
    PackedLinear,
    TransposedLinear,
    pack_linears,
    packed_linear_available,
    weight_count,
)
from omni_ros.policy.layouts.weights import SafetensorsFile, release_mapped_pages
from omni_ros.policy.rtc import RtcRequest
from omni_ros.typed_config import from_dict

REFERENCE = Path(__file__).parent / "fixtures" / "reference"
pytestmark = [
    pytest.mark.usefixtures("torch_one_thread"),
    pytest.mark.skipif(not packed_linear_available(), reason="oneDNN's packed linear is for x86 torch builds"),
]


@pytest.mark.parametrize("layout", [PackedLinear, TransposedLinear])
@pytest.mark.parametrize(
    ("shape", "bias"), [((7, 48), True), ((1, 1, 48), True), ((2, 51, 48), False), ((3, 5, 9, 48), True)]
)
def test_a_swapped_linear_computes_nn_linear(layout, shape, bias):
    torch.manual_seed(0)
    dense = nn.Linear(48, 80, bias=bias)
    swapped = layout(dense)
    x = torch.randn(shape)
    with torch.inference_mode():
        np.testing.assert_allclose(swapped(x).numpy(), dense(x).numpy(), rtol=1e-5, atol=1e-5)
        # A strided input (a transposed view) too.
        xt = torch.randn(shape[-2] if len(shape) > 1 else 1, 6, 48).transpose(0, 1)
        np.testing.assert_allclose(swapped(xt).numpy(), dense(xt).numpy(), rtol=1e-5, atol=1e-5)
    weight = swapped.weight.to_dense() if swapped.weight.is_mkldnn else swapped.weight
    torch.testing.assert_close(weight, dense.weight.detach(), rtol=0, atol=0)
    if layout is PackedLinear:
        assert swapped.weight.is_mkldnn and swapped.weight.device.type == "cpu"
    else:
        assert swapped.weight_t.is_contiguous() and swapped.weight_t.shape == (48, 80)


@pytest.mark.parametrize("layout", [PackedLinear, TransposedLinear])
def test_gradients_flow_through_a_swapped_linear_where_one_is_asked_for(layout):
    torch.manual_seed(1)
    dense = nn.Linear(16, 8)
    packed = layout(dense)
    x1 = torch.randn(4, 16, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    (dense(x1) ** 2).sum().backward()
    (packed(x2) ** 2).sum().backward()
    assert x2.grad is not None
    torch.testing.assert_close(x2.grad, x1.grad)


@pytest.mark.parametrize(("cpu_model", "narrow"), [("AMD EPYC 9R14", "PackedLinear"), ("Intel(R) Xeon(R)", "Linear")])
def test_a_row_vector_module_gets_widening_linears_transposed_and_the_others_as_the_cpu_runs_them_fastest(
    monkeypatch, cpu_model, narrow
):
    """Widening single-row products from transposed weights; narrowing and square ones packed on AMD, plain
    elsewhere (each measured the faster there); every linear outside the row-vector modules packed."""
    from omni_ros import cpu_features
    from omni_ros.cpu_features import CpuFeatures

    real = cpu_features.detect()
    monkeypatch.setattr(cpu_features, "detect", lambda: CpuFeatures(real.arch, cpu_model, real.flags))

    class Decoder(nn.Module):
        row_vector_modules = ("backbone",)

        def __init__(self) -> None:
            super().__init__()
            self.backbone = nn.ModuleDict({"up": nn.Linear(8, 32), "down": nn.Linear(32, 8), "square": nn.Linear(8, 8)})
            self.head = nn.Linear(8, 32)

    model = Decoder()
    before = sum(p.numel() for p in model.parameters())
    x = torch.randn(1, 8)
    expected = model.backbone["square"](model.backbone["up"](x).relu()[:, :8])
    assert pack_linears(model) == (4 if narrow == "PackedLinear" else 2)  # a plain linear is left as it is
    names = ("backbone.up", "backbone.down", "backbone.square", "head")
    kinds = {name: type(model.get_submodule(name)).__name__ for name in names}
    assert kinds == {"backbone.up": "TransposedLinear", "backbone.down": narrow, "backbone.square": narrow,
                     "head": "PackedLinear"}  # fmt: skip
    assert weight_count(model) == before
    with torch.inference_mode():
        got = model.backbone["square"](model.backbone["up"](x).relu()[:, :8])
    torch.testing.assert_close(got, expected.detach(), rtol=1e-5, atol=1e-6)


def test_pack_linears_swaps_every_float32_linear_and_leaves_the_rest():
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 3), nn.ReLU()), nn.Linear(3, 2).double())
    before = sum(p.numel() for p in model.parameters())
    assert pack_linears(model) == 2
    assert weight_count(model) == before
    assert [type(m).__name__ for m in model.modules()].count("PackedLinear") == 2
    assert isinstance(model[2], nn.Linear)  # float64 stays as it is


def test_pack_linears_lets_each_dense_weight_go_before_packing_the_next(monkeypatch):
    """Holding the layers to the end held every dense weight beside its packed copy (1.87x on the 3.2 B pi0)."""
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])
    refs = [weakref.ref(layer.weight) for layer in model]
    alive: list[int] = []
    original = PackedLinear.__init__

    def counting(self, linear):
        gc.collect()
        alive.append(sum(r() is not None for r in refs))
        original(self, linear)

    monkeypatch.setattr(PackedLinear, "__init__", counting)
    assert pack_linears(model) == 4
    assert alive == [4, 3, 2, 1]


def test_a_lerobot_pi0_packed_gives_lerobots_actions_and_the_dense_ones():
    import json

    from safetensors.numpy import load_file

    manifest = json.loads((REFERENCE / "manifest.json").read_text())
    case = manifest["fixtures"]["pi0_3cam"]["cases"]["all_cameras"]
    data = load_file(REFERENCE / case["file"])
    images = {
        k.removeprefix("observation/observation.images."): v
        for k, v in data.items()
        if k.startswith("observation/observation.images.")
    }
    obs = {"images": images, "state": data["observation/observation.state"], "prompt": case["prompt"]}
    packed = omni_ros.policy.load(REFERENCE / "pi0_3cam", cpu_linear="packed")
    dense = omni_ros.policy.load(REFERENCE / "pi0_3cam")
    assert packed.runner.packed_linears > 20 and dense.runner.packed_linears == 0
    out = packed.infer(obs, noise=data["noise"][0])["actions"]
    np.testing.assert_allclose(out, data["actions"][0], rtol=0, atol=1e-4)
    np.testing.assert_allclose(out, dense.infer(obs, noise=data["noise"][0])["actions"], rtol=0, atol=1e-5)


def test_guided_rtc_runs_on_packed_linears_as_on_dense_ones():
    rng = np.random.default_rng(0)
    pols = [omni_ros.policy.load(REFERENCE / "smolvla_3cam", num_steps=3, cpu_linear=m) for m in ("packed", "dense")]
    images = {c: rng.integers(0, 256, (40, 48, 3), dtype=np.uint8) for c in pols[0].spec.camera_names}
    obs = {"images": images, "state": rng.normal(size=pols[0].spec.state_dim), "prompt": "pick up the cube"}
    plain = pols[1].infer(obs)["actions"]
    request = RtcRequest(plain[:8] + 0.5, inference_delay=3)
    guided = [p.infer(obs, rtc=request)["actions"] for p in pols]
    np.testing.assert_allclose(guided[0], guided[1], rtol=0, atol=1e-4)
    assert not np.allclose(guided[1], plain, atol=1e-3)  # the guidance did act


def test_the_config_chooses_packed_by_default_and_checks_the_value():
    assert PolicyConfig().cpu_linear == "packed"
    assert load_policy(PolicyConfig(preset="tiny")).runner.packed_linears > 0
    assert load_policy(PolicyConfig(preset="tiny", cpu_linear="dense")).runner.packed_linears == 0
    with pytest.raises(ConfigError, match="cpu_linear"):
        from_dict(PolicyConfig, {"cpu_linear": "fast"})


def test_mapped_pages_are_released_only_for_tensors_viewing_a_weights_file(tmp_path):
    from safetensors.torch import save_file

    weight = torch.arange(64 * 1024, dtype=torch.float32).reshape(256, 256)
    save_file({"w": weight, "b": torch.ones(3)}, tmp_path / "model.safetensors")
    file = SafetensorsFile(tmp_path / "model.safetensors")
    view = file.view("w")
    assert release_mapped_pages(view)
    # The pages come back from the file on the next read: nothing but resident memory changed.
    torch.testing.assert_close(view, weight, rtol=0, atol=0)
    assert not release_mapped_pages(weight.clone())
