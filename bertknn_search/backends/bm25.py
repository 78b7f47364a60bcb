"""Lucene's BM25, reproduced so the embedded backend ranks articles as OpenSearch does.

Lucene stores each document's field length in one byte (``SmallFloat.intToByte4``) and scores with the
decoded length, idf = ln(1 + (N − n + 0.5)/(n + 0.5)) (never negative, unlike FTS5's), and
tf/(tf + k1·(1 − b + b·dl/avgdl)). OpenSearch 2.x multiplies every term score by (k1 + 1); a constant
factor changes no ranking, so it is left out.
"""

from __future__ import annotations

import numpy as np

K1 = 1.2
B = 0.75

_NUM_FREE_VALUES = 24  # 255 − longToInt4(Integer.MAX_VALUE)


def _long_to_int4(i: int) -> int:
    bits = i.bit_length()
    if bits < 4:
        return i
    shift = bits - 4
    return ((i >> shift) & 0x07) | ((shift + 1) << 3)


def _int4_to_long(i: int) -> int:
    bits = i & 0x07
    shift = (i >> 3) - 1
    return bits if shift == -1 else (bits | 0x08) << shift


def encode_length(length: int) -> int:
    """Lucene's ``SmallFloat.intToByte4``: a field length squeezed into one unsigned byte."""
    if length < _NUM_FREE_VALUES:
        return length
    return _NUM_FREE_VALUES + _long_to_int4(length - _NUM_FREE_VALUES)


def decode_length(byte: int) -> int:
    """Lucene's ``SmallFloat.byte4ToInt``."""
    if byte < _NUM_FREE_VALUES:
        return byte
    return _NUM_FREE_VALUES + _int4_to_long(byte - _NUM_FREE_VALUES)


LENGTH_TABLE = np.array([decode_length(i) for i in range(256)], dtype=np.float64)


def idf(doc_freq: int, doc_count: int) -> float:
    return float(np.log(1.0 + (doc_count - doc_freq + 0.5) / (doc_freq + 0.5)))


def term_scores(
    tf: np.ndarray, norms: np.ndarray, doc_freq: int, doc_count: int, total_length: int
) -> np.ndarray:
    """BM25 score of one term in each document that contains it.

    Args:
        tf: (m,) term frequency in each matching document.
        norms: (m,) the documents' encoded field lengths (``encode_length``).
        doc_freq: documents containing the term.
        doc_count: documents that have the field at all.
        total_length: sum of the field's lengths over all documents (Lucene's sumTotalTermFreq).

    Returns:
        (m,) float64 scores.
    """
    avgdl = total_length / doc_count
    dl = LENGTH_TABLE[norms]
    freq = tf.astype(np.float64)
    return idf(doc_freq, doc_count) * freq / (freq + K1 * (1 - B + B * dl / avgdl))
