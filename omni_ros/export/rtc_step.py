"""The guided real-time-chunking step as a `.pte` method: the vector-Jacobian product, traced ahead of time.

    guided_step(<denoise_step's inputs up to t>, target, weights, weight, <its KV cache>) -> guided velocity
        = u - weight * [(target - x0) * weights]^T dx0/dx_t,  u = denoise_step(...),  x0 = x_t - t u

(pi0: prefix_mask, state, x_t, t, target, ...; SmolVLA: prefix_mask, x_t, t, target, ...)

A family whose denoise_step predicts the clean action (X-VLA, `StagePlan.guidance == "clean"`) gets that form:

    guided_step(<denoise_step's inputs up to t>, target, target_high, weights, scale) -> guided clean estimate
        = x0 + scale * [(Y - x0) * weights]^T dx0/dx_t,  x0 = denoise_step(...),  Y = clamp(x0, target, target_high)

`torch.export` cannot take `torch.autograd.grad` or `torch.func.vjp` inside a forward (verified with torch
2.13: "Cannot access data pointer of Tensor that doesn't have storage" / a fake tensor among the constants).
`make_fx` can: it runs autograd while tracing and records forward and backward as plain ATen ops, decomposed
to the core opset (so `silu_backward`, `_softmax_backward_data`, `gelu_backward` become ops every ExecuTorch
backend knows). That graph is then an ordinary module to export. Shapes are the method signature's. Autograd's
glue in it (sums over a row, broadcasts, slice gradients) is first rewritten into ops XNNPACK takes
(`backward_ops.make_backward_delegable`): as traced it cut the step into dozens of XNNPACK calls.

An int8 program's step (`quantize`): traced through torchao's quantized weights, make_fx decomposes their
quantization into elementwise ops around float32 matrix products (a fake-quantized graph XNNPACK cannot run as
int8). So the step is traced in float32, and every product with a constant weight, forward (x @ W^T) and
backward (g @ W), becomes an `nn.Linear` of the graph again (`constant_products_to_linears`), quantized with the
recipe of the other methods: the forward's linears are the very int8 layers of `denoise_step`, the backward's
hold W^T quantized per its own rows (the straight-through gradient of the int8 forward, in int8). On the tiny
preset all 37 products (forward and backward) lowered to XNNPACK's int8 kernels. A float32 step gets the same
linears (unquantized): traced as `mm(x, permute(W))`, X-VLA's 17 products stayed on ExecuTorch's portable kernels,
as linears XNNPACK runs them (the same numbers: its guided chunks 3e-7 from eager either way).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import fx, nn

from omni_ros.export.backward_ops import make_backward_delegable
from omni_ros.policy.methods import GUIDED_STEP, MethodSignature, StagePlan, TensorSpec
from omni_ros.policy.rtc import autograd_guided_clean, autograd_guided_step

NAME = GUIDED_STEP
aten = torch.ops.aten


# The guided step of each `StagePlan.guidance` form: the torch runner's autograd step it traces, and the inputs it
# takes between denoise_step's t and the KV cache (`like`: "x_t" a chunk's shape, "horizon" (H,), "batch" (B,)).
FORMS: dict[
    str, tuple[Callable[[Callable[..., torch.Tensor]], Callable[..., torch.Tensor]], tuple[tuple[str, str], ...]]
] = {
    "velocity": (autograd_guided_step, (("target", "x_t"), ("weights", "horizon"), ("weight", "batch"))),
    "clean": (
        autograd_guided_clean,
        (("target", "x_t"), ("target_high", "x_t"), ("weights", "horizon"), ("scale", "batch")),
    ),
}


def guided_signature(denoise: MethodSignature, horizon: int, form: str = "velocity") -> MethodSignature:
    """denoise_step's inputs with the form's guidance inputs after t, before the KV cache (`FORMS`)."""
    names = [spec.name for spec in denoise.inputs]
    x_t, at = denoise.inputs[names.index("x_t")], names.index("t") + 1
    shapes = {"x_t": x_t.shape, "horizon": (horizon,), "batch": (x_t.shape[0],)}
    extra = tuple(TensorSpec(name, shapes[like], "float32") for name, like in FORMS[form][1])
    return MethodSignature(NAME, (*denoise.inputs[:at], *extra, *denoise.inputs[at:]), denoise.outputs)


def _guided(step: nn.Module, x_at: int, form: str = "velocity"):
    """The guided step over `step` (denoise_step), whose x_t is input `x_at` and t the next one: the torch
    runner's own autograd step of the form (`FORMS`: `rtc.autograd_guided_step`, `rtc.autograd_guided_clean`),
    traced."""
    make, guidance = FORMS[form]
    own = 2 + len(guidance)  # x_t, t and the guidance inputs

    def guided(*inputs: torch.Tensor) -> torch.Tensor:
        before, mine, kv = inputs[:x_at], inputs[x_at : x_at + own], inputs[x_at + own :]

        def run(x: torch.Tensor, t_: torch.Tensor) -> torch.Tensor:
            return step(*before, x, t_, *kv)

        return make(run)(*mine)

    return guided


def _constant(graph: fx.GraphModule, node: fx.Node) -> torch.Tensor | None:
    """The tensor `node` computes from one graph constant through transposes only (None: anything else)."""
    transposes = []
    while node.op == "call_function" and node.target in (aten.permute.default, aten.t.default):
        transposes.append(node)
        node = node.args[0]  # type: ignore[assignment]
    if node.op != "get_attr":
        return None
    value = getattr(graph, str(node.target))
    for op in reversed(transposes):
        value = value.permute(*op.args[1]) if op.target == aten.permute.default else value.t()  # type: ignore[misc]
    return value


def constant_products_to_linears(graph: fx.GraphModule) -> int:
    """Turn every `mm(a, C)` / `addmm(b, a, C)` whose C (and b) are graph constants into an `nn.Linear`
    submodule called on `a` (weight C^T), in place; returns how many. The numbers are unchanged."""
    count = 0
    for node in list(graph.graph.nodes):
        if node.op != "call_function" or node.kwargs:
            continue
        if node.target == aten.mm.default:
            (a, b), bias = node.args, None
        elif node.target == aten.addmm.default and len(node.args) == 3:
            bias_node, a, b = node.args
            bias = _constant(graph, bias_node) if isinstance(bias_node, fx.Node) else None
            if bias is None or bias.dim() != 1:
                continue
        else:
            continue
        weight = _constant(graph, b) if isinstance(b, fx.Node) else None
        if weight is None or weight.dim() != 2:
            continue
        linear = nn.Linear(weight.shape[0], weight.shape[1], bias=bias is not None)
        with torch.no_grad():
            linear.weight.copy_(weight.t())
            if bias is not None:
                linear.bias.copy_(bias)
        name = f"product_{count}"
        graph.add_module(name, linear)
        with graph.graph.inserting_before(node):
            node.replace_all_uses_with(graph.graph.call_module(name, (a,)))
        graph.graph.erase_node(node)
        count += 1
    graph.graph.eliminate_dead_code()
    graph.delete_all_unused_submodules()
    graph.recompile()
    return count


class GuidedStep(nn.Module):
    """The traced guided step of `model` (its weights are constants of the graph, as in every method); with
    `quantize`, its products with weights are linears quantized with that recipe (module docstring)."""

    def __init__(
        self, model: nn.Module, plan: StagePlan, example: tuple[torch.Tensor, ...], quantize: str = "none"
    ) -> None:
        super().__init__()
        from torch._decomp import core_aten_decompositions
        from torch.fx.experimental.proxy_tensor import make_fx

        from omni_ros.policy.quantize import quantize_model

        step = plan.module(model, "denoise_step", None)
        names = [spec.name for spec in plan.signatures(model.cfg)["denoise_step"].inputs]
        frozen = [p.requires_grad for p in model.parameters()]
        for p in model.parameters():  # only the VJP with respect to x_t is wanted, not weight gradients
            p.requires_grad_(False)
        try:  # (a submodule named `graph` would clash with the exported GraphModule's own attribute)
            # torch's stub types the table as a Mapping of OpOverloads; core_aten_decompositions returns its
            # CustomDecompTable, which is that Mapping at run time.
            table = core_aten_decompositions()
            guided = _guided(step, names.index("x_t"), plan.guidance)
            self.traced = make_fx(guided, decomposition_table=table)(*example)  # type: ignore[arg-type]
        finally:
            for p, flag in zip(model.parameters(), frozen, strict=True):
                p.requires_grad_(flag)
        make_backward_delegable(self.traced)
        # Products with weights as linears in float32 too (module docstring: XNNPACK runs them then).
        self.products = constant_products_to_linears(self.traced)
        if quantize != "none":
            quantize_model(self.traced, quantize)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.traced(*inputs)
