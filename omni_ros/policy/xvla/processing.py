"""Observations <-> X-VLA's tensors, step for step as LeRobot 0.6.1's X-VLA pipeline prepares them (DESIGN.md 8d).

images   uint8 -> float / 255 -> ImageNet mean / std -> THEN resize-with-pad to resize_imgs_with_padding
         (bilinear, no antialias, int() sizes) padded LEFT and TOP with 0.0 in normalized space. The cameras
         present are stacked in declared order; empty slots (missing cameras) follow them, zero tokens.
state    LeRobot's normalizer (IDENTITY by default), zero-padded to max_state_dim in the model
prompt   the BART tokenizer as it is (`<s> ... </s>`), truncated to 64 keeping the specials, right-padded with
         `<pad>` to 64: the pads are attended, so they are part of the input
domain   `domain_id` of the observation, else the policy's (YAML `policy.domain_id`, else the checkpoint's)
actions  the action space's output (sigmoid grippers, real width), the first action_dim, un-normalized
rtc      an old plan normalized back (`rtc_target`); the runner maps it through the action space's inverse
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from omni_ros.observation import Observation, ObservationError, make_observation
from omni_ros.policy.family_base import ChunkProcessor
from omni_ros.policy.inputs import ModelInputs, stack_inputs
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.rtc import RtcRequest, normalized_plan
from omni_ros.policy.tokenizer import Tokenizer
from omni_ros.policy.xvla.configuration import XVLAConfig

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class XVLAInputs(ModelInputs):
    domain_id: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))  # (B,) embodiments


def resize_with_pad_left_top(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(3, h, w) -> (3, height, width): bilinear to fit (int() sizes), zeros on the left and at the top."""
    _, h, w = image.shape
    if (h, w) == (height, width):
        return image
    ratio = max(w / width, h / height)
    new_h, new_w = int(h / ratio), int(w / ratio)
    resized = F.interpolate(image[None], size=(new_h, new_w), mode="bilinear", align_corners=False)[0]
    return F.pad(resized, (max(0, width - new_w), 0, max(0, height - new_h), 0), value=0.0)


def domain_of(value: Any, domains: int) -> int:
    try:
        domain = int(np.asarray(value).reshape(-1)[0])
        exact = float(np.asarray(value).reshape(-1)[0]) == domain
    except (TypeError, ValueError, IndexError) as exc:
        raise ObservationError(f"domain_id must be an integer, got {value!r}") from exc
    if not exact or not 0 <= domain < domains:
        raise ObservationError(f"domain_id {value!r} is not one of this X-VLA checkpoint's domains 0..{domains - 1}")
    return domain


class XVLAProcessor(ChunkProcessor[XVLAConfig]):
    def __init__(self, cfg: XVLAConfig, norm_stats: NormStats, tokenizer: Tokenizer) -> None:
        for method in ("ids", "pad"):
            if not hasattr(tokenizer, method):
                raise TypeError(f"X-VLA needs a file tokenizer (tokenizer.json), got {type(tokenizer).__name__}")
        super().__init__(cfg, norm_stats, tokenizer)
        self.mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def parse(self, raw: Mapping[str, Any]) -> Observation:
        """The common observation, plus an optional `domain_id` (the embodiment this request is for)."""
        if isinstance(raw, Mapping) and "domain_id" in raw:
            rest = {k: v for k, v in raw.items() if k != "domain_id"}
            obs = make_observation(self.spec, rest, tile=False)
            obs.extras["domain_id"] = domain_of(raw["domain_id"], self.cfg.head.num_domains)
            return obs
        return make_observation(self.spec, raw, tile=False)

    def tokenize(self, prompt: str) -> tuple[np.ndarray, np.ndarray]:
        """LeRobot's tokenizer step: specials added, truncated to max_tokens keeping them, padded to max_tokens."""
        tok: Any = self.tokenizer
        limit = self.cfg.tokenizer.max_tokens
        ids = tok.ids(prompt)
        if len(ids) > limit:
            specials = tok.ids("")
            head, tail = specials[:1], specials[1:]
            ids = head + tok.ids(prompt, special=False)[: limit - len(specials)] + tail
        padded, _ = tok.pad(ids, limit)
        return padded, np.ones(limit, dtype=bool)  # every position is attended, pads included

    def camera_stack(self, observation: Observation) -> tuple[torch.Tensor, list[bool]]:
        cfg = self.cfg
        present = [n for n in cfg.camera_names if observation.image_masks[n]]
        tiles = []
        for name in present:
            pixels = torch.from_numpy(observation.images[name]).permute(2, 0, 1).float() / 255.0
            pixels = (pixels - self.mean) / self.std
            tiles.append(resize_with_pad_left_top(pixels, *cfg.resize) if cfg.resize else pixels)
        if len({tuple(t.shape) for t in tiles}) > 1:
            raise ObservationError(
                "this X-VLA checkpoint has no resize_imgs_with_padding: every camera image must have the same size"
            )
        blank = torch.zeros_like(tiles[0])
        slots = max(cfg.num_views, len(tiles))
        return torch.stack(tiles + [blank] * (slots - len(tiles))), [True] * len(tiles) + [False] * (slots - len(tiles))

    def inputs(
        self,
        observations: Sequence[Observation],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> XVLAInputs:
        cfg = self.cfg
        images, masks, tokens, token_masks, states, domains = [], [], [], [], [], []
        for o in observations:
            stack, mask = self.camera_stack(o)
            images.append(stack)
            masks.append(mask)
            ids, valid = self.tokenize(o.prompt)
            tokens.append(ids)
            token_masks.append(valid)
            states.append(self.norm_stats.normalize_state(o.state))
            domains.append(int(o.extras.get("domain_id", cfg.domain_id)))
        if len({tuple(i.shape) for i in images}) > 1:
            raise ObservationError("a batch of X-VLA observations must have the same cameras and image sizes")
        base = stack_inputs(images, masks, tokens, token_masks, states, device, dtype)
        domain = torch.tensor(domains, dtype=torch.long, device=device)
        return XVLAInputs(**{f: getattr(base, f) for f in base.__dataclass_fields__}, domain_id=domain)

    def actions(self, normalized: np.ndarray, observation: Observation) -> np.ndarray:
        return self.norm_stats.unnormalize_actions(normalized[:, : self.cfg.action_dim])

    def rtc_target(self, request: RtcRequest, observation: Observation) -> np.ndarray:
        """The old plan of a real-time-chunking request in model units (H, model_dim_action): `actions` inverted
        up to the action space's output (sigmoid grippers, real width), which the runner inverts
        (ActionSpace.clean_target: the estimate lives before the action space's postprocess)."""
        cfg = self.cfg
        return normalized_plan(
            request, cfg.action_horizon, cfg.action_dim, cfg.model_dim_action, self.norm_stats.normalize_actions
        )
