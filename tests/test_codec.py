"""Store codec: byte sizes, shapes, round-trip error bounds, empty blocks and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from bertknn_search.backends import codec
from bertknn_search.errors import ConfigError, IndexCorruptError


def vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    """BERT-like float16 states: unit-scale values with one large dimension."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    x[:, 0] -= 8.0
    return x.astype(np.float16)


@pytest.mark.parametrize(("dtype", "expected"), [("float16", 1536), ("int8", 772)])
def test_bytes_per_vector(dtype: str, expected: int) -> None:
    assert codec.bytes_per_vector(768, dtype) == expected
    assert len(codec.encode(vectors(5, 768), dtype)) == 5 * expected


def test_float16_round_trip_is_lossless() -> None:
    x = vectors(7, 32)
    out = codec.decode(codec.encode(x, "float16"), 7, 32, "float16")
    assert out.dtype == np.float32 and out.shape == (7, 32)
    np.testing.assert_array_equal(out, x.astype(np.float32))


def test_int8_error_is_at_most_half_a_step_of_each_vector() -> None:
    x = vectors(50, 768).astype(np.float32)
    out = codec.decode(codec.encode(x.astype(np.float16), "int8"), 50, 768, "int8")
    assert out.dtype == np.float32 and out.shape == (50, 768)
    bound = np.abs(x).max(axis=1) / 254.0
    assert (np.abs(out - x).max(axis=1) <= bound * (1 + 1e-5)).all()
    # Each vector's largest value is kept exactly (it sets the scale).
    rows = np.arange(50)
    peak = np.abs(x).argmax(axis=1)
    np.testing.assert_allclose(out[rows, peak], x[rows, peak], rtol=1e-6)


def test_int8_keeps_zero_vectors_and_signs() -> None:
    x = np.zeros((3, 4), np.float16)
    x[1] = [1.0, -1.0, 0.5, -0.25]
    out = codec.decode(codec.encode(x, "int8"), 3, 4, "int8")
    np.testing.assert_array_equal(out[0], 0.0)
    np.testing.assert_array_equal(out[2], 0.0)
    np.testing.assert_allclose(out[1], [1.0, -1.0, 64 / 127, -32 / 127], rtol=1e-6)


@pytest.mark.parametrize("dtype", codec.DTYPES)
def test_empty_block(dtype: str) -> None:
    blob = codec.encode(np.zeros((0, 768), np.float16), dtype)
    assert blob == b""
    out = codec.decode(blob, 0, 768, dtype)
    assert out.shape == (0, 768) and out.dtype == np.float32


@pytest.mark.parametrize("dtype", codec.DTYPES)
def test_decode_returns_a_writable_copy(dtype: str) -> None:
    out = codec.decode(codec.encode(vectors(2, 8), dtype), 2, 8, dtype)
    out[0, 0] = 1.0  # the backend may normalise or reuse the array in place


@pytest.mark.parametrize("dtype", codec.DTYPES)
def test_wrong_size_blob_is_reported_as_corrupt(dtype: str) -> None:
    blob = codec.encode(vectors(3, 8), dtype)
    with pytest.raises(IndexCorruptError, match=r"has \d+ bytes where 4 .* take \d+; rebuild the index"):
        codec.decode(blob, 4, 8, dtype)
    with pytest.raises(IndexCorruptError):
        codec.decode(blob[:-1], 3, 8, dtype)


def test_unknown_dtype() -> None:
    with pytest.raises(ConfigError, match="store dtype must be one of"):
        codec.bytes_per_vector(8, "int4")
    with pytest.raises(ConfigError):
        codec.encode(vectors(1, 8), "float32")
    with pytest.raises(ConfigError):
        codec.decode(b"", 0, 8, "bfloat16")


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="expected a"):
        codec.encode(np.zeros(8, np.float16), "int8")
    bad = vectors(2, 8)
    bad[1, 3] = np.inf
    with pytest.raises(ValueError, match="inf or NaN"):
        codec.encode(bad, "int8")


def test_float32_input_is_cast() -> None:
    x = vectors(4, 16).astype(np.float32)
    out = codec.decode(codec.encode(x, "float16"), 4, 16, "float16")
    np.testing.assert_array_equal(out, x)


def test_int8_keeps_nearest_neighbours_of_bert_like_vectors() -> None:
    # Not a speed test: a sanity check that quantization noise stays well below neighbour gaps.
    keys = vectors(400, 768, seed=1).astype(np.float32)
    queries = keys[:20] + 0.3 * np.random.default_rng(2).standard_normal((20, 768)).astype(np.float32)
    approx = codec.decode(codec.encode(keys.astype(np.float16), "int8"), 400, 768, "int8")
    for q in queries:
        exact = np.argsort(((keys - q) ** 2).sum(1))[:10]
        got = np.argsort(((approx - q) ** 2).sum(1))[:10]
        assert exact[0] == got[0]
        assert len(np.intersect1d(exact, got)) >= 8
