"""`ModelInputs`: the one struct a model of any family takes, whatever the backend runs it.

A family's processor builds it from validated observations (tiles, prompt
tokens, normalized state); the torch, ExecuTorch and ONNX runners and the
training step all consume it, so no stage signature repeats five loose tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass(frozen=True)
class ModelInputs:
    images: torch.Tensor  # (B, C, 3, S, S) float in [-1, 1]; masked cameras hold the family's blank image
    image_masks: torch.Tensor  # (B, C) bool: which camera slots hold a real image
    tokens: torch.Tensor  # (B, T) int64 prompt token ids, padded
    token_mask: torch.Tensor  # (B, T) bool: which tokens are real
    state: torch.Tensor  # (B, Ds) float, normalized (and padded where the family pads)

    @property
    def batch_size(self) -> int:
        return int(self.state.shape[0])

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> ModelInputs:
        """On `device`, with the float tensors (images, state) in `dtype` if given; ids and masks keep theirs."""
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            floating = value.is_floating_point() and dtype is not None
            moved[f.name] = value.to(device, dtype) if floating else value.to(device)
        return ModelInputs(**moved)

    def select(self, index: int) -> ModelInputs:
        """Batch item `index` alone, as a batch of one."""
        return ModelInputs(**{f.name: getattr(self, f.name)[index : index + 1] for f in fields(self)})

    def as_tuple(self) -> tuple[torch.Tensor, ...]:
        """(images, image_masks, tokens, token_mask, state): the order of the exported `sample` signature."""
        return tuple(getattr(self, f.name) for f in fields(self))
