"""How sure an answer is: signals an answer already has -> a band ("high", "medium", "low") and a score.

The score is the share of the answer's neighbours (k, or fewer where its articles hold fewer contexts)
that hold the top answer (their *votes*), a number in [0, 1] the bands cut. It was chosen, and the
bands' thresholds set, by measurement (``benchmarks/bench_confidence.py``,
``docs/evaluation.md#confidence``): on LAMA T-REx facts with the real all-MiniLM-L6-v2 weights (kNN
only), picked on a calibration half and checked on the held-out half.
The votes told right answers from wrong ones best (AUC 0.70); the top-1 probability, the only clue
before, hardly did (AUC 0.56).

An answer without neighbours (no article found, or the adaptive gate skipped retrieval) is BERT's alone:
its score is BERT's top-1 probability, cut by the same thresholds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bertknn_search.records import Confidence, Neighbors, Prediction

LEVELS = ("low", "medium", "high")
# Thresholds on the score (the neighbours' votes for the top answer), fitted on the calibration half
# of bench_confidence (0.114 and 0.048 there; benchmarks/results/confidence-cpu-minilm.json), rounded:
# at or above HIGH is "high", at or above MEDIUM "medium", below it "low". On the held-out half P@1 was
# 25% high, 12% medium, 4% low: the bands rank answers, they do not promise a right one.
HIGH = 0.11
MEDIUM = 0.05
NEAR = 10  # the nearest neighbours ``near_votes`` counts


@dataclass(frozen=True)
class Signals:
    """What an answer's confidence could be read from; ``bench_confidence`` measures each.

    Attributes:
        top1: probability of the top answer (BERT-kNN's ranking).
        margin: top1 minus the second answer's probability.
        votes: share of the neighbours whose value is the top answer (0 without neighbours).
        near_votes: the same share among the ``NEAR`` nearest neighbours.
        nearest: squared distance of the nearest neighbour (inf without neighbours).
        agree: whether the nearest neighbour holds the top answer.
        distinct: distinct values among the neighbours, over their number (0 without neighbours).
        neighbors: how many neighbours the answer had.
    """

    top1: float
    margin: float
    votes: float
    near_votes: float
    nearest: float
    agree: bool
    distinct: float
    neighbors: int


def signals(ranking: Sequence[Prediction], nb: Neighbors) -> Signals:
    """The signals of an answer whose ranking (best first) was computed from the neighbours ``nb``."""
    probs = [p.prob for p in ranking[:2]] + [0.0, 0.0]
    n = len(nb)
    if not ranking or n == 0:
        return Signals(probs[0], probs[0] - probs[1], 0.0, 0.0, math.inf, False, 0.0, n)
    holds = nb.token_ids == ranking[0].token_id
    nearest_first = np.argsort(nb.distances, kind="stable")
    return Signals(
        top1=probs[0],
        margin=probs[0] - probs[1],
        votes=float(holds.sum()) / n,
        near_votes=float(holds[nearest_first[:NEAR]].mean()),
        nearest=float(nb.distances.min()),
        agree=bool(holds[int(np.argmin(nb.distances))]),
        distinct=len(np.unique(nb.token_ids)) / n,
        neighbors=n,
    )


def level(score: float, high: float = HIGH, medium: float = MEDIUM) -> str:
    """The band of ``score``: "high" at or above ``high``, "medium" at or above ``medium``, else "low"."""
    if score >= high:
        return "high"
    return "medium" if score >= medium else "low"


def assess(ranking: Sequence[Prediction], nb: Neighbors, bert_available: bool) -> Confidence | None:
    """An answer's confidence; None where no answer was computed (no neighbours and no MLM head).

    Args:
        ranking: BERT-kNN's answers, best first.
        nb: the neighbours the kNN part was computed from.
        bert_available: whether the model has an MLM head (without one and without neighbours, the
            ranking is all zeros: no answer).
    """
    found = signals(ranking, nb)
    if found.neighbors == 0:
        if not bert_available or not ranking:
            return None
        score = found.top1  # BERT's answer alone
    else:
        score = found.votes
    score = min(max(float(score), 0.0), 1.0)
    return Confidence(level(score), round(score, 4))
