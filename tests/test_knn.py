"""p_kNN: temperature, squared distances, summing over all neighbours, numerical stability."""

from __future__ import annotations

import numpy as np
import pytest

from bertknn_search.knn import knn_probs


def test_sums_every_neighbour_with_the_same_value() -> None:
    d = np.array([0.0, 6.0, 6.0])
    ids = np.array([1, 2, 2])
    p = knn_probs(d, ids, vocab_size=4, temperature=6.0)
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
