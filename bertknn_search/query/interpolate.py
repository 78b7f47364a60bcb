"""Interpolation of p_kNN and p_BERT, and ranking of a distribution (pure)."""

from __future__ import annotations

import numpy as np


def interpolate(p_knn: np.ndarray, p_bert: np.ndarray | None, lam: float) -> np.ndarray:
    """p = λ·p_kNN + (1−λ)·p_BERT, in probability space.

    With no neighbours (p_kNN all zero, e.g. the IR step found nothing) BERT-kNN falls back to BERT
    rather than shrinking every probability by (1−λ). A model without an MLM head has no p_BERT: λ is 1
    whatever was asked, never a mix with a random head's output.

    Args:
        p_knn: (V,) kNN distribution, or zeros.
        p_bert: (V,) masked-LM distribution; None when the model has no MLM head.
        lam: the paper's λ in [0, 1].

    Returns:
        (V,) float64.
    """
    if p_bert is None:
        return p_knn.astype(np.float64)
    if not p_knn.any():
        return p_bert.astype(np.float64)
    return lam * p_knn.astype(np.float64) + (1.0 - lam) * p_bert.astype(np.float64)


def rank(p: np.ndarray, top: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The ``top`` most probable ids, highest first; ties go to the lower id.

    Args:
        p: (V,) probabilities.
        top: how many to return.
        allowed: optional (V,) bool mask (e.g. LAMA's common vocabulary); other ids are never ranked.

    Returns:
        (ids, probs), each (min(top, candidates),); zero-probability ids are not returned.
    """
    scores = p if allowed is None else np.where(allowed, p, -1.0)
    top = min(top, scores.shape[0])
    # argpartition finds the candidates in O(V); a stable sort on (-p, id) then fixes the order and ties.
    part = np.argpartition(-scores, top - 1)[:top]
    cut = scores[part].min()
    candidates = np.flatnonzero(scores >= cut)
    order = candidates[np.lexsort((candidates, -scores[candidates]))][:top]
    order = order[scores[order] > 0]
    return order, p[order]
