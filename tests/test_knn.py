"""p_kNN: temperature, squared distances, summing over all neighbours, numerical stability."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from bertknn_search.query.evidence import diverse_order
from bertknn_search.query.knn import knn_logits, knn_probs

SMALLEST = 5e-324  # the smallest positive float
LARGEST = sys.float_info.max


def test_sums_every_neighbour_with_the_same_value() -> None:
    d = np.array([0.0, 6.0, 6.0])
    ids = np.array([1, 2, 2])
    p = knn_probs(d, ids, size=4, temperature=6.0)
    w = np.array([1.0, np.exp(-1.0), np.exp(-1.0)])
    expected = np.array([0.0, w[0], w[1] + w[2], 0.0]) / w.sum()
    np.testing.assert_allclose(p, expected)
    # The reference kept only the nearest neighbour per value; two far votes must beat that.
    assert p[2] > np.exp(-1.0) / (1 + np.exp(-1.0))


def test_squared_versus_plain_distance() -> None:
    d2 = np.array([4.0, 16.0])
    ids = np.array([0, 1])
    sq = knn_probs(d2, ids, 2, temperature=2.0, squared=True)
    plain = knn_probs(d2, ids, 2, temperature=2.0, squared=False)
    np.testing.assert_allclose(sq, np.array([1, np.exp(-6.0)]) / (1 + np.exp(-6.0)))
    np.testing.assert_allclose(plain, np.array([1, np.exp(-1.0)]) / (1 + np.exp(-1.0)))


def test_large_distances_do_not_overflow() -> None:
    # exp(-700/6) underflows to 0 in float64 without the max-subtraction; the reference returned NaN.
    p = knn_probs(np.array([7000.0, 7006.0]), np.array([3, 5]), 8, temperature=6.0)
    assert np.isfinite(p).all()
    np.testing.assert_allclose(p[[3, 5]], np.array([1, np.exp(-1.0)]) / (1 + np.exp(-1.0)))


def test_no_neighbours_gives_zeros() -> None:
    p = knn_probs(np.zeros(0), np.zeros(0, dtype=np.int64), 5, temperature=6.0)
    assert p.shape == (5,) and not p.any()


@pytest.mark.parametrize("temperature", [0.5, 6.0, 60.0])
def test_is_a_distribution(temperature: float) -> None:
    rng = np.random.default_rng(0)
    p = knn_probs(rng.uniform(0, 300, 128), rng.integers(0, 50, 128), 50, temperature)
    assert p.min() >= 0 and p.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("squared", [True, False])
def test_the_smallest_temperature_puts_all_mass_on_the_nearest_words(squared: bool) -> None:
    # −d/l is −inf for every d > 0 here, and −inf − −inf is NaN: the empty kNN column.
    d = np.array([9.0, 4.0, 4.0, 16.0, 4.0])
    ids = np.array([0, 1, 2, 3, 1])
    with np.errstate(all="raise"):  # no overflow, division or invalid value escapes
        p = knn_probs(d, ids, 5, SMALLEST, squared)
    np.testing.assert_array_equal(p, [0.0, 2 / 3, 1 / 3, 0.0, 0.0])  # the tie shared per neighbour
    np.testing.assert_array_equal(knn_probs(d[:1], ids[:1], 5, SMALLEST, squared), [1.0, 0, 0, 0, 0])


@pytest.mark.parametrize("squared", [True, False])
def test_the_largest_temperature_spreads_the_mass_evenly_over_neighbours(squared: bool) -> None:
    d = np.array([9.0, 4.0, 4.0, 1e30, 4.0])
    ids = np.array([0, 1, 2, 3, 1])
    p = knn_probs(d, ids, 5, LARGEST, squared)
    np.testing.assert_allclose(p, [0.2, 0.4, 0.2, 0.2, 0.0])


@pytest.mark.parametrize("temperature", [SMALLEST, 1e-300, 1e-12, 0.5, 6.0, 1e12, 1e300, LARGEST])
def test_every_temperature_gives_a_distribution(temperature: float) -> None:
    rng = np.random.default_rng(1)
    d = rng.uniform(0, 3000, 128).astype(np.float32)  # as the backends return them
    p = knn_probs(d, rng.integers(0, 50, 128), 50, temperature)
    assert np.isfinite(p).all() and p.min() >= 0 and p.sum() == pytest.approx(1.0)


def test_normal_temperatures_agree_with_the_plain_formula() -> None:
    rng = np.random.default_rng(2)
    d, ids = rng.uniform(0, 300, 64), rng.integers(0, 20, 64)
    for temperature in (0.5, 6.0, 60.0):
        w = np.exp(-d / temperature)
        expected = np.bincount(ids, weights=w, minlength=20) / w.sum()
        np.testing.assert_allclose(knn_probs(d, ids, 20, temperature), expected, rtol=1e-12)


def test_evidence_relevance_survives_the_extremes() -> None:
    d = np.array([1.0, 1.0, 2.0, 3.0])
    vectors = np.eye(4)  # nothing redundant: relevance alone decides
    sharp = knn_logits(d, SMALLEST)
    assert sharp.tolist() == [0.0, 0.0, -np.inf, -np.inf]  # the nearest keep a finite logit
    assert diverse_order(sharp, vectors, 3) == [0, 1]  # the others have no weight at this l
    flat = knn_logits(d, LARGEST)
    assert np.isfinite(flat).all() and diverse_order(flat, vectors, 3) == [0, 1, 2]
