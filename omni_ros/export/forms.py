"""The switch between the eager model and its export-friendly form.

Some modules of the policy (`export_form` class attribute) have a second,
numerically equivalent forward written with operators ExecuTorch's XNNPACK
backend delegates. Eager PyTorch is faster on the standard form, so the
switch is explicit and per model instance: export code turns it on for the
copy it exports.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

from torch import nn

ModelT = TypeVar("ModelT", bound=nn.Module)


def use_export_forms(model: ModelT, enabled: bool = True) -> ModelT:
    """Switch every module of `model` that has an export form to it (or back); returns `model`."""
    for module in model.modules():
        if hasattr(type(module), "export_form"):
            cast(Any, module).export_form = enabled  # a plain attribute, not a Tensor | Module
    return model


def uses_export_forms(model: nn.Module) -> bool:
    """True if any switchable module of `model` is in its export form."""
    return any(getattr(m, "export_form", False) for m in model.modules() if hasattr(type(m), "export_form"))
