"""A whole MLP as one XNNPACK method: the kernel the int8 precision swaps into every module with an MLP where
XNNPACK runs its GEMMs (omni_ros/policy/precision/xnnpack_linears.py builds the methods).

With a method per linear an MLP's widest activation crosses into torch and back: the first product's rows come
out of XNNPACK (and, where an input has more rows than a method takes, are concatenated), the activation runs as
torch's elementwise ops, the down projection quantizes the result again. In one method the hidden activation
stays inside XNNPACK (its own activation kernels, its threadpool), only the block's narrow output crosses, and
there is one lowering instead of two or three. A SigLIP block's MLP over two 512 px cameras (2048 x 768 ->
3072 -> 768, two threads, AMD EPYC with AVX-512 VNNI) ran 33 ms against 47 ms as two methods with torch's GELU
between them (scratch A/B, same weights, the same numbers to 1e-7; docs/precision.md). The numbers are the
per-linear path's: weights per output channel, activations (the hidden one included) quantized per token.

Modules with an MLP declare which linears it is made of (`mlp_linears`: first, up or None, down) next to their
`mlp_kernel`; the kernel finds its method on the first linear (`xnnpack_mlp`). Under autograd (guided RTC), for
a few rows (a decode step: the int8 linears' matrix-vector path) and where no method was built, the eager MLP
runs on the int8 linears themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from omni_ros.policy.layers import gelu, mlp
from omni_ros.policy.precision.int8_linear import VECTOR_ROWS


@dataclass(frozen=True)
class MlpSpec:
    """One module's MLP: the full names of its linears and its activation (layers.ACTIVATIONS)."""

    owner: str
    first: str
    up: str | None
    down: str
    activation: str

    @property
    def linears(self) -> tuple[str, ...]:
        return tuple(n for n in (self.first, self.up, self.down) if n is not None)


def mlp_specs(model: nn.Module, names: set[str]) -> list[MlpSpec]:
    """The MLPs of `model` whose linears are all among `names` (those the int8 precision runs on XNNPACK)."""
    specs = []
    for owner, module in model.named_modules():
        declared = getattr(type(module), "mlp_linears", None)
        if declared is None or not hasattr(type(module), "mlp_kernel"):
            continue
        first, up, down = (None if n is None else f"{owner}.{n}" if owner else n for n in declared)
        assert first is not None and down is not None, f"{type(module).__name__}.mlp_linears names no first/down"
        spec = MlpSpec(owner, first, up, down, str(module.activation))
        if all(n in names for n in spec.linears):
            specs.append(spec)
    return specs


class FloatMlp(nn.Module):
    """The MLP a method computes, from float copies of its linears, in ops XNNPACK delegates: the gate and up
    projections stacked into one product (one GEMM, one quantization of the input), the activation written
    out (XNNPACK computes exact GELU where asked for tanh: layers.gelu's export form)."""

    def __init__(self, first: nn.Linear, up: nn.Linear | None, down: nn.Linear, activation: str) -> None:
        super().__init__()
        from omni_ros.policy.precision.xnnpack_linears import stacked

        self.hidden, self.activation = first.out_features, activation
        self.first = stacked([first] if up is None else [first, up])
        self.down = down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        gated = h.shape[-1] > self.hidden
        a = h[:, : self.hidden] if gated else h
        if self.activation == "silu":
            a = a * torch.sigmoid(a)
        else:
            a = gelu(a, "tanh" if self.activation == "gelu_tanh" else "none", export_form=True)
        return self.down(a * h[:, self.hidden :] if gated else a)


def float_mlp(spec: MlpSpec, linears: dict[str, nn.Linear]) -> FloatMlp:
    up = linears[spec.up] if spec.up is not None else None
    return FloatMlp(linears[spec.first], up, linears[spec.down], spec.activation)


def xnnpack_mlp(
    first: nn.Module, up: nn.Module | None, down: nn.Module, activation: str, x: torch.Tensor
) -> torch.Tensor:
    """`layers.mlp` as the MLP's XNNPACK method where it has one (see the module docstring for when not)."""
    method: Any = getattr(first, "xnnpack_mlp", None)
    if method is None or (torch.is_grad_enabled() and x.requires_grad) or x.numel() <= VECTOR_ROWS * x.shape[-1]:
        return mlp(first, up, down, activation, x)
    return method(x).reshape(*x.shape[:-1], -1).to(x.dtype)


def use_xnnpack_mlps(model: nn.Module, specs: list[MlpSpec]) -> int:
    """Set the XNNPACK MLP kernel on each spec's module (an instance attribute: the class default stays)."""
    for spec in specs:
        # An instance attribute (as linear_swap.set_kernel sets one): not bound as a method.
        object.__setattr__(model.get_submodule(spec.owner) if spec.owner else model, "mlp_kernel", xnnpack_mlp)
    return len(specs)
