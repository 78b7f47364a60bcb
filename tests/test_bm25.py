"""Lucene BM25 pieces: the one-byte length encoding and the term score formula."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bertknn_search.backends import bm25


@pytest.mark.parametrize(
    ("length", "byte", "decoded"),
    # Lucene SmallFloat.intToByte4: exact below 24, then 4 significant bits (worked by hand from its source).
    [
        (0, 0, 0),
        (23, 23, 23),
        (24, 24, 24),
        (31, 31, 31),
        (40, 40, 40),
        (41, 40, 40),
        (100, 57, 96),
        (1000, 87, 984),
    ],
)
def test_length_encoding_matches_lucene(length: int, byte: int, decoded: int) -> None:
    assert bm25.encode_length(length) == byte
    assert bm25.decode_length(byte) == decoded


def test_length_encoding_is_monotone_and_lossy_from_below() -> None:
    lengths = list(range(0, 5000, 7))
    decoded = [bm25.decode_length(bm25.encode_length(n)) for n in lengths]
    assert all(d <= n for d, n in zip(decoded, lengths))
    assert decoded == sorted(decoded)
    assert bm25.encode_length(2**31 - 1) == 255


def test_term_score_formula() -> None:
    tf = np.array([1, 3])
    norms = np.array([bm25.encode_length(10), bm25.encode_length(20)])
    got = bm25.term_scores(tf, norms, doc_freq=2, doc_count=10, total_length=150)
    idf = math.log(1 + (10 - 2 + 0.5) / (2 + 0.5))
    avg = 15.0
    want = [idf * f / (f + 1.2 * (0.25 + 0.75 * dl / avg)) for f, dl in ((1, 10), (3, 20))]
    np.testing.assert_allclose(got, want)


def test_idf_is_never_negative() -> None:
    # FTS5's and DrQA's idf go to zero or below for terms in most documents; Lucene's does not.
    assert bm25.idf(doc_freq=10, doc_count=10) > 0
