"""Prompt tokenizers. `bytes` and `words` are built in (no file, no download);
`sentencepiece` loads a local .model file for real checkpoints."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np


@dataclass
class TokenizerConfig:
    """`bytes` needs no file; `words` maps whole words of `vocab` to one token each (unknown words share
    one id); `sentencepiece` loads a local .model file."""

    kind: str = "bytes"
    path: str | None = None
    max_tokens: int = 48
    vocab: list[str] = field(default_factory=list)


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str, max_tokens: int) -> tuple[np.ndarray, np.ndarray]: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens 0-255, then BOS=256, EOS=257 (a newline ends the prompt, as in pi0)."""

    BOS, EOS, PAD = 256, 257, 258
    vocab_size = 259

    def encode(self, text: str, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (max_tokens,) int64 and a validity mask; long prompts are truncated."""
        body = list((text.strip().lower() + "\n").encode("utf-8"))
        ids = [self.BOS, *body][:max_tokens]
        tokens = np.full(max_tokens, self.PAD, dtype=np.int64)
        tokens[: len(ids)] = ids
        mask = np.zeros(max_tokens, dtype=bool)
        mask[: len(ids)] = True
        return tokens, mask


class WordTokenizer:
    """One token per word of a fixed vocabulary (stored in the checkpoint's config.json).

    A small model grounds "red" in the image far more easily when the color is
    one token than when it is three bytes at a varying offset; real VLA
    tokenizers give common words one piece for the same reason.
    """

    PAD, BOS, EOS, UNK = 0, 1, 2, 3
    _WORD = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")

    def __init__(self, vocab: list[str]) -> None:
        if not vocab:
            raise ValueError("tokenizer.kind 'words' needs tokenizer.vocab (a list of words)")
        words = [w.lower() for w in vocab]
        if len(set(words)) != len(words):
            raise ValueError("tokenizer.vocab has repeated words")
        self._ids = {w: i + 4 for i, w in enumerate(words)}
        self.vocab_size = len(words) + 4

    def encode(self, text: str, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        body = [self._ids.get(w, self.UNK) for w in self._WORD.findall(text.strip().lower())]
        ids = [self.BOS, *body, self.EOS][:max_tokens]
        tokens = np.full(max_tokens, self.PAD, dtype=np.int64)
        tokens[: len(ids)] = ids
        mask = np.zeros(max_tokens, dtype=bool)
        mask[: len(ids)] = True
        return tokens, mask


class SentencePieceTokenizer:
    """A local SentencePiece model (e.g. PaliGemma's) for checkpoints trained with one."""

    def __init__(self, path: str | Path) -> None:
        import sentencepiece

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"SentencePiece model not found: {path}")
        self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        self.vocab_size = self._sp.get_piece_size()

    def encode(self, text: str, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        ids = [self._sp.bos_id(), *self._sp.encode(text.strip().lower() + "\n")][:max_tokens]
        pad = max(self._sp.pad_id(), 0)
        tokens = np.full(max_tokens, pad, dtype=np.int64)
        tokens[: len(ids)] = ids
        mask = np.zeros(max_tokens, dtype=bool)
        mask[: len(ids)] = True
        return tokens, mask


def make_tokenizer(cfg: TokenizerConfig, base_dir: Path | None = None) -> Tokenizer:
    if cfg.kind == "bytes":
        return ByteTokenizer()
    if cfg.kind == "words":
        return WordTokenizer(cfg.vocab)
    if cfg.kind == "sentencepiece":
        if not cfg.path:
            raise ValueError("tokenizer.kind 'sentencepiece' needs tokenizer.path (a local .model file)")
        path = Path(cfg.path)
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        return SentencePieceTokenizer(path)
    raise ValueError(f"unknown tokenizer kind '{cfg.kind}'; use 'bytes', 'words' or 'sentencepiece'")
