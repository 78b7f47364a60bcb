"""Confidence calibration: facts -> each answer's signals and hit -> bands set on one half, P@1 per band on
the other.

``measure`` answers facts as ``query`` does and records, per answer, what ``confidence.signals`` reads and
whether the top answer is right; ``calibrate`` splits the answers by fact (a hash of its key, so that a
re-run splits alike), sets a signal's two thresholds on the calibration half and reports P@1 per band on
the held-out half. ``benchmarks/bench_confidence.py`` runs both; the thresholds in ``confidence.py`` are
the ones it found.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bertknn_search.eval.datasets import Fact
from bertknn_search.eval.harness import prepare
from bertknn_search.query.confidence import HIGH, LEVELS, MEDIUM, Signals, level, signals
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question

BATCH = 64  # questions per model call
MIN_SHARE = 0.15  # the high and the low band each hold at least this share of the calibration answers
# The signals whose value is a score in [0, 1] that grows with confidence (others are reported, not cut).
SCORES: dict[str, Callable[[Signals], float]] = {
    "votes": lambda s: s.votes,
    "near_votes": lambda s: s.near_votes,
    "top1": lambda s: s.top1,
    "margin": lambda s: s.margin,
    "agree": lambda s: float(s.agree),
    "spread": lambda s: 1.0 - s.distinct,  # few distinct values among the neighbours
}


@dataclass(frozen=True)
class Measured:
    """One answered fact: where it comes from, its signals, whether its top answer is right.

    Attributes:
        partial: whether the answer saw part of its articles' contexts (a lazy index under a budget).
    """

    key: str
    relation: str
    signals: Signals
    hit: bool
    word: str
    partial: bool = False

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["signals"]["nearest"] = None if math.isinf(self.signals.nearest) else self.signals.nearest
        return out


def measure(searcher: Searcher, facts: Sequence[Fact], batch: int = BATCH) -> Iterator[Measured]:
    """Answer each fact whose answer can be one (LAMA's rule: one value of the index) and has neighbours.

    Facts without neighbours (no article found) are left out: without an MLM head they get no answer.
    """
    ready, _ = prepare(searcher, facts, None)
    for start in range(0, len(ready), batch):
        chunk = ready[start : start + batch]
        questions: list[Question] = [p.question for p in chunk]
        for prepared, scored in zip(chunk, searcher.score_batch(questions)):
            if len(scored.neighbors) == 0:
                continue
            ranking = searcher.predictions(scored.p, scored)
            found = signals(ranking, scored.neighbors)
            hit = bool(ranking) and ranking[0].token_id in prepared.gold
            partial = any(not c.complete for c in scored.coverage.values())
            fact = prepared.fact
            yield Measured(fact.key, fact.relation, found, hit, ranking[0].word, partial)


def held_out(key: str) -> bool:
    """Whether a fact is in the held-out half (a hash of its key: the same split on every run)."""
    return hashlib.sha256(key.encode("utf-8")).digest()[0] % 2 == 1


def auc(scores: Sequence[float], hits: Sequence[bool]) -> float | None:
    """Probability that a right answer scores above a wrong one (ties count half); None without both."""
    s = np.asarray(scores, dtype=np.float64)
    h = np.asarray(hits, dtype=bool)
    pos, neg = int(h.sum()), int((~h).sum())
    if pos == 0 or neg == 0:
        return None
    order = np.argsort(s, kind="stable")
    ranks = np.empty(len(s), dtype=np.float64)
    ranks[order] = np.arange(1, len(s) + 1)
    for value in np.unique(s):  # tied scores share their mean rank
        tied = s == value
        ranks[tied] = ranks[tied].mean()
    return float((ranks[h].sum() - pos * (pos + 1) / 2) / (pos * neg))


def bands(scores: Sequence[float], hits: Sequence[bool], high: float, medium: float) -> dict[str, Any]:
    """Per band (``confidence.level`` with these thresholds): answers, right answers and P@1 (None: empty)."""
    table: dict[str, Any] = {}
    for name in reversed(LEVELS):
        chosen = [hit for score, hit in zip(scores, hits) if level(score, high, medium) == name]
        table[name] = {
            "answers": len(chosen),
            "hits": sum(chosen),
            "P@1": round(sum(chosen) / len(chosen), 4) if chosen else None,
        }
    return table


def fit(scores: Sequence[float], hits: Sequence[bool], min_share: float = MIN_SHARE) -> tuple[float, float]:
    """Thresholds (high, medium) that separate P@1 most: the largest P@1 of "high" over that of "low"
    (+1 answer each, so that an empty band cannot win), each band holding at least ``min_share`` of
    the answers.

    The candidates are the distinct scores; "medium" is what lies between. Without answers: the
    shipped thresholds.
    """
    if not len(scores):
        return HIGH, MEDIUM
    s = np.asarray(scores, dtype=np.float64)
    h = np.asarray(hits, dtype=np.float64)
    n = len(s)
    candidates = np.unique(s)
    best, chosen = -math.inf, (float(candidates[-1]), float(candidates[0]))
    for lo in candidates:
        low = s < lo
        if low.sum() < min_share * n:
            continue
        p_low = (h[low].sum() + 1) / (low.sum() + 2)
        for hi in candidates[candidates >= lo]:
            high = s >= hi
            if high.sum() < min_share * n:
                break
            ratio = ((h[high].sum() + 1) / (high.sum() + 2)) / p_low
            if ratio > best:
                best, chosen = ratio, (float(hi), float(lo))
    return chosen


def calibrate(
    rows: Sequence[Measured], thresholds: Mapping[str, tuple[float, float]] | None = None
) -> dict[str, Any]:
    """Per signal of ``SCORES``: AUC and thresholds on the calibration half, P@1 per band on the held-out.

    Args:
        rows: measured answers.
        thresholds: signal -> (high, medium) to report instead of fitting (the shipped ones, say).
    """
    calib = [r for r in rows if not held_out(r.key)]
    test = [r for r in rows if held_out(r.key)]
    out: dict[str, Any] = {
        "answers": {"calibration": len(calib), "held_out": len(test)},
        "P@1": {
            "calibration": _rate([r.hit for r in calib]),
            "held_out": _rate([r.hit for r in test]),
        },
        "signals": {},
    }
    for name, score in SCORES.items():
        c_scores, c_hits = [score(r.signals) for r in calib], [r.hit for r in calib]
        t_scores, t_hits = [score(r.signals) for r in test], [r.hit for r in test]
        high, medium = (thresholds or {}).get(name) or fit(c_scores, c_hits)
        table = bands(t_scores, t_hits, high, medium)
        p_high, p_low = table["high"]["P@1"], table["low"]["P@1"]
        out["signals"][name] = {
            "auc_calibration": _round(auc(c_scores, c_hits)),
            "auc_held_out": _round(auc(t_scores, t_hits)),
            "high": round(high, 4),
            "medium": round(medium, 4),
            "calibration": bands(c_scores, c_hits, high, medium),
            "held_out": table,
            "high_over_low": round(p_high / p_low, 2) if p_high is not None and p_low else None,
        }
    return out


def _rate(hits: Sequence[bool]) -> float | None:
    return round(sum(hits) / len(hits), 4) if hits else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
