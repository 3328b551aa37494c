"""The FAST action detokenizer, as LeRobot 0.6.1's pi0-FAST decodes a generated sequence (DESIGN.md 8c):

    generated PaliGemma ids -> cut at the first end marker "|" -> every "Action: " run removed
    -> FAST id = text_vocab_size - 1 - skip_tokens - id -> byte-level BPE decode -> ord(char) + min_token
    -> truncated / zero-padded to horizon x action_dim -> (horizon, action_dim), time-major
    -> inverse DCT (orthonormal, DCT-III) along time of coefficients / scale

Files (the folder `action_tokenizer_name` names; local only, never downloaded): tokenizer.json (the BPE) and
processor_config.json (scale, min_token, vocab_size). Where LeRobot returns zeros for a sequence it cannot decode,
this raises `UndecodableChunk`: a zero command must never reach an arm.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from omni_ros.errors import OmniRosError
from omni_ros.policy.layouts.common import CheckpointError
from omni_ros.policy.pi0_fast.configuration import Pi0FastConfig

FILES = ("tokenizer.json", "processor_config.json")


class UndecodableChunk(OmniRosError, ValueError):
    """The generated action tokens do not form a FAST chunk (no command is sent)."""


def read_fast_folder(folder: Path) -> tuple[dict, int]:
    """(processor_config.json, BPE vocabulary size) of a FAST tokenizer folder, or one line saying what to put where."""
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(
            f"no FAST action tokenizer at {folder}: put its {' and '.join(missing)} there (the folder the checkpoint's "
            "action_tokenizer_name names, e.g. lerobot/fast-action-tokenizer's files; omni_ros never downloads it)"
        )
    try:
        config = json.loads((folder / "processor_config.json").read_text())
        from tokenizers import Tokenizer

        size = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    except Exception as exc:  # the Rust parser raises plain Exception subclasses
        raise CheckpointError(f"FAST action tokenizer {folder}: not readable: {exc}") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"{folder / 'processor_config.json'}: expected a JSON object")
    return config, int(size)


def idct_ortho(coefficients: np.ndarray) -> np.ndarray:
    """Inverse of the orthonormal DCT-II along axis 0 (scipy's idct(x, axis=0, norm="ortho")), in float64."""
    n = coefficients.shape[0]
    k = np.arange(n)[:, None]
    basis = np.cos(np.pi * (2 * np.arange(n)[None, :] + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    basis[0] /= np.sqrt(2.0)
    return basis.T @ coefficients


class FastDetokenizer:
    """Generated PaliGemma ids -> a normalized action chunk (horizon, action_dim)."""

    def __init__(self, cfg: Pi0FastConfig, folder: Path) -> None:
        from tokenizers import Tokenizer

        self.cfg = cfg
        self.folder = folder
        read_fast_folder(folder)
        self._bpe = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.bpe_size = self._bpe.get_vocab_size(with_added_tokens=True)

    def action_ids(self, generated: Sequence[int]) -> list[int]:
        """The FAST part of a generated sequence (PaliGemma ids): up to the end marker, "Action: " runs removed."""
        cfg, ids = self.cfg, [int(i) for i in generated]
        check = cfg.action_prefix_ids[:2]
        if cfg.validate_action_prefix and ids[:2] != check:
            raise UndecodableChunk(f"the generated tokens do not start with 'Action:' (ids {check}): {ids[:8]}...")
        if cfg.end_id in ids:
            ids = ids[: ids.index(cfg.end_id)]
        prefix, i = cfg.action_prefix_ids, 0
        while prefix and i <= len(ids) - len(prefix):
            if ids[i : i + len(prefix)] == prefix:
                ids = ids[:i] + ids[i + len(prefix) :]
            else:
                i += 1
        return ids

    def decode(self, generated: Sequence[int], horizon: int, action_dim: int) -> np.ndarray:
        cfg = self.cfg
        ids = self.action_ids(generated)
        if not ids:
            raise UndecodableChunk("the generated sequence holds no action token")
        top = cfg.text_vocab_size - 1 - cfg.fast.skip_tokens
        fast = [top - i for i in ids]
        bad = [i for i, f in zip(ids, fast, strict=True) if not 0 <= f < self.bpe_size]
        if bad:
            raise UndecodableChunk(
                f"generated ids {bad[:5]} are not FAST action tokens (those are ids {top - self.bpe_size + 1}..{top})"
            )
        text = self._bpe.decode(fast, skip_special_tokens=False)
        if "\ufffd" in text:
            raise UndecodableChunk("the action tokens decode to malformed bytes (not a FAST coefficient string)")
        coefficients = np.array([ord(c) for c in text], dtype=np.float64) + cfg.fast.min_token
        size = horizon * action_dim
        # LeRobot's relaxed decoding: a sequence with too many or too few coefficients is cut or zero-padded.
        coefficients = np.pad(coefficients[:size], (0, max(0, size - len(coefficients))))
        return idct_ortho(coefficients.reshape(horizon, action_dim) / cfg.fast.scale)
