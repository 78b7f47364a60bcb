"""kNN distribution: neighbour distances and values -> p_kNN over the vocabulary (pure)."""

from __future__ import annotations

import numpy as np


def knn_probs(
    distances: np.ndarray,
    positions: np.ndarray,
    size: int,
    temperature: float,
    squared: bool = True,
) -> np.ndarray:
    """p_kNN(w) ∝ Σ_{neighbours with value w} exp(−d/l).

    Every neighbour counts (the reference kept only the nearest per value, a bug), and the softmax is
    taken over logits relative to the nearest neighbour (see ``knn_logits``): the reference overflowed to
    NaN once every d > ~620, and a plain max-subtraction still gives NaN (−inf − −inf) once d/l overflows.

    Args:
        distances: (k,) squared L2 distances, as the backends return them.
        positions: (k,) int, each neighbour's value as a position of the output: its wordpiece id, or
            for the whole-word policies ``ValueSpace.index`` of its value.
        size: size of the output distribution (V, or ``ValueSpace.size``).
        temperature: the paper's l, any positive finite float: the smallest puts all mass on the nearest
            neighbours' words (shared by exact ties), the largest spreads it evenly over the neighbours.
        squared: use d² as the paper's reference code does (l=6 was tuned on it); False uses d.

    Returns:
        (size,) float64 summing to 1, or all zeros when there are no neighbours.

    Raises:
        ValueError: a negative position (a word's hash passed where its position was due): numpy
            would count it silently at the wrong end of the vocabulary.
    """
    probs = np.zeros(size, dtype=np.float64)
    if distances.size == 0:
        return probs
    if positions.min() < 0:
        raise ValueError("knn_probs takes positions: map whole-word values with ValueSpace.index first")
    weights = np.exp(knn_logits(distances, temperature, squared))  # the nearest's is 1: the sum is >= 1
    np.add.at(probs, positions.astype(np.int64), weights)
    return probs / weights.sum()


def knn_logits(distances: np.ndarray, temperature: float, squared: bool = True) -> np.ndarray:
    """Each neighbour's logit −d/l relative to the nearest's: −(d − d_min)/l, so the nearest has 0.

    A common shift changes neither the softmax nor the evidence ranking, and shifting before dividing keeps
    the logits finite for the nearest neighbours whatever l is: with l = 5e-324, −d/l is −inf for every
    d > 0, and the others then overflow to −inf alone (exp gives the 0 they stand for).
    """
    d = distances.astype(np.float64)
    if not squared:
        d = np.sqrt(np.maximum(d, 0.0))
    if d.size == 0:
        return d
    with np.errstate(over="ignore"):
        return -(d - d.min()) / temperature
