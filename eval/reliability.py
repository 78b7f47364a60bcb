"""How well a confidence ``p`` ranks and matches its answers: the AUROC, the reliability table, the ECE.

Shared by the calibration (``calibration.calibrate``, ``eval calibrate``), its sampling floor
(``sampling``) and the report, so that every figure bins ``p`` the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

BINS = 10  # equal-width bins of p for the ECE and the reliability diagram


def auc(scores: Sequence[float], hits: Sequence[bool]) -> float | None:
    """Probability that a right answer scores above a wrong one (ties count half); None without both."""
    s = np.asarray(scores, dtype=np.float64)
    h = np.asarray(hits, dtype=bool)
    pos, neg = int(h.sum()), int((~h).sum())
    if pos == 0 or neg == 0:
        return None
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    # tied scores share their mean rank: the ranks below their value plus the middle of their own run
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    ranks = (starts + (counts + 1) / 2)[inverse]
    return float((ranks[h].sum() - pos * (pos + 1) / 2) / (pos * neg))


def bin_of(p: np.ndarray, bins: int = BINS) -> np.ndarray:
    """Each value's equal-width bin of [0, 1] (1.0 in the last): the bins of the ECE and the diagram."""
    return np.minimum((np.asarray(p, dtype=np.float64) * bins).astype(int), bins - 1)


def reliability(p: Sequence[float], hits: Sequence[bool], bins: int = BINS) -> list[dict[str, Any]]:
    """Per equal-width bin of ``p`` that holds answers: its range, answers, mean ``p`` and share right."""
    pv, hv = np.asarray(p, dtype=np.float64), np.asarray(hits, dtype=np.float64)
    which = bin_of(pv, bins)
    out = []
    for b in range(bins):
        inside = which == b
        if inside.any():
            out.append(
                {
                    "low": b / bins,
                    "high": (b + 1) / bins,
                    "answers": int(inside.sum()),
                    "mean_p": float(pv[inside].mean()),
                    "right": float(hv[inside].mean()),
                }
            )
    return out


def ece(p: Sequence[float], hits: Sequence[bool], bins: int = BINS) -> float | None:
    """Expected calibration error: the answers' share-weighted gap between mean ``p`` and share right,
    over equal-width bins of ``p``; None without answers."""
    table = reliability(p, hits, bins)
    n = sum(b["answers"] for b in table)
    return sum(b["answers"] * abs(b["mean_p"] - b["right"]) for b in table) / n if n else None
