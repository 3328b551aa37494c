"""Weights from a .safetensors file into a model, memory-mapped: no tensor is copied twice.

The model is built on the meta device (no memory, no random init), then every parameter is bound to its
tensor in the file: a zero-copy view of the mapped file where the dtype already matches, else one cast
into fresh memory, after which the file pages of that tensor are dropped again. Peak memory is about the
model in its compute dtype, whatever the file's dtype (a bf16 pi0 run in fp32 never holds both copies).

A layout says where each file tensor goes (`Placement`): a parameter, some rows of one (SigLIP's q/k/v
become one `qkv` linear), or one with a leading unit dimension. Everything is checked before anything is
bound: missing, unexpected and mis-shaped tensors give one error that names them.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import mmap
import struct
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
from torch import nn

from omni_ros.policy.layouts.common import CheckpointError

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class Placement:
    """Where one file tensor goes in the model."""

    name: str
    rows: tuple[int, int] | None = None  # fill rows [start, stop) of the parameter
    unsqueeze: bool = False  # the parameter has an extra leading dimension of 1
    transpose: bool = False  # a 2-D file tensor stored (in, out) for a linear's (out, in) weight


Place = Callable[[str], "Placement | None"]  # file key -> placement, or None to skip the tensor


class SafetensorsFile:
    """A .safetensors file: its header parsed here, every tensor a zero-copy view of a private mapping."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.is_file():
            raise CheckpointError(f"{path.parent}: no {path.name}")
        try:
            with open(path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(length))
                # A private (copy-on-write) mapping: writable views for torch, the file itself never written.
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
                _register_mapping(self._map)
        except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path}: cannot read weights (truncated or corrupt?): {exc}") from exc
        header.pop("__metadata__", None)
        self._start = 8 + length
        self._entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
        size = len(self._map)
        for key, entry in header.items():
            try:
                dtype = DTYPES[entry["dtype"]]
                begin, end = (self._start + int(o) for o in entry["data_offsets"])
                shape = tuple(int(n) for n in entry["shape"])
            except (KeyError, TypeError, ValueError) as exc:
                raise CheckpointError(f"{path}: corrupt header entry for '{key}': {exc!r}") from exc
            if end > size or begin > end:
                raise CheckpointError(
                    f"{path}: cannot read weights (truncated or corrupt?): '{key}' ends at byte {end}, the file has "
                    f"{size}"
                )
            self._entries[key] = (dtype, shape, begin, end)

    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, key: str) -> tuple[int, ...]:
        return self._entries[key][1]

    def dtype(self, key: str) -> torch.dtype:
        return self._entries[key][0]

    def view(self, key: str) -> torch.Tensor:
        dtype, shape, begin, end = self._entries[key]
        if begin == end:
            return torch.empty(shape, dtype=dtype)
        count = (end - begin) // torch.empty((), dtype=dtype).element_size()
        return torch.frombuffer(self._map, dtype=dtype, count=count, offset=begin).view(shape)

    def release(self, key: str) -> None:
        """Drop the file pages of `key` from memory (after they were cast into the model)."""
        _, _, begin, end = self._entries[key]
        page = mmap.PAGESIZE
        start = begin - begin % page
        if end > start and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)


# Every live mapping's address range, so a tensor viewing one can have its pages dropped after a copy of it
# was made elsewhere (`release_mapped_pages`). Weak: a mapping goes when its last tensor view does.
_MAPPINGS: list[tuple[int, int, weakref.ref[mmap.mmap]]] = []


def _register_mapping(mapping: mmap.mmap) -> None:
    if len(mapping) == 0:
        return
    base = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    _MAPPINGS[:] = [m for m in _MAPPINGS if m[2]() is not None]
    _MAPPINGS.append((base, base + len(mapping), weakref.ref(mapping)))


def release_mapped_pages(tensor: torch.Tensor) -> bool:
    """Drop from memory the file pages under `tensor` if it views a weights file's mapping (True if so).

    For a consumer that made its own copy of a zero-copy weight (a packed layout, say). The mapping is
    private and never written, so any other view into the same pages (a tied weight) reads them back from
    the file on its next access: nothing changes but the resident memory.
    """
    if tensor.device.type != "cpu" or tensor.numel() == 0 or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    begin = tensor.data_ptr()
    end = begin + tensor.numel() * tensor.element_size()
    for base, stop, ref in _MAPPINGS:
        mapping = ref()
        if mapping is not None and base <= begin and end <= stop:
            page = mmap.PAGESIZE
            start = (begin - base) + (-(begin - base)) % page  # the pages wholly inside the tensor
            length = (end - base) - start
            length -= length % page
            if length > 0:
                mapping.madvise(mmap.MADV_DONTNEED, start, length)
            return True
    return False


def save_float32(named: list[tuple[str, torch.Tensor]], path: Path) -> None:
    """Write `named` tensors to a .safetensors file as float32, one tensor at a time.

    Each tensor is cast (where it is not float32 already), written and its file pages dropped before the next:
    safetensors' `save_file` takes every tensor at once, so handing it a model's float32 linears read all of their
    mapped pages in together (a full-size X-VLA's first int8 load peaked at 1.57x its weights before this), and a
    bf16 checkpoint's casts all lived at once.
    """
    header: dict[str, Any] = {}
    offset = 0
    for name, tensor in named:
        size = tensor.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as the format recommends
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(blob)))
        out.write(blob)
        for _, tensor in named:
            data = tensor.detach().to("cpu", torch.float32).contiguous()
            if data.numel():
                out.write(data.reshape(-1).numpy().data)
            release_mapped_pages(data)
            del data


ModelT = TypeVar("ModelT", bound=nn.Module)


def load_weights(
    build: Callable[[], ModelT],
    file: SafetensorsFile,
    place: Place,
    dtype: torch.dtype,
    source: str,
) -> ModelT:
    """`build()` on the meta device, then every parameter bound to its tensor of `file` (cast to `dtype`)."""
    with torch.device("meta"):
        model = build()
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
    plan: dict[str, list[tuple[str, Placement]]] = {}
    unexpected = []
    for key in file.names():
        placement = place(key)
        if placement is None:
            continue
        if placement.name not in expected:
            unexpected.append(placement.name if placement.name == key else f"{key} -> {placement.name}")
            continue
        plan.setdefault(placement.name, []).append((key, placement))
    missing = sorted(set(expected) - set(plan))
    wrong = [problem for name, parts in plan.items() if (problem := _shape_problem(file, name, expected[name], parts))]
    if missing or unexpected or wrong:
        details = []
        if missing:
            details.append(f"missing {len(missing)} tensors (e.g. {missing[:3]})")
        if unexpected:
            details.append(f"{len(unexpected)} unexpected tensors (e.g. {sorted(unexpected)[:3]})")
        if wrong:
            details.append(f"{len(wrong)} shape mismatches (checkpoint vs config, e.g. {wrong[:3]})")
        raise CheckpointError(f"{file.path} does not match {source}: " + "; ".join(details))
    for name, parts in plan.items():
        _bind(model, name, _materialize(file, expected[name], parts, dtype))
    for module in model.modules():
        if hasattr(module, "init_buffers"):
            cast(Any, module).init_buffers()  # a method (nn.Module types attributes as Tensor | Module)
    return model


def _shape_problem(file: SafetensorsFile, name: str, shape: tuple[int, ...], parts) -> str:
    if len(parts) == 1 and parts[0][1].rows is None:
        key, placement = parts[0]
        got = (1, *file.shape(key)) if placement.unsqueeze else file.shape(key)
        got = got[::-1] if placement.transpose else got
        return "" if got == shape else f"{name}: {got} vs {shape}"
    rows = sorted(p.rows or (0, 0) for _, p in parts)
    covered = rows[0][0] == 0 and rows[-1][1] == shape[0] and all(a[1] == b[0] for a, b in itertools.pairwise(rows))
    fits = all(file.shape(k) == (p.rows[1] - p.rows[0], *shape[1:]) for k, p in parts if p.rows)
    return "" if covered and fits else f"{name}: parts {[file.shape(k) for k, _ in parts]} vs {shape}"


def _materialize(file: SafetensorsFile, shape, parts, dtype: torch.dtype) -> torch.Tensor:
    if len(parts) == 1 and parts[0][1].rows is None:
        key, placement = parts[0]
        view = file.view(key)
        if placement.transpose:
            tensor = view.t().contiguous().to(dtype)
            file.release(key)
            return tensor
        if view.dtype == dtype:
            return view[None] if placement.unsqueeze else view  # zero-copy: the mapped file itself
        tensor = view.to(dtype)
        file.release(key)
        return tensor[None] if placement.unsqueeze else tensor
    tensor = torch.empty(shape, dtype=dtype)
    for key, placement in parts:
        start, stop = placement.rows
        tensor[start:stop].copy_(file.view(key))
        file.release(key)
    return tensor


def _bind(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    # Trainable, as a freshly built model is (resuming training from a checkpoint needs the gradients).
    module._parameters[leaf] = nn.Parameter(tensor, requires_grad=tensor.is_floating_point())
