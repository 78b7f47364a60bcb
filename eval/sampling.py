"""How much of a measured calibration error is chance: the sampling floor of the ECE and intervals.

With 100-200 answers in a kind of relation, even a ``p`` that is exactly right for every answer has an
ECE well above 0: each bin's share right is a sample of its answers, not their mean ``p``. ``ece_floor``
measures that floor the direct way: it draws each answer's outcome from its own ``p`` (right with
probability ``p``) many times and computes the ECE of each draw with the same bins as the measured one.
A measured ECE under the floor's 95th percentile is what a perfectly calibrated ``p`` would show on so
few answers; one above it is a real miss. ``auroc_interval`` bootstraps the AUROC over the answers, and
``share_interval`` gives a share right (of "high" or "low" answers) its Wilson interval, which, unlike a
bootstrap, says something about 2 answers. All draws are seeded: a report is the same on every run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

DRAWS = 1000  # outcomes drawn per answer for the floor, resamples for the AUROC's interval
SEED = 49
Z95 = 1.959964  # the standard normal's 97.5th percentile: a two-sided 95% interval


def _bin_onehot(p: np.ndarray, bins: int) -> np.ndarray:
    """(answers, bins) 0/1: each answer's equal-width bin of ``p``, as ``reliability.reliability`` bins."""
    which = np.minimum((p * bins).astype(int), bins - 1)
    return np.eye(bins)[which]


def ece_draws(p: Sequence[float], bins: int = 10, draws: int = DRAWS, seed: int = SEED) -> np.ndarray:
    """The ECE of ``draws`` sets of outcomes, each answer right with probability its own ``p``."""
    pv = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
    if not len(pv):
        return np.zeros(0)
    onehot = _bin_onehot(pv, bins)
    counts = onehot.sum(axis=0)
    filled = counts > 0
    mean_p = (pv @ onehot)[filled] / counts[filled]
    rng = np.random.default_rng(seed)
    outcomes = (rng.random((draws, len(pv))) < pv).astype(np.float64)
    right = (outcomes @ onehot)[:, filled] / counts[filled]
    return (np.abs(right - mean_p) * counts[filled]).sum(axis=1) / len(pv)


def ece_floor(p: Sequence[float], bins: int = 10, draws: int = DRAWS, seed: int = SEED) -> dict[str, Any]:
    """The ECE a perfectly calibrated ``p`` shows on these answers by chance: the median and 95th
    percentile over ``draws`` draws of outcomes (``ece_draws``); None for both without answers."""
    values = ece_draws(p, bins, draws, seed)
    if not len(values):
        return {"median": None, "p95": None, "draws": draws}
    return {
        "median": round(float(np.median(values)), 4),
        "p95": round(float(np.percentile(values, 95)), 4),
        "draws": draws,
    }


def _auc_rows(scores: np.ndarray, hits: np.ndarray) -> np.ndarray:
    """The AUROC of each row of ``scores`` (resamples) against the same rows of ``hits``; NaN where a
    row has no right or no wrong answer. Ties count half (average ranks)."""
    out = np.full(scores.shape[0], np.nan)
    for i, (s, h) in enumerate(zip(scores, hits)):
        pos = int(h.sum())
        neg = len(h) - pos
        if not pos or not neg:
            continue
        _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
        # the average rank of a value: the ranks below it, plus the middle of its own tied run
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        ranks = (starts + (counts + 1) / 2)[inverse]
        out[i] = (ranks[h].sum() - pos * (pos + 1) / 2) / (pos * neg)
    return out


def auroc_interval(
    p: Sequence[float], hits: Sequence[bool], draws: int = DRAWS, seed: int = SEED
) -> list[float] | None:
    """A 95% bootstrap interval of the AUROC (answers resampled with replacement; percentiles 2.5 and
    97.5 of the resamples that hold right and wrong answers); None without both."""
    pv, hv = np.asarray(p, dtype=np.float64), np.asarray(hits, dtype=bool)
    if not len(pv) or hv.all() or not hv.any():
        return None
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(pv), size=(draws, len(pv)))
    values = _auc_rows(pv[picks], hv[picks])
    values = values[np.isfinite(values)]
    if not len(values):
        return None
    return [round(float(np.percentile(values, 2.5)), 3), round(float(np.percentile(values, 97.5)), 3)]


def share_interval(right: int, answers: int, z: float = Z95) -> list[float] | None:
    """The Wilson 95% interval of a share right, ``right`` of ``answers``; None without answers."""
    if answers <= 0:
        return None
    share = right / answers
    shrink = 1 + z * z / answers
    centre = (share + z * z / (2 * answers)) / shrink
    half = z * np.sqrt(share * (1 - share) / answers + z * z / (4 * answers * answers)) / shrink
    return [round(float(max(centre - half, 0.0)), 3), round(float(min(centre + half, 1.0)), 3)]


def chance(p: Sequence[float], hits: Sequence[bool], bands: dict[str, Any], bins: int = 10) -> dict[str, Any]:
    """What chance allows on these answers: the ECE floor, the AUROC's interval, and the Wilson interval
    of each band's share right (``bands``: ``calibration.band_table``'s)."""
    out: dict[str, Any] = {"ece_floor": ece_floor(p, bins), "auroc_95": auroc_interval(p, hits)}
    for name in ("high", "low"):
        band = bands.get(name) or {}
        out[f"{name}_right_95"] = share_interval(int(band.get("hits", 0)), int(band.get("answers", 0)))
    return out
