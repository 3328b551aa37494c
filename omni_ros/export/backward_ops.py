"""A traced backward's ops rewritten into forms ExecuTorch's XNNPACK backend delegates (the guided RTC step).

`make_fx` records autograd's backward as core ATen ops, several of which XNNPACK's partitioner does not take:
`sum` over the last dim (the gradient of a broadcast, as a LayerNorm's statistics have), `expand` (the gradient of
a mean), `slice_scatter` into zeros (the gradient of a slice), `pow(x, 3)` (rsqrt's gradient), the `.Scalar`
overloads of mul and div, and no-op `alias` nodes. Each stays on ExecuTorch's portable kernels and cuts the graph
around it into another delegate call: the full-size X-VLA's int8 guided step lowered to 252 XNNPACK subgraphs with
808 portable ops between them, and its ten steps took 3.5x the plain ones. Each rewrite computes the same value
with ops XNNPACK takes (a sum as the 4-D mean XNNPACK delegates, times the count: an ulp or so of rounding apart).
Float32 nodes only: integer index arithmetic (positions, masks) stays as it is.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import fx

aten = torch.ops.aten
Rewrite = Callable[[fx.GraphModule, fx.Node, tuple[int, ...]], "fx.Node | None"]


def _shape(node: Any) -> tuple[int, ...] | None:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _float32(node: fx.Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.dtype == torch.float32


def _call(graph: fx.GraphModule, target: Any, *args: Any, like: fx.Node, shape: tuple[int, ...] | None = None):
    """A new node before `like` (the one being replaced) with its value's metadata, reshaped to `shape`."""
    with graph.graph.inserting_before(like):
        new = graph.graph.call_function(target, args)
    value = like.meta["val"]
    new.meta["val"] = value if shape is None else value.new_empty(shape)
    return new


def _alias(graph: fx.GraphModule, node: fx.Node, out: tuple[int, ...]) -> fx.Node | None:
    return node.args[0]  # type: ignore[return-value]


def _expand(graph: fx.GraphModule, node: fx.Node, out: tuple[int, ...]) -> fx.Node | None:
    """A no-op expand dropped; a broadcast as a product with ones over the broadcast dims (XNNPACK's binary ops
    broadcast both operands, and the constant is one row of the result, not all of it)."""
    x, shape = node.args[0], _shape(node.args[0])
    if shape is None:
        return None
    if shape == out:
        return x  # type: ignore[return-value]
    shape = (1,) * (len(out) - len(shape)) + shape
    ones = [n if s == 1 else 1 for s, n in zip(shape, out, strict=True)]
    name = "ones_" + "x".join(map(str, ones))
    if not hasattr(graph, name):
        graph.register_buffer(name, torch.ones(ones))
    with graph.graph.inserting_before(node):
        constant = graph.graph.get_attr(name)
    return _call(graph, aten.mul.Tensor, x, constant, like=node)


def _scalar_overload(tensor_op: Any) -> Rewrite:
    def rewrite(graph: fx.GraphModule, node: fx.Node, out: tuple[int, ...]) -> fx.Node | None:
        # (a float scalar: an integer one becomes a constant tensor converted outside XNNPACK's graph)
        return _call(graph, tensor_op, node.args[0], float(node.args[1]), like=node)  # type: ignore[arg-type]

    return rewrite


def _pow(graph: fx.GraphModule, node: fx.Node, out: tuple[int, ...]) -> fx.Node | None:
    x, exponent = node.args
    if exponent not in (2, 3):
        return None
    square = _call(graph, aten.mul.Tensor, x, x, like=node)
    return square if exponent == 2 else _call(graph, aten.mul.Tensor, square, x, like=node)


def _slice_scatter(graph: fx.GraphModule, node: fx.Node, out: tuple[int, ...]) -> fx.Node | None:
    """Zeros with `src` written at [start, end) of `dim` is `src` padded with zeros before and after."""
    base = node.args[0]
    zeros = (
        isinstance(base, fx.Node)
        and base.target == aten.full.default
        and base.args[1] == 0
        and base.kwargs.get("dtype") in (None, torch.float32)
    )
    defaults: tuple[Any, ...] = (0, None, None, 1)  # dim, start, end, step
    src, dim, start, end, step = list(node.args[1:]) + list(defaults[len(node.args) - 2 :])
    if not zeros or step != 1:
        return None
    dim = cast(int, dim) % len(out)
    start, end, _ = slice(start, end).indices(out[dim])
    pad = [0, 0] * (len(out) - 1 - dim) + [start, out[dim] - end]
    return _call(graph, aten.constant_pad_nd.default, src, pad, 0.0, like=node)


def _sum(graph: fx.GraphModule, node: fx.Node, out: tuple[int, ...]) -> fx.Node | None:
    """A sum over the last dim (keepdim) as the 4-D mean XNNPACK delegates, times the count."""
    x, dims, keepdim = (*node.args, False)[:3]
    shape = _shape(x)
    if shape is None or len(shape) < 2 or not keepdim or node.kwargs or not isinstance(dims, list | tuple):
        return None
    if list(dims) not in ([-1], [len(shape) - 1]):
        return None
    rows, width = math.prod(shape[:-1]), shape[-1]
    four = _call(graph, aten.view.default, x, [rows, 1, width, 1], like=node, shape=(rows, 1, width, 1))
    mean = _call(graph, aten.mean.dim, four, [2, 3], True, like=node, shape=(rows, 1, 1, 1))
    back = _call(graph, aten.view.default, mean, [*shape[:-1], 1], like=node)
    return _call(graph, aten.mul.Tensor, back, float(width), like=node)


REWRITES: dict[Any, Rewrite] = {
    aten.alias.default: _alias,
    aten.expand.default: _expand,
    aten.mul.Scalar: _scalar_overload(aten.mul.Tensor),
    aten.div.Scalar: _scalar_overload(aten.div.Tensor),
    aten.pow.Tensor_Scalar: _pow,
    aten.slice_scatter.default: _slice_scatter,
    aten.sum.dim_IntList: _sum,
}


def make_backward_delegable(graph: fx.GraphModule) -> Counter[str]:
    """Rewrite `graph` (a make_fx trace) in place (module docstring); returns how many nodes of each op."""
    done: Counter[str] = Counter()
    for node in list(graph.graph.nodes):
        rewrite = REWRITES.get(node.target) if node.op == "call_function" else None
        out = _shape(node)
        if rewrite is None or out is None or not _float32(node):
            continue
        replacement = rewrite(graph, node, out)
        if replacement is not None:
            node.replace_all_uses_with(replacement)
            graph.graph.erase_node(node)
            done[str(getattr(node.target, "__name__", node.target))] += 1
    graph.graph.eliminate_dead_code()
    graph.delete_all_unused_submodules()
    graph.recompile()
    return done
