"""Finding a reference checkpoint's tokenizer on this machine, read-only. Never downloads.

Looked for, in order: what the caller passes (`tokenizer=` / `--tokenizer`: a Tokenizer, a file or a
folder), the checkpoint folder, the folder the processor names when it is relative to the checkpoint
(`tokenizer_name: "tokenizer"`, as LeRobot's newer `save_artifacts` writes), the local Hugging Face cache
entry the processor names (e.g. `google/paligemma-3b-pt-224`), openpi's own cache (`paligemma_tokenizer.model`).
When none is there, one line says which file to put where.

The tokenizer must fit the token embedding: one that can emit an id past the embedding's last row is refused;
a smaller one is fine (models pad the embedding past the tokenizer: Qwen2.5 has 151,665 tokens for 151,936 rows).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omni_ros.policy.layouts.common import CheckpointError
from omni_ros.policy.tokenizer import Tokenizer, TokenizerConfig, tokenizer_from_file

FILES = ("tokenizer.json", "tokenizer.model", "paligemma_tokenizer.model")


def hf_cache_dirs() -> list[Path]:
    """The Hugging Face hub cache folders of this user (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub)."""
    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    dirs.append(home / "hub")
    return dirs


def in_hf_cache(repo_id: str, names: tuple[str, ...] = FILES) -> Path | None:
    """A file of `repo_id` already in the local hub cache (any snapshot), or None."""
    folder = "models--" + repo_id.replace("/", "--")
    for cache in hf_cache_dirs():
        for snapshot in sorted((cache / folder / "snapshots").glob("*"), reverse=True):
            for name in names:
                if (snapshot / name).is_file():
                    return snapshot / name
    return None


def in_folder(folder: Path) -> Path | None:
    for name in FILES:
        if (folder / name).is_file():
            return folder / name
    return None


def relative_folder(folder: Path, name: str) -> Path | None:
    """`name` as a folder inside checkpoint `folder` (a relative tokenizer_name) holding a tokenizer file, or None."""
    if not name or Path(name).is_absolute():
        return None
    candidate = folder / name
    return in_folder(candidate) if candidate.is_dir() else None


def highest_id(tokenizer: Any) -> int | None:
    """One past the largest id `tokenizer` can emit (its `id_bound` if it says, else its vocab_size)."""
    bound = getattr(tokenizer, "id_bound", None)
    if bound is None:
        bound = getattr(tokenizer, "vocab_size", None)
    return None if bound is None else int(bound)


def check_fits(tokenizer: Any, source: str, embedding_rows: int) -> None:
    """Refuse a tokenizer that can emit ids past the token embedding's end; a smaller one is fine."""
    bound = highest_id(tokenizer)
    if bound is not None and bound > embedding_rows:
        raise CheckpointError(
            f"tokenizer {source} can emit ids up to {bound - 1}, past the end of the token embedding "
            f"({embedding_rows} rows): it is not this checkpoint's tokenizer"
        )


def find_tokenizer(folder: Path, given: Any, hub_name: str, vocab_size: int) -> tuple[Tokenizer, str, TokenizerConfig]:
    """(tokenizer, where it came from, its config) for checkpoint `folder`; checks it emits no id past the
    embedding's `vocab_size` rows."""
    if given is not None and not isinstance(given, (str, os.PathLike)):
        tokenizer, source, file = given, "given", getattr(given, "path", None)
    else:
        file = None
        if given is not None:
            path = Path(given)
            file = in_folder(path) if path.is_dir() else path
            if file is None or not file.is_file():
                raise CheckpointError(f"tokenizer {given}: no {' / '.join(FILES)} there")
        file = file or in_folder(folder) or relative_folder(folder, hub_name)
        if file is None and hub_name:
            file = in_hf_cache(hub_name)
        openpi = Path(os.environ.get("OPENPI_DATA_HOME", Path.home() / ".cache" / "openpi"))
        if file is None and (openpi / "big_vision" / "paligemma_tokenizer.model").is_file():
            file = openpi / "big_vision" / "paligemma_tokenizer.model"
        if file is None:
            name = hub_name or "the model's tokenizer"
            raise CheckpointError(
                f"{folder}: no tokenizer found; put the tokenizer.json (or tokenizer.model) of {name} in {folder}, "
                "or pass one with tokenizer= / --tokenizer (omni_ros never downloads it)"
            )
        try:
            tokenizer = tokenizer_from_file(file)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"tokenizer {file}: {exc}") from exc
        source = str(file)
    check_fits(tokenizer, source, vocab_size)
    kind = "sentencepiece" if file is not None and Path(file).suffix == ".model" else "hf"
    return tokenizer, source, TokenizerConfig(kind=kind, path=str(file) if file is not None else None)
