"""The eager attention kernel (`layers.sdpa`): masks that are mostly True run without them, a few query rows per
K/V head are folded into one head's rows, and every case computes what a plain softmax attention computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from omni_ros.policy import layers
from omni_ros.policy.layers import gelu_tanh_inference, sdpa

# float32 attention against a float64 softmax: rounding of a 64-wide dot product and a ~600-key sum.
TOLERANCE = 2e-5


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax attention written out in float64, K/V repeated per query head (head i reads K/V head i // groups)."""
    groups = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(groups, dim=1)
    v64 = v.double().repeat_interleave(groups, dim=1)
    scores = q.double() @ k64.transpose(-1, -2) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v64


def qkv(heads: int, kv_heads: int, rows: int, keys: int, batch: int = 1, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, rows, 64, generator=gen) * 2
    k = torch.randn(batch, kv_heads, keys, 64, generator=gen) * 2
    v = torch.randn(batch, kv_heads, keys, 64, generator=gen)
    return q, k, v


def state_row_mask(rows: int, keys: int, actions: int) -> torch.Tensor:
    """pi0's denoising mask: the first (state) row does not see the action keys, the action rows see all."""
    mask = torch.ones(1, 1, rows, keys, dtype=torch.bool)
    mask[..., 0, keys - actions :] = False
    return mask


def suffix_causal_mask(rows: int, keys: int) -> torch.Tensor:
    """A suffix causal over itself after a prefix it all sees: most rows are masked."""
    prefix = keys - rows
    causal = torch.ones(rows, rows, dtype=torch.bool).tril()
    return torch.cat([torch.ones(rows, prefix, dtype=torch.bool), causal], dim=1)[None, None]


def rows_see_first_keys(rows_n: int, keys: int, rows: list[int], seen: int) -> torch.Tensor:
    """Every row sees every key but `rows`, which see the first `seen` keys only."""
    mask = torch.ones(1, 1, rows_n, keys, dtype=torch.bool)
    mask[..., rows, seen:] = False
    return mask


CASES = {
    "no mask, 8 heads on 1 K/V head, 51 rows": ((8, 1, 51, 573), None),
    "all-True mask, prefix": ((8, 1, 120, 120), torch.ones(1, 1, 120, 120, dtype=torch.bool)),
    "state row, 8 heads on 1": ((8, 1, 51, 573), state_row_mask(51, 573, 50)),
    "state row, 15 heads on 5": ((15, 5, 51, 188), state_row_mask(51, 188, 50)),
    "state row, one head per K/V head": ((4, 4, 51, 200), state_row_mask(51, 200, 50)),
    "causal suffix (mostly masked rows)": ((15, 5, 50, 188), suffix_causal_mask(50, 188)),
    "one row, padded keys": ((8, 1, 1, 300), torch.arange(300)[None, None, None] < 260),
    "two masked rows in the middle": ((8, 2, 40, 90), rows_see_first_keys(40, 90, rows=[3, 7], seen=40)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sdpa_computes_softmax_attention_whatever_the_mask(case: str):
    (heads, kv_heads, rows, keys), mask = CASES[case]
    q, k, v = qkv(heads, kv_heads, rows, keys)
    out = sdpa(q, k, v, mask)
    expected = reference(q, k, v, mask)
    assert out.shape == (1, heads, rows, 64) and out.dtype == torch.float32
    assert ((out.double() - expected).abs().max() / expected.abs().max()).item() < TOLERANCE


def test_per_batch_masks_and_a_mask_broadcast_over_the_rows():
    q, k, v = qkv(8, 1, 51, 120, batch=2)
    mask = state_row_mask(51, 120, 50).repeat(2, 1, 1, 1)
    mask[1, :, 5, :30] = False  # the second batch masks a row the first one does not
    for m in (mask, (torch.arange(120) < 100)[None, None, None].expand(2, 1, 1, 120)):
        out, expected = sdpa(q, k, v, m), reference(q, k, v, m)
        assert ((out.double() - expected).abs().max() / expected.abs().max()).item() < TOLERANCE


def test_a_row_that_attends_to_nothing_comes_out_as_torch_makes_it():
    q, k, v = qkv(8, 1, 51, 120)
    mask = state_row_mask(51, 120, 50)
    mask[..., 0, :] = False
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(sdpa(q, k, v, mask), expected, rtol=0, atol=0, equal_nan=True)


def test_the_kernel_is_not_given_masks_that_are_true_where_it_reads(monkeypatch):
    """An all-True mask is dropped; pi0's state row is its own call on the keys it sees, the rest unmasked."""
    calls: list[tuple[tuple[int, ...], tuple[int, ...], bool]] = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        calls.append((tuple(q.shape), tuple(k.shape), attn_mask is not None))
        return real(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(layers.F, "scaled_dot_product_attention", spy)
    q, k, v = qkv(8, 1, 522, 522)
    sdpa(q, k, v, torch.ones(1, 1, 522, 522, dtype=torch.bool))
    assert calls == [((1, 8, 522, 64), (1, 1, 522, 64), False)]
    calls.clear()
    q, k, v = qkv(8, 1, 51, 573)
    sdpa(q, k, v, state_row_mask(51, 573, 50))
    # The folded form: 8 heads x 1 row, then 8 heads x 50 rows, each as one K/V head's rows.
    assert calls == [((1, 1, 8, 64), (1, 1, 523, 64), False), ((1, 1, 400, 64), (1, 1, 573, 64), False)]
    calls.clear()
    q, k, v = qkv(15, 5, 50, 188)
    sdpa(q, k, v, suffix_causal_mask(50, 188))
    assert calls == [((1, 15, 50, 64), (1, 5, 188, 64), True)]  # mostly masked: one call with the mask


def test_gradients_flow_through_the_split_mask():
    """Guided real-time chunking differentiates through a denoising step's attention."""
    q, k, v = qkv(8, 1, 51, 120)
    mask = state_row_mask(51, 120, 50)
    q.requires_grad_(True)
    (grad,) = torch.autograd.grad(sdpa(q, k, v, mask).square().sum(), q)
    q64 = q.detach().double().requires_grad_(True)
    (expected,) = torch.autograd.grad(reference(q64, k, v, mask).square().sum(), q64)
    assert ((grad.double() - expected).abs().max() / expected.abs().max()).item() < 1e-4


def test_the_four_pass_tanh_gelu_is_torchs_tanh_gelu():
    x = torch.linspace(-10, 10, 20001)
    expected = F.gelu(x.double(), approximate="tanh")
    with torch.inference_mode():
        out = gelu_tanh_inference(x)
    assert (out.double() - expected).abs().max().item() < 2e-6
