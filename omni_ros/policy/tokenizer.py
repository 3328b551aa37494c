"""Prompt tokenizers. `bytes` and `words` are built in (no file, no download); `hf` (a `tokenizer.json`, the
`tokenizers` package) and `sentencepiece` (a `.model`) load local files for real checkpoints.

The built-in ones lowercase and end the prompt themselves (omni_ros's own convention). The file-based ones
encode the text exactly as given, with the special tokens the file defines (PaliGemma's BOS): the prompt
format of a reference checkpoint (LeRobot's trailing newline, pi0.5's `Task: ...`) is the processor's job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np


@dataclass
class TokenizerConfig:
    """`bytes` needs no file; `words` maps whole words of `vocab` to one token each (unknown words share
    one id); `hf` loads a local tokenizer.json, `sentencepiece` a local .model file."""

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


def _pad(ids: list[int], max_tokens: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ids (max_tokens,) int64 and their validity mask; longer inputs are cut at the end."""
    ids = ids[:max_tokens]
    tokens = np.full(max_tokens, pad, dtype=np.int64)
    tokens[: len(ids)] = ids
    mask = np.zeros(max_tokens, dtype=bool)
    mask[: len(ids)] = True
    return tokens, mask


class SentencePieceTokenizer:
    """A local SentencePiece model (PaliGemma's `tokenizer.model`): BOS, then the text as given."""

    def __init__(self, path: str | Path) -> None:
        import sentencepiece

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"SentencePiece model not found: {path}")
        self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        self.vocab_size = self._sp.get_piece_size()
        self.path = path

    def ids(self, text: str, special: bool = True) -> list[int]:
        """Token ids of `text`, with the BOS first when `special`."""
        bos = [self._sp.bos_id()] if special and self._sp.bos_id() >= 0 else []
        return [*bos, *self._sp.encode(text)]

    def pad(self, ids: list[int], max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        return _pad(ids, max_tokens, max(self._sp.pad_id(), 0))

    def token_id(self, piece: str) -> int | None:
        """The id of vocabulary piece `piece`, None if it has none."""
        i = self._sp.piece_to_id(piece)
        return None if i == self._sp.unk_id() and piece != self._sp.id_to_piece(i) else int(i)

    @property
    def base_vocab_size(self) -> int:
        return self.vocab_size

    def encode(self, text: str, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        return self.pad(self.ids(text), max_tokens)


class HFTokenizer:
    """A local Hugging Face `tokenizer.json` (the `tokenizers` package; no `transformers`, no hub)."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer.json not found: {path}")
        try:
            self._tok = _Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust parser raises plain Exception subclasses
            raise ValueError(f"{path}: not a readable tokenizer.json: {exc}") from exc
        # Padding and truncation are ours to apply (right side, to the checkpoint's prompt length).
        self._tok.no_padding()
        self._tok.no_truncation()
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        # Ids need not be dense (an added token may sit past the base vocabulary): what can reach the embedding
        # is the largest id, not the count.
        vocab = self._tok.get_vocab(with_added_tokens=True)
        self.id_bound = max(vocab.values(), default=-1) + 1
        self.pad_id = next((i for t in ("<pad>", "[PAD]", "<|pad|>") if (i := self._tok.token_to_id(t)) is not None), 0)
        self.path = path

    def ids(self, text: str, special: bool = True) -> list[int]:
        """Token ids of `text`, with the file's special tokens (PaliGemma's BOS) when `special`."""
        return self._tok.encode(text, add_special_tokens=special).ids

    def pad(self, ids: list[int], max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        return _pad(ids, max_tokens, self.pad_id)

    def token_id(self, piece: str) -> int | None:
        """The id of vocabulary piece `piece`, None if it has none."""
        return self._tok.token_to_id(piece)

    @property
    def base_vocab_size(self) -> int:
        """Pieces without the added tokens (what transformers' `vocab_size` counts: pi0-FAST's id mapping)."""
        return int(self._tok.get_vocab_size(with_added_tokens=False))

    def encode(self, text: str, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        return self.pad(self.ids(text), max_tokens)


def make_tokenizer(cfg: TokenizerConfig, base_dir: Path | None = None) -> Tokenizer:
    if cfg.kind == "bytes":
        return ByteTokenizer()
    if cfg.kind == "words":
        return WordTokenizer(cfg.vocab)
    if cfg.kind in ("sentencepiece", "hf"):
        if not cfg.path:
            raise ValueError(f"tokenizer.kind '{cfg.kind}' needs tokenizer.path (a local file)")
        path = Path(cfg.path)
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        return SentencePieceTokenizer(path) if cfg.kind == "sentencepiece" else HFTokenizer(path)
    raise ValueError(f"unknown tokenizer kind '{cfg.kind}'; use 'bytes', 'words', 'hf' or 'sentencepiece'")


def tokenizer_from_file(path: str | Path) -> Tokenizer:
    """A tokenizer.json (hf) or a SentencePiece .model, by its name."""
    path = Path(path)
    return SentencePieceTokenizer(path) if path.suffix == ".model" else HFTokenizer(path)
