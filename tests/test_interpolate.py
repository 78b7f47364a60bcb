"""Interpolation and ranking."""

from __future__ import annotations

import numpy as np

from bertknn_search.query.interpolate import interpolate, rank


def test_interpolation_endpoints_and_middle() -> None:
    p_knn = np.array([0.0, 1.0, 0.0])
    p_bert = np.array([0.5, 0.2, 0.3])
    np.testing.assert_allclose(interpolate(p_knn, p_bert, 0.0), p_bert)
    np.testing.assert_allclose(interpolate(p_knn, p_bert, 1.0), p_knn)
    np.testing.assert_allclose(interpolate(p_knn, p_bert, 0.3), [0.35, 0.44, 0.21])


def test_no_neighbours_falls_back_to_bert() -> None:
    p_bert = np.array([0.5, 0.2, 0.3])
    np.testing.assert_allclose(interpolate(np.zeros(3), p_bert, 0.3), p_bert)


def test_rank_orders_by_probability_then_id() -> None:
    p = np.array([0.1, 0.3, 0.3, 0.0, 0.3])
    ids, probs = rank(p, 3)
    assert ids.tolist() == [1, 2, 4]
    np.testing.assert_allclose(probs, [0.3, 0.3, 0.3])


def test_rank_drops_zero_probabilities_and_respects_allowed() -> None:
    p = np.array([0.0, 0.6, 0.4, 0.0])
    assert rank(p, 10)[0].tolist() == [1, 2]
    allowed = np.array([True, False, True, True])
    assert rank(p, 10, allowed)[0].tolist() == [2]
