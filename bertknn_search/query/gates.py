"""Adaptive retrieval: a question's signal (popularity, BERT's confidence) -> whether to retrieve at all.

Mallen et al. (2023, PopQA) retrieve only for questions whose subject popularity is below a threshold
chosen per relation on a dev split, maximising *adaptive accuracy*: the retrieval-augmented answer below
the threshold, the parametric one at or above it. The same rule with BERT's top-1 probability (or the
entropy of p_BERT) needs no popularity at all.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

from bertknn_search.config import GATES, Config
from bertknn_search.records import GateDecision

SIGNALS = GATES[1:]
ANY_RELATION = "*"
BINS = 10  # PopQA's candidates: the edges of a 10-bin histogram of the signal
# +1: a low value means "retrieve" (little known about the subject, BERT unsure); -1: a high one does.
ORIENTATION = {"popularity": 1.0, "top1": 1.0, "entropy": -1.0}
# The "always retrieve" candidate, finite so that settings files stay plain JSON.
ALWAYS = 1e9


def log_popularity(popularity: float | None) -> float | None:
    """PopQA's scale: natural log of the page views, a popularity below 1 counting as 1."""
    return None if popularity is None else math.log(max(float(popularity), 1.0))


def confidence(p_bert: np.ndarray, answerable: np.ndarray) -> dict[str, np.ndarray]:
    """BERT's confidence per question: top-1 probability and entropy (nats) over the answerable ids.

    Args:
        p_bert: (B, V) masked-LM distributions.
        answerable: (V,) bool, the ids that may be answers (special tokens are not).

    Returns:
        {"top1": (B,) float64, "entropy": (B,) float64}; entropy is over the answerable ids renormalised.
    """
    p = np.where(answerable[None, :], p_bert.astype(np.float64), 0.0)
    q = p / np.maximum(p.sum(axis=1, keepdims=True), 1e-300)
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.where(q > 0, q * np.log(q), 0.0).sum(axis=1)
    return {"top1": p.max(axis=1), "entropy": entropy}


def retrieves(signal: str, value: float | None, threshold: float | None) -> bool:
    """Mallen et al.'s rule: retrieve iff the value is below the threshold (above, for entropy).

    An unknown value or a missing threshold retrieves: the gate only ever saves work it can justify.
    """
    if value is None or threshold is None or math.isnan(value):
        return True
    return ORIENTATION[signal] * value < ORIENTATION[signal] * threshold


def threshold_for(thresholds: Mapping[str, float], relation: str | None) -> float | None:
    """The relation's threshold, else the one for any relation, else None."""
    if relation is not None and relation in thresholds:
        return thresholds[relation]
    return thresholds.get(ANY_RELATION)


def decide(
    config: Config, values: Sequence[float | None], relations: Sequence[str | None]
) -> list[GateDecision] | None:
    """The decision of ``config.gate`` for each question; None when the gate is off (all retrieve)."""
    if config.gate == "none":
        return None
    thresholds = config.thresholds(config.gate)
    decisions = []
    for value, relation in zip(values, relations):
        threshold = threshold_for(thresholds, relation)
        go = retrieves(config.gate, value, threshold)
        decisions.append(GateDecision(config.gate, value, threshold, go))
    return decisions


def candidates(values: np.ndarray, signal: str) -> list[float]:
    """Threshold candidates: the edges of a 10-bin histogram of the values (PopQA), then "always retrieve".

    Ordered from least to most retrieval, so that the first best candidate retrieves least.
    """
    edges = np.histogram_bin_edges(values, bins=BINS).tolist()
    return [*sorted(edges, key=lambda e: ORIENTATION[signal] * e), ALWAYS * ORIENTATION[signal]]


def learn_thresholds(
    signal: str,
    values: Sequence[float | None],
    relations: Sequence[str],
    parametric: Sequence[bool],
    retrieval: Sequence[bool],
) -> dict[str, dict[str, float]]:
    """Per relation, and for all relations together ("*"), the threshold that maximises adaptive accuracy.

    Adaptive accuracy (Mallen et al. 2023): the retrieval-augmented answer's hit where the gate retrieves,
    the parametric answer's hit elsewhere. Ties go to the candidate that retrieves least.

    Args:
        signal: one of ``SIGNALS``.
        values: each fact's signal; None (unknown popularity) always retrieves and is not used to place
            the candidates.
        relations: each fact's relation.
        parametric, retrieval: whether BERT's and BERT-kNN's top-1 answer is right, per fact.

    Returns:
        relation -> {"threshold", "accuracy", "parametric", "retrieval", "retrieved", "facts"}; the
        accuracies are fractions of the relation's facts, "retrieved" the share that retrieves.
    """
    groups: dict[str, list[int]] = defaultdict(list)
    for i, relation in enumerate(relations):
        groups[relation].append(i)
    groups[ANY_RELATION] = list(range(len(relations)))
    out = {}
    for relation, members in groups.items():
        known = np.array([values[i] for i in members if values[i] is not None], dtype=np.float64)
        if known.size == 0:
            continue
        par = np.array([parametric[i] for i in members], dtype=bool)
        ret = np.array([retrieval[i] for i in members], dtype=bool)
        best = (math.nan, -1.0, 0.0)  # (threshold, accuracy, share retrieved)
        for edge in candidates(known, signal):
            go = np.array([retrieves(signal, values[i], edge) for i in members], dtype=bool)
            accuracy = float(np.where(go, ret, par).mean())
            if accuracy > best[1]:
                best = (float(edge), accuracy, float(go.mean()))
        out[relation] = {
            "threshold": best[0],
            "accuracy": best[1],
            "parametric": float(par.mean()),
            "retrieval": float(ret.mean()),
            "retrieved": best[2],
            "facts": len(members),
        }
    return out
