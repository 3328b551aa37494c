"""The export-friendly forms of the model compute what the eager forms compute (no ExecuTorch needed)."""

from __future__ import annotations

import copy

import pytest
import torch

from omni_ros.export.forms import use_export_forms, uses_export_forms
from omni_ros.policy.families import method_module, signatures
from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.layers import additive_mask, attention
from omni_ros.policy.methods import example_inputs
from omni_ros.policy.pi0.configuration import TransformerConfig
from omni_ros.policy.pi0.modeling import Pi0Model
from omni_ros.policy.pi0.presets import preset
from omni_ros.policy.pi0.stages import METHODS, prefix_mask_of

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _pair(cfg):
    torch.manual_seed(0)
    eager = Pi0Model(cfg).eval()
    # Non-zero norm weights and biases, so the norms' affine parts are exercised too.
    with torch.no_grad():
        for name, p in eager.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.1)
    return eager, use_export_forms(copy.deepcopy(eager))


def _outputs(module, inputs):
    with torch.no_grad():
        out = module(*inputs)
    return out if isinstance(out, tuple) else (out,)


GQA = preset(
    "tiny",
    backbone=TransformerConfig(width=32, depth=2, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64),
    expert=TransformerConfig(width=16, depth=2, num_heads=2, num_kv_heads=2, head_dim=8, mlp_dim=32),
)


@pytest.mark.parametrize("cfg", [preset("tiny"), preset("demo"), GQA], ids=["tiny", "demo", "gqa"])
def test_export_forms_match_eager_per_method(cfg):
    eager, exported = _pair(cfg)
    assert not uses_export_forms(eager) and uses_export_forms(exported)
    sigs = signatures(cfg)
    for method in METHODS:
        inputs = example_inputs(sigs[method], cfg, seed=3)
        a, b = _outputs(method_module(eager, method), inputs), _outputs(method_module(exported, method), inputs)
        assert len(a) == len(b) == len(sigs[method].outputs)
        for x, y, spec in zip(a, b, sigs[method].outputs, strict=True):
            assert tuple(x.shape) == spec.shape
            torch.testing.assert_close(y, x, rtol=0, atol=2e-5, msg=f"{method}/{spec.name}")


def test_switch_goes_both_ways_and_is_per_instance():
    eager, exported = _pair(preset("tiny"))
    use_export_forms(exported, enabled=False)
    assert not uses_export_forms(exported)
    use_export_forms(exported)
    assert uses_export_forms(exported) and not uses_export_forms(eager)


def test_bmm_attention_matches_sdpa_with_grouped_heads_and_padding():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 5, 8, generator=gen)  # 6 query heads over 2 KV heads
    k, v = torch.randn(2, 2, 7, 8, generator=gen), torch.randn(2, 2, 7, 8, generator=gen)
    mask = torch.rand(2, 1, 5, 7, generator=gen) > 0.4
    mask[..., 0] = True  # every query sees at least one key
    expected = attention(q, k, v, mask)
    torch.testing.assert_close(attention(q, k, v, additive_mask(mask, q.dtype), True), expected, rtol=0, atol=1e-6)


def test_prefix_mask_helper_matches_embed_prefix():
    cfg = preset("tiny")
    model = Pi0Model(cfg).eval()
    inputs = example_inputs(signatures(cfg)["sample"], cfg)
    _, image_masks, _, token_mask = inputs[:4]
    image_masks[0, 1] = False
    _, expected = model.embed_prefix(ModelInputs(*inputs[:5]))
    assert torch.equal(prefix_mask_of(image_masks, token_mask, cfg.vision.num_tokens), expected)


def test_signatures_are_static_and_consistent():
    cfg = preset("demo")
    sigs = signatures(cfg)
    assert set(sigs) == set(METHODS)
    kv = sigs["prefill"].outputs
    assert len(kv) == 2 * cfg.backbone.depth
    assert sigs["denoise_step"].inputs[4:] == kv  # the cache goes straight from prefill into every step
    assert sigs["encode_images"].outputs[0] == sigs["prefill"].inputs[0]
    assert sigs["denoise_step"].inputs[0].shape == (1, cfg.prefix_len)
    assert all(d > 0 for m in sigs.values() for s in (*m.inputs, *m.outputs) for d in s.shape)


def test_long_prefix_passes_the_edge_dialect_checks():
    """More than 255 prefix tokens (small/pi0 have hundreds): index tensors must keep dtypes ExecuTorch accepts."""
    from executorch.exir import to_edge

    cfg = preset("tiny", camera_names=["base", "wrist", "left"])
    cfg.vision.image_size, cfg.vision.patch_size = 40, 4  # 100 tokens per camera -> 316-token prefix
    assert cfg.prefix_len > 255
    model = use_export_forms(Pi0Model(cfg).eval())
    sigs = signatures(cfg)
    for method in ("prefill", "denoise_step"):
        program = torch.export.export(method_module(model, method), example_inputs(sigs[method], cfg))
        to_edge({method: program})  # raises SpecViolationError on e.g. a uint16 arange
