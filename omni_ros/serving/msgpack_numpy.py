"""OpenPI's msgpack-numpy wire encoding, with strict checks on what comes in.

An ndarray travels as the map
    {b"__ndarray__": True, b"data": <raw bytes>, b"dtype": "<f4", b"shape": [H, D]}
and a numpy scalar as
    {b"__npgeneric__": True, b"data": <python value>, b"dtype": "<f4"}
with the marker keys as msgpack bin, exactly as `openpi_client.msgpack_numpy`
writes them, so both sides interoperate byte for byte.

Decoding is where a server is exposed: openpi builds the array straight from
the announced dtype and buffer, so an object dtype would turn peer bytes into
Python object pointers. Here object, void (structured) and complex dtypes are
refused, and the buffer size must match dtype and shape exactly.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

# Object arrays hold pointers; void covers structured dtypes; openpi refuses complex too.
REFUSED_KINDS = frozenset("OVc")
MAX_RANK = 32


class DecodeError(ValueError):
    """A message is not valid msgpack-numpy; the message says what is wrong."""


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind in REFUSED_KINDS:
        raise ValueError(f"cannot send arrays of dtype {obj.dtype} (object, void and complex are refused)")
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot encode {type(obj).__name__} (send numpy arrays, numbers, strings, lists and dicts)")


def packb(obj: Any) -> bytes:
    """Encode `obj` (dicts, lists, str, numbers, numpy arrays and scalars) as openpi does."""
    return msgpack.packb(obj, default=_pack_default)


# Announced dtype string -> the checked np.dtype: a request carries a handful of dtypes, each parsed once.
_DTYPES: dict[str, np.dtype] = {}
_MAX_CACHED_DTYPES = 64


def _dtype(value: Any) -> np.dtype:
    cached = _DTYPES.get(value) if isinstance(value, str) else None
    if cached is not None:
        return cached
    if isinstance(value, bytes):
        value = value.decode("ascii", errors="replace")
    if not isinstance(value, str):
        raise DecodeError(f"array dtype must be a string like '<f4', got {type(value).__name__}")
    try:
        dtype = np.dtype(value)
    except Exception as exc:
        raise DecodeError(f"unknown array dtype {value!r}") from exc
    if dtype.kind in REFUSED_KINDS:
        raise DecodeError(f"refused array dtype {value!r} (object, void and complex are not accepted)")
    if len(_DTYPES) < _MAX_CACHED_DTYPES:  # a peer inventing dtype strings cannot grow it without bound
        _DTYPES[value] = dtype
    return dtype


def _array(obj: dict) -> np.ndarray:
    dtype = _dtype(obj.get(b"dtype"))
    shape = obj.get(b"shape")
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_RANK:
        raise DecodeError(f"array shape must be a list of at most {MAX_RANK} sizes, got {shape!r}")
    count = 1
    for n in shape:
        # type() is int: bool is an int subclass, and True is no size.
        if type(n) is not int or n < 0:
            raise DecodeError(f"array shape must hold non-negative integers, got {shape!r}")
        count *= n
    data = obj.get(b"data")
    if not isinstance(data, bytes):
        raise DecodeError(f"array data must be bytes, got {type(data).__name__}")
    if len(data) != count * dtype.itemsize:
        raise DecodeError(
            f"array of shape {list(shape)} and dtype {dtype.str} needs {count * dtype.itemsize} bytes, got {len(data)}"
        )
    # Read-only view on the received bytes, like openpi: no copy of large images.
    return np.ndarray(shape, dtype, data)


def _scalar(obj: dict) -> np.generic:
    dtype = _dtype(obj.get(b"dtype"))
    try:
        return dtype.type(obj.get(b"data"))
    except Exception as exc:
        raise DecodeError(f"bad numpy scalar of dtype {dtype.str}: {exc}") from exc


def _object_hook(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        return _array(obj)
    if b"__npgeneric__" in obj:
        return _scalar(obj)
    return obj


def unpackb(data: bytes) -> Any:
    """Decode one message; any malformed input raises DecodeError with the reason."""
    try:
        return msgpack.unpackb(data, object_hook=_object_hook)
    except DecodeError:
        raise
    except msgpack.ExtraData as exc:
        raise DecodeError("not one msgpack object: extra bytes after the end") from exc
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        # Truncated input raises ValueError("Unpack failed: incomplete input").
        raise DecodeError(f"not valid msgpack: {str(exc) or type(exc).__name__}") from exc
