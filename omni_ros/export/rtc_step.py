"""The guided real-time-chunking step as a `.pte` method: the vector-Jacobian product, traced ahead of time.

    guided_step(prefix_mask, state, x_t, t, target, weights, weight, k_0, v_0, ...) -> guided velocity
        = u - weight * [(target - x0) * weights]^T dx0/dx_t,  u = denoise_step(...),  x0 = x_t - t u

`torch.export` cannot take `torch.autograd.grad` or `torch.func.vjp` inside a forward (verified with torch
2.13: "Cannot access data pointer of Tensor that doesn't have storage" / a fake tensor among the constants).
`make_fx` can: it runs autograd while tracing and records forward and backward as plain ATen ops, decomposed
to the core opset (so `silu_backward`, `_softmax_backward_data`, `gelu_backward` become ops every ExecuTorch
backend knows). That graph is then an ordinary module to export. Shapes are the method signature's.
"""

from __future__ import annotations

import torch
from torch import nn

from omni_ros.policy.methods import GUIDED_STEP, MethodSignature, TensorSpec
from omni_ros.policy.pi0.modeling import Pi0Model
from omni_ros.policy.pi0.stages import pi0_method_module

NAME = GUIDED_STEP


def guided_signature(denoise: MethodSignature, horizon: int) -> MethodSignature:
    """denoise_step's inputs plus target (like x_t), weights (H,) and weight (B,), before the KV cache."""
    prefix_mask, state, x_t, t, *kv = denoise.inputs
    extra = (
        TensorSpec("target", x_t.shape, "float32"),
        TensorSpec("weights", (horizon,), "float32"),
        TensorSpec("weight", (x_t.shape[0],), "float32"),
    )
    return MethodSignature(NAME, (prefix_mask, state, x_t, t, *extra, *kv), denoise.outputs)


def _guided(step: nn.Module):
    def guided(prefix_mask, state, x_t, t, target, weights, weight, *kv):
        with torch.enable_grad():
            x = x_t.detach().requires_grad_(True)
            u = step(prefix_mask, state, x, t, *kv)
            x0 = x - t.reshape(t.shape[0], -1, 1) * u  # t (B,) or per token (B, H)
            (g,) = torch.autograd.grad(x0, x, (target - x0) * weights.reshape(1, -1, 1))
        return u.detach() - weight.reshape(-1, 1, 1) * g

    return guided


class GuidedStep(nn.Module):
    """The traced guided step of `model` (its weights are constants of the graph, as in every method)."""

    def __init__(self, model: Pi0Model, example: tuple[torch.Tensor, ...]) -> None:
        super().__init__()
        from torch._decomp import core_aten_decompositions
        from torch.fx.experimental.proxy_tensor import make_fx

        step = pi0_method_module(model, "denoise_step")
        frozen = [p.requires_grad for p in model.parameters()]
        for p in model.parameters():  # only the VJP with respect to x_t is wanted, not weight gradients
            p.requires_grad_(False)
        try:  # (a submodule named `graph` would clash with the exported GraphModule's own attribute)
            # torch's stub types the table as a Mapping of OpOverloads; core_aten_decompositions returns its
            # CustomDecompTable, which is that Mapping at run time.
            table = core_aten_decompositions()
            self.traced = make_fx(_guided(step), decomposition_table=table)(*example)  # type: ignore[arg-type]
        finally:
            for p, flag in zip(model.parameters(), frozen, strict=True):
                p.requires_grad_(flag)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.traced(*inputs)
