"""The reference tools' image path, shared by the families that reproduce it: each camera a float tile in [-1, 1].

LeRobot and openpi resize the float image (not a uint8 tile) and mark a declared camera the observation lacks
with an image of -1 (its mask off), so a processor that matches them stacks its cameras through here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from omni_ros.observation import Observation

# (3, h, w) float in [0, 1] -> (3, size, size) float in [0, 1]: the family's resize-with-pad.
Resize = Callable[[torch.Tensor, int], torch.Tensor]


def camera_tiles(observation: Observation, camera_names: Sequence[str], size: int, resize: Resize) -> torch.Tensor:
    """(C, 3, size, size) in [-1, 1], one per declared camera: present ones resized, missing ones -1."""
    tiles = []
    for name in camera_names:
        if observation.image_masks[name]:
            pixels = torch.from_numpy(observation.images[name]).permute(2, 0, 1).float() / 255.0
            tiles.append(resize(pixels, size) * 2.0 - 1.0)
        else:
            tiles.append(torch.full((3, size, size), -1.0))
    return torch.stack(tiles)


def resize_with_pad_left_top(image: torch.Tensor, size: int) -> torch.Tensor:
    """(3, h, w) float in [0, 1] -> (3, size, size): bilinear to fit (align_corners=False, no antialias, target
    sizes truncated, not rounded), zero padding on the left and at the top (SmolVLA's convention, and pi0's in
    LeRobot <= 0.3)."""
    _, h, w = image.shape
    if (h, w) == (size, size):
        return image
    ratio = max(w / size, h / size)
    new_h, new_w = int(h / ratio), int(w / ratio)
    resized = F.interpolate(image[None], size=(new_h, new_w), mode="bilinear", align_corners=False)[0]
    return F.pad(resized, (max(0, size - new_w), 0, max(0, size - new_h), 0), value=0.0)
