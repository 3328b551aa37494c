"""Swapping a built model's linear layers in place: the one mechanism of `cpu_linear: packed` and of every
`policy.precision` kernel (omni_ros/policy/cpu_linear.py, omni_ros/policy/precision/)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def float_cpu_linear(m: nn.Module) -> bool:
    return type(m) is nn.Linear and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"


def swap_linears(
    model: nn.Module, make: Callable[[str, nn.Linear], nn.Module], keep: Callable[[str], bool] | None = None
) -> int:
    """Replace every float32 CPU `nn.Linear` of `model` by `make(name, linear)`, in place; returns how many.
    Linears whose name `keep` accepts stay as they are.

    One layer at a time, each dense weight let go before the next is made: holding them all to the end would
    hold every dense weight beside its replacement (measured on the 3.2 B pi0: 1.87x the model).
    """
    from omni_ros.heap import return_freed_memory
    from omni_ros.policy.layouts.weights import release_mapped_pages

    names = [name for name, m in model.named_modules() if float_cpu_linear(m) and not (keep and keep(name))]
    for name in names:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        linear = getattr(parent, leaf)
        dense = linear.weight.detach()
        setattr(parent, leaf, make(name, linear))
        release_mapped_pages(dense)
        del dense, linear
    return_freed_memory()
    return len(names)


def set_kernel(model: nn.Module, attribute: str, kernel: Callable[..., torch.Tensor]) -> int:
    """Set `kernel` as `attribute` on every module of `model` whose class declares that kernel slot (the
    `attention_kernel` / `mlp_kernel` a family's modules hold, defaults in omni_ros/policy/layers.py); returns
    how many. An instance attribute, so it is not bound as a method and the class default stays for other models."""
    count = 0
    for module in model.modules():
        if hasattr(type(module), attribute):
            setattr(module, attribute, kernel)
            count += 1
    return count
