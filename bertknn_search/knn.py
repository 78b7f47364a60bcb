"""kNN distribution: neighbour distances and values -> p_kNN over the vocabulary (pure)."""

from __future__ import annotations

import numpy as np


def knn_probs(
    distances: np.ndarray,
    token_ids: np.ndarray,
    vocab_size: int,
    temperature: float,
    squared: bool = True,
) -> np.ndarray:
    """p_kNN(w) ∝ Σ_{neighbours with value w} exp(−d/l).

    Every neighbour counts (the reference kept only the nearest per value, a bug), and the softmax
    subtracts the largest logit first (the reference overflowed to NaN once every d > ~620).

    Args:
        distances: (k,) squared L2 distances, as the backends return them.
        token_ids: (k,) int, the value (wordpiece id) of each neighbour.
        vocab_size: size of the output distribution V.
        temperature: the paper's l.
        squared: use d² as the paper's reference code does (l=6 was tuned on it); False uses d.

    Returns:
        (V,) float64 summing to 1, or all zeros when there are no neighbours.
    """
    probs = np.zeros(vocab_size, dtype=np.float64)
    if distances.size == 0:
        return probs
    logits = knn_logits(distances, temperature, squared)
    weights = np.exp(logits - logits.max())
    np.add.at(probs, token_ids.astype(np.int64), weights)
    return probs / weights.sum()


def knn_logits(distances: np.ndarray, temperature: float, squared: bool = True) -> np.ndarray:
    """Each neighbour's logit −d/l (d the squared distance, or with ``squared=False`` its root)."""
    d = distances.astype(np.float64)
    if not squared:
        d = np.sqrt(np.maximum(d, 0.0))
    return -d / temperature
