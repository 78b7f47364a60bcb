"""An answer no neighbour votes for is BERT's alone: its p is the BERT-alone rule's, discounted by what the
neighbours saw (issue 49), whatever the BERT-kNN fit's regression would say."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from bertknn_search.eval.calibration import Measured, fit
from bertknn_search.query.answer_kinds import KindSignals
from bertknn_search.query.confidence import Signals, judge, no_vote_p, shipped
from bertknn_search.query.hardness import Hardness

BERT_KNN = shipped("confidence_fit_bert_knn.json")
BERT_ALONE = shipped("confidence_fit_bert.json")


def answer(votes: int, neighbours: int, coverage: float, bert_p: float | None, top1: float = 0.3) -> Signals:
    """A BERT-kNN answer's signals; ``bert_p`` is BERT's own probability of it (None: no MLM head)."""
    return Signals(
        top1=top1,
        margin=0.1,
        votes=votes,
        neighbors=neighbours,
        near_votes=min(votes, 10) / 10,
        agree=votes > 0,
        distinct=0.5,
        nearest=300.0,
        contexts=neighbours,
        coverage=coverage,
        kinds=KindSignals(bert_p=bert_p, bert_share=0.9 if bert_p is not None else None),
        hard=Hardness(bert_top1=bert_p, bert_entropy=3.0, knn_entropy=1.0, mean_distance=500.0),
    )


def berts_own(p: float) -> Signals:
    """BERT's answer alone, as an index answering by BERT alone scores it (its top-1 probability)."""
    return Signals(p, 0.1, 0, 0, 0.0, False, 0.0, math.inf, 0, 1.0)


def test_an_answer_without_neighbours_gets_the_bert_alone_rules_p_and_is_never_high() -> None:
    found = berts_own(0.62)
    conf = judge(found, True, BERT_KNN)
    assert conf is not None
    assert conf.p == pytest.approx(float(BERT_ALONE.probability([found])[0])) == 0.62
    assert conf.level == "medium"  # no vote: never "high", whatever p says


def test_a_no_vote_answer_is_berts_alone_discounted_by_the_share_the_neighbours_saw() -> None:
    b = 0.7
    bert_alone = float(BERT_ALONE.probability([berts_own(b)])[0])
    # Neighbours that saw next to nothing say nothing: the BERT-alone rule's p.
    assert float(BERT_KNN.probability([answer(0, 8, 1e-9, b)])[0]) == pytest.approx(bert_alone)
    # Half the articles seen and no vote: Bayes, b(1 - c) / (b(1 - c) + 1 - b).
    half = answer(0, 8, 0.5, b)
    assert float(BERT_KNN.probability([half])[0]) == pytest.approx(0.35 / 0.65)
    # The whole articles seen and none of them holds it: p 0, "low" (right 1 time in 113, measured).
    whole = answer(0, 20, 1.0, b)
    assert float(BERT_KNN.probability([whole])[0]) == 0.0
    conf = judge(whole, True, BERT_KNN)
    assert conf is not None and (conf.p, conf.level) == (0.0, "low")
    # What the regression reads does not move it.
    other = dataclasses.replace(half, top1=0.9, distinct=0.1, hard=Hardness(0.1, 8.0, 0.1, 600.0))
    assert float(BERT_KNN.probability([other])[0]) == pytest.approx(0.35 / 0.65)
    seen = [float(BERT_KNN.probability([answer(0, 8, c, b)])[0]) for c in (0.1, 0.4, 0.7, 0.95)]
    assert seen == sorted(seen, reverse=True)


def test_answers_with_votes_or_without_berts_probability_keep_the_regression() -> None:
    assert no_vote_p(answer(3, 20, 1.0, 0.7)) is None
    assert no_vote_p(answer(0, 0, 1.0, 0.7)) is None  # no neighbours: judge gives BERT's top-1
    assert no_vote_p(answer(0, 8, 0.5, None)) is None  # no MLM head (kNN alone) or a multi-piece word
    with_votes = answer(3, 20, 1.0, 0.7)
    # its p is the regression's and the curve's, computed here from the fit's own numbers
    z = float(BERT_KNN.matrix([with_votes])[0] @ np.asarray(BERT_KNN.coef) + BERT_KNN.intercept)
    xs, ys = zip(*BERT_KNN.curve)
    want = float(np.interp(1 / (1 + np.exp(-z)), xs, ys))
    assert float(BERT_KNN.probability([with_votes])[0]) == pytest.approx(want)
    assert want != pytest.approx(no_vote_p(answer(0, 20, 1.0, 0.7)))


def test_the_regression_is_fitted_without_the_answers_it_does_not_score() -> None:
    rng = np.random.default_rng(5)
    rows = []
    for i in range(200):
        votes = int(rng.integers(1, 20))
        found = answer(votes, 20, 1.0, float(rng.random()), top1=votes / 25)
        rows.append(Measured(str(i), ("P19", "P103")[i % 2], found, bool(rng.random() < votes / 20)))
    no_votes = [Measured(f"n{i}", "P19", answer(0, 8, float(rng.random()), 0.9), True) for i in range(40)]
    assert fit(rows + no_votes) == fit(rows)
