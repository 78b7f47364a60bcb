"""Store codec: a block of context vectors <-> bytes, as float16 (default) or 8-bit scalar-quantized.

``int8`` stores each vector as 8-bit codes and one float32 scale, its largest absolute value / 127
(symmetric, per vector): 772 bytes instead of float16's 1,536 at dim 768. Every block is self-contained,
so articles can be added and replaced one by one without a codebook trained on the whole corpus.

Distances stay asymmetric: the query is never quantized; each stored key is decoded to float32 and
compared exactly. A re-ranking stage (scan int8, re-rank the top k·r with the exact keys) would need the
float16 keys kept as well, which costs more disk than the float16 store alone, so none is offered:
re-ranking against the decoded keys themselves would change nothing. ``benchmarks/bench_store.py``
measures what the quantization costs in kNN agreement with float32.
"""

from __future__ import annotations

import numpy as np

from bertknn_search.errors import ConfigError, IndexCorruptError

DTYPES = ("float16", "int8")
_FLOAT16 = np.dtype("<f2")  # explicit little-endian: an index file reads the same on every machine
_SCALE = np.dtype("<f4")
_CODE_MAX = 127  # symmetric range [-127, 127]; -128 is never used, so negating a code never overflows


def bytes_per_vector(dim: int, dtype: str) -> int:
    """Bytes one vector of ``dim`` floats takes in a block stored as ``dtype``.

    Raises:
        ConfigError: ``dtype`` is not one of ``DTYPES``.
    """
    _check(dtype)
    return 2 * dim if dtype == "float16" else dim + _SCALE.itemsize


def encode(vectors: np.ndarray, dtype: str) -> bytes:
    """One block of vectors as bytes.

    Args:
        vectors: (n, dim) float array, finite (float16 from the encoder; other float types are cast).
        dtype: ``"float16"`` (lossless for float16 input) or ``"int8"`` (per-vector absmax scale:
            each value is off by at most its vector's max |value| / 254).

    Returns:
        ``n * bytes_per_vector(dim, dtype)`` bytes; for int8 the n scales come first, then the codes.

    Raises:
        ConfigError: unknown ``dtype``.
        ValueError: ``vectors`` is not 2-D, or int8 was asked for and a value is not finite.
    """
    _check(dtype)
    array = np.asarray(vectors)
    if array.ndim != 2:
        raise ValueError(f"expected a (n, dim) array of vectors, got shape {array.shape}")
    if dtype == "float16":
        return np.ascontiguousarray(array, dtype=_FLOAT16).tobytes()
    x = array.astype(np.float32)
    if not np.isfinite(x).all():
        raise ValueError("cannot quantize vectors holding inf or NaN; check the encoder's output")
    scale = (np.abs(x).max(axis=1, initial=0.0) / _CODE_MAX).astype(np.float32)
    divisor = np.where(scale > 0, scale, np.float32(1.0))  # an all-zero vector gets scale 0 and codes 0
    codes = np.clip(np.rint(x / divisor[:, None]), -_CODE_MAX, _CODE_MAX).astype(np.int8)
    return scale.astype(_SCALE).tobytes() + codes.tobytes()


def decode(blob: bytes, n: int, dim: int, dtype: str) -> np.ndarray:
    """The vectors of a block written by ``encode``.

    Args:
        blob: the bytes ``encode`` returned.
        n: number of vectors in the block.
        dim: their dimension.
        dtype: what the block was encoded as.

    Returns:
        (n, dim) float32, a new writable array.

    Raises:
        ConfigError: unknown ``dtype``.
        IndexCorruptError: ``blob`` does not hold exactly ``n`` vectors of ``dim``.
    """
    expected = n * bytes_per_vector(dim, dtype)
    if len(blob) != expected:
        raise IndexCorruptError(
            f"a stored vector block has {len(blob)} bytes where {n} {dtype} vectors of dim {dim} take"
            f" {expected}; rebuild the index with ingest"
        )
    if dtype == "float16":
        return np.frombuffer(blob, dtype=_FLOAT16).reshape(n, dim).astype(np.float32)
    scale = np.frombuffer(blob, dtype=_SCALE, count=n)
    codes = np.frombuffer(blob, dtype=np.int8, offset=n * _SCALE.itemsize).reshape(n, dim)
    return codes.astype(np.float32) * scale.astype(np.float32)[:, None]


def _check(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ConfigError(f"store dtype must be one of {DTYPES}, got {dtype!r}")
