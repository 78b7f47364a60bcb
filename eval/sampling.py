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

from bertknn_search.eval.reliability import BINS, auc, bin_of

DRAWS = 1000  # outcomes drawn per answer for the floor, resamples for the AUROC's interval
SEED = 49
CHUNK = 100  # draws of outcomes at a time
Z95 = 1.959964  # the standard normal's 97.5th percentile: a two-sided 95% interval


def ece_draws(p: Sequence[float], bins: int = BINS, draws: int = DRAWS, seed: int = SEED) -> np.ndarray:
    """The ECE of ``draws`` sets of outcomes, each answer right with probability its own ``p``."""
    pv = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
    if not len(pv):
        return np.zeros(0)
    onehot = np.eye(bins)[bin_of(pv, bins)]
    counts = onehot.sum(axis=0)
    filled = counts > 0
    mean_p = (pv @ onehot)[filled] / counts[filled]
    rng = np.random.default_rng(seed)
    out = []
    # CHUNK draws at a time: one (draws, answers) array of a whole checkpoint would be gigabytes; the
    # generator's stream is the same in pieces, so the floor does not depend on the chunk
    for start in range(0, draws, CHUNK):
        outcomes = (rng.random((min(CHUNK, draws - start), len(pv))) < pv).astype(np.float64)
        right = (outcomes @ onehot)[:, filled] / counts[filled]
        out.append((np.abs(right - mean_p) * counts[filled]).sum(axis=1) / len(pv))
    return np.concatenate(out)


def ece_floor(p: Sequence[float], bins: int = BINS, draws: int = DRAWS, seed: int = SEED) -> dict[str, Any]:
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


def auroc_interval(
    p: Sequence[float], hits: Sequence[bool], draws: int = DRAWS, seed: int = SEED
) -> list[float] | None:
    """A 95% bootstrap interval of the AUROC (answers resampled with replacement; percentiles 2.5 and
    97.5 of the resamples that hold right and wrong answers); None without both."""
    pv, hv = np.asarray(p, dtype=np.float64), np.asarray(hits, dtype=bool)
    if not len(pv) or hv.all() or not hv.any():
        return None
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(draws):  # one resample at a time: a whole checkpoint's (draws, answers) is gigabytes
        pick = rng.integers(0, len(pv), size=len(pv))
        if (value := auc(pv[pick], hv[pick])) is not None:
            values.append(value)
    if not values:
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


def chance(
    p: Sequence[float], hits: Sequence[bool], bands: dict[str, Any], bins: int = BINS
) -> dict[str, Any]:
    """What chance allows on these answers: the ECE floor, the AUROC's interval, and the Wilson interval
    of each band's share right (``bands``: ``calibration.band_table``'s)."""
    out: dict[str, Any] = {"ece_floor": ece_floor(p, bins), "auroc_95": auroc_interval(p, hits)}
    for name in ("high", "low"):
        band = bands.get(name) or {}
        out[f"{name}_right_95"] = share_interval(int(band.get("hits", 0)), int(band.get("answers", 0)))
    return out
