"""The msgpack-numpy codec speaks openpi_client's encoding byte for byte and refuses unsafe input."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy as openpi_codec

from omni_ros.serving.msgpack_numpy import DecodeError, packb, unpackb


def _sample() -> dict:
    rng = np.random.default_rng(0)
    return {
        "actions": rng.normal(size=(50, 8)).astype(np.float32),
        "image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "chw": rng.integers(0, 256, (3, 4, 5), dtype=np.uint8),
        "bools": np.array([True, False]),
        "scalar": np.float32(1.5),  # (np.float64 is a float subclass: msgpack sends it as a plain float)
        "count": np.int32(-7),
        "nested": {"state": np.arange(14, dtype=np.float64), "empty": np.zeros((0, 3), np.float32)},
        "prompt": "pick up the cup",
        "list": [1, 2.5, "x"],
    }


def _assert_same(a, b) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (np.ndarray, np.generic)):
        assert type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b


def test_bytes_identical_to_openpi_client():
    obj = _sample()
    assert packb(obj) == openpi_codec.packb(obj)


def test_round_trip_both_directions():
    obj = _sample()
    _assert_same(obj, unpackb(openpi_codec.packb(obj)))
    _assert_same(obj, openpi_codec.unpackb(packb(obj)))


def test_non_contiguous_arrays_travel_in_c_order():
    array = np.arange(24, dtype=np.int16).reshape(4, 6)[:, ::2].T
    np.testing.assert_array_equal(unpackb(packb({"a": array}))["a"], array)


def test_marker_keys_are_bin():
    raw = msgpack.unpackb(packb({"a": np.zeros(2, np.float32)}), raw=True)
    assert b"__ndarray__" in raw[b"a"] and raw[b"a"][b"dtype"] == b"<f4"


@pytest.mark.parametrize("dtype", [object, np.complex64, np.dtype([("a", "<i4")])])
def test_refused_dtypes_are_not_sent(dtype):
    with pytest.raises(ValueError, match="refused"):
        packb({"a": np.zeros(2, dtype=dtype)})


def test_unknown_types_are_not_sent():
    with pytest.raises(TypeError, match="cannot encode set"):
        packb({"a": {1, 2}})


def _array_map(data: bytes, dtype, shape) -> bytes:
    return msgpack.packb({"x": {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}})


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (openpi_codec.packb({"a": np.zeros(100)})[:-5], "incomplete input"),
        (openpi_codec.packb({"a": 1}) + b"\x01", "extra bytes"),
        (b"\xc1", "not valid msgpack"),
        (b"", "not valid msgpack"),
        (_array_map(b"\x00" * 8, "|O", [1]), "refused array dtype '|O'"),
        (_array_map(b"\x00" * 16, "<c8", [2]), "refused array dtype"),
        (_array_map(b"\x00" * 8, "[('a', '<i4')]", [2]), "dtype"),
        (_array_map(b"\x00" * 8, "not-a-dtype", [2]), "unknown array dtype"),
        (_array_map(b"\x00" * 7, "<f4", [2]), "needs 8 bytes, got 7"),
        (_array_map(b"\x00" * 8, "<f4", [-2]), "non-negative"),
        (_array_map(b"\x00" * 8, "<f4", "2"), "shape must be a list"),
        (_array_map("text", "<f4", [1]), "data must be bytes"),
        (_array_map(b"\x00" * 4, 5, [1]), "dtype must be a string"),
        (msgpack.packb({"x": {b"__npgeneric__": True, b"data": "abc", b"dtype": "<f4"}}), "bad numpy scalar"),
    ],
)
def test_malformed_input_raises_decode_error(message, reason):
    with pytest.raises(DecodeError, match=reason.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        unpackb(message)


def test_decoded_arrays_are_read_only_views():
    decoded = unpackb(packb({"a": np.ones((2, 2), np.float32)}))["a"]
    assert not decoded.flags.writeable
