"""`ModelInputs`: the one struct a model of any family takes, whatever the backend runs it.

A family's processor builds it from validated observations (tiles, prompt
tokens, normalized state); the torch, ExecuTorch and ONNX runners and the
training step all consume it, so no stage signature repeats five loose tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
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
        return type(self)(**moved)

    def select(self, index: int) -> ModelInputs:
        """Batch item `index` alone, as a batch of one."""
        return type(self)(**{f.name: getattr(self, f.name)[index : index + 1] for f in fields(self)})

    def padded_prompt(self, length: int) -> ModelInputs:
        """The prompt right-padded with masked tokens to `length` (a longer prompt stays as it is): the shape a
        static program or a compiled graph was built for. Masked tokens change no output (every attention skips
        them, the positions count only real tokens), only the work."""
        extra = length - int(self.tokens.shape[1])
        if extra <= 0:
            return self
        return replace(
            self,
            tokens=torch.nn.functional.pad(self.tokens, (0, extra)),
            token_mask=torch.nn.functional.pad(self.token_mask, (0, extra), value=False),
        )

    def as_tuple(self) -> tuple[torch.Tensor, ...]:
        """(images, image_masks, tokens, token_mask, state): the order of the exported `sample` signature."""
        return tuple(getattr(self, f.name) for f in fields(self))


def stack_inputs(
    images: Sequence[torch.Tensor],
    image_masks: Sequence[Sequence[bool]],
    tokens: Sequence[np.ndarray],
    token_masks: Sequence[np.ndarray],
    states: Sequence[np.ndarray],
    device: torch.device | str,
    dtype: torch.dtype,
) -> ModelInputs:
    """A batch from one entry per observation (tiles, camera masks, padded token ids and masks, normalized state),
    as a family's processor collects them: floats in `dtype`, everything on `device`."""
    return ModelInputs(
        images=torch.stack(list(images)).to(device, dtype),
        image_masks=torch.tensor(image_masks, dtype=torch.bool, device=device),
        tokens=torch.from_numpy(np.stack(tokens)).to(device),
        token_mask=torch.from_numpy(np.stack(token_masks)).to(device),
        state=torch.from_numpy(np.stack(states).astype(np.float32)).to(device, dtype),
    )
