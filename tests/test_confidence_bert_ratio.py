"""BERT's probability of the answer against its own first choice, as a confidence input (issue 49): BERT
knows the kind of answer a question wants even where it does not know the answer, so an answer far under
BERT's first choice ('jones' to "X plays [MASK] .") is mostly wrong, whatever its kind of relation."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from bertknn_search.demo import Fact
from bertknn_search.eval.calibration import ANSWER_FEATURES, Measured, fit
from bertknn_search.eval.index_calibration import refit_features
from bertknn_search.query.answer_kinds import KindSignals
from bertknn_search.query.confidence import FEATURES, PROB_FLOOR, Fit, Signals, shipped, signals
from bertknn_search.query.hardness import Hardness
from bertknn_search.query.search import Question, Searcher

ratio = FEATURES["log_bert_ratio"]


def _signals(votes: int, bert_p: float | None, bert_top1: float | None) -> Signals:
    kinds = KindSignals(bert_p=bert_p, bert_share=None if bert_p is None else 0.9)
    return Signals(
        0.4, 0.1, votes, 20, votes / 20, True, 0.5, 9.0, 20, 1.0, kinds, Hardness(bert_top1=bert_top1)
    )


def test_the_ratio_is_zero_for_berts_first_choice_and_a_log_under_it() -> None:
    assert ratio(_signals(3, 0.4, 0.4)) == 0.0
    assert ratio(_signals(3, 0.004, 0.4)) == pytest.approx(math.log(0.01))
    # probabilities under the floor count as the floor: junk wordpieces all look alike
    assert ratio(_signals(3, 1e-12, 0.5)) == pytest.approx(math.log(PROB_FLOOR / 0.5))
    assert ratio(_signals(3, 1e-12, 0.5)) == ratio(_signals(3, 1e-9, 0.5))


def test_the_ratio_is_unknown_without_an_mlm_head_or_for_a_word_of_several_wordpieces() -> None:
    assert math.isnan(ratio(_signals(3, None, None)))  # no MLM head
    assert math.isnan(ratio(_signals(3, None, 0.3)))  # BERT gives a word of several wordpieces no p
    assert math.isnan(ratio(_signals(3, 0.2, None)))  # a checkpoint line written before bert_top1


def _rows(n: int, unknown_every: int = 0) -> list[Measured]:
    """Answers whose rightness follows the ratio: right where BERT's first choice or near it."""
    rng = np.random.default_rng(7)
    rows = []
    for i in range(n):
        top1 = float(rng.uniform(0.05, 0.9))
        under = float(rng.uniform(0.0, 9.0))  # how many nats under BERT's first choice
        hit = bool(rng.random() < 1 / (1 + math.exp(under - 3.0)))
        bert_p = None if unknown_every and i % unknown_every == 0 else top1 * math.exp(-under)
        rows.append(
            Measured(
                str(i), ("P19", "P136", "P106")[i % 3], _signals(int(rng.integers(1, 9)), bert_p, top1), hit
            )
        )
    return rows


def test_a_fit_learns_that_far_under_berts_choice_means_wrong() -> None:
    features = ("log_votes", "log_bert_ratio")
    made = fit(_rows(600), features)
    assert made.coef[1] > 0.5
    near, far = _signals(3, 0.3, 0.3), _signals(3, 0.3 * math.exp(-8), 0.3)
    assert made.probability([near])[0] > made.probability([far])[0] + 0.3


def test_an_unknown_ratio_is_taken_at_its_mean_and_weighs_nothing(tmp_path: Path) -> None:
    features = ("log_votes", "log_bert_ratio")
    rows = _rows(600, unknown_every=5)
    made = fit(rows, features)
    known = [r.signals for r in rows if r.signals.bert_p is not None]
    mean = float(np.mean([ratio(s) for s in known]))
    assert made.mean[1] == pytest.approx(mean, abs=1e-5)  # the mean of the known values only
    at_mean = _signals(3, 0.3 * math.exp(mean), 0.3)
    unknown = _signals(3, None, 0.3)
    assert made.probability([unknown])[0] == pytest.approx(made.probability([at_mean])[0], abs=1e-4)
    # every stored number is finite, so the fit saves and loads (a fit file refuses NaN)
    back = Fit.read(made.save(tmp_path / "fit.json"))
    assert back == made and all(
        math.isfinite(v) for v in json.loads((tmp_path / "fit.json").read_text())["mean"]
    )


def test_a_model_without_an_mlm_head_fits_the_ratio_with_no_weight() -> None:
    rows = [Measured(r.key, r.relation, _signals(r.signals.votes, None, None), r.hit) for r in _rows(300)]
    made = fit(rows, ANSWER_FEATURES)
    at = ANSWER_FEATURES.index("log_bert_ratio")
    assert made.coef[at] == 0.0 and made.scale[at] == 1.0 and made.lower[at] == made.upper[at]


def test_the_shipped_bert_knn_fit_reads_the_ratio_and_minilms_gives_it_no_weight() -> None:
    bert_knn, minilm = shipped("confidence_fit_bert_knn.json"), shipped("confidence_fit.json")
    assert bert_knn.coef[bert_knn.features.index("log_bert_ratio")] > 0  # far under BERT's choice: lower p
    assert minilm.coef[minilm.features.index("log_bert_ratio")] == 0.0  # kNN alone: no MLM head when fitted
    # BERT-kNN: the same votes, BERT's first choice against a word BERT puts 1,000 times under it
    near, far = _signals(3, 0.2, 0.2), _signals(3, 0.0002, 0.2)
    assert bert_knn.probability([near])[0] > bert_knn.probability([far])[0]


def test_a_live_bert_knn_answer_reads_the_ratio_and_a_word_beyond_the_vocabulary_does_not(
    searcher: Searcher, facts: list[Fact]
) -> None:
    """Through the query path's own signals (``Searcher.kind_signals`` and ``Searcher.hardness``, as
    ``Searcher.answer_batch`` passes them): a tiny BERT's answer has a finite ratio, at most 0 (the
    answer comes from the same answerable wordpieces as BERT's top-1), and a word's key beyond the
    vocabulary (a whole-word index's word of several wordpieces) has none, taken at the fit's mean."""
    questions = [Question(f"{f.person.title()} was born in [MASK].", f.person.title()) for f in facts[:3]]
    fit = shipped("confidence_fit_bert_knn.json")
    for a, s in zip(searcher.answer_batch(questions), searcher.score_batch(questions)):
        top = a.bert_knn[0].token_id
        found = signals(a.bert_knn, s.neighbors, None, searcher.kind_signals(top, s), searcher.hardness(s))
        said = ratio(found)
        assert math.isfinite(said) and said <= 1e-9
        beyond = searcher.kind_signals(searcher.kind_table.size + 5, s)
        word = dataclasses.replace(found, kinds=beyond)
        assert beyond.bert_p is None and math.isnan(ratio(word))
        at = fit.features.index("log_bert_ratio")
        assert fit.matrix([word])[0, at] == 0.0  # taken at the fit's mean: no weight either way
        assert fit.matrix([found])[0, at] != 0.0


def test_a_fit_stored_before_the_ratio_gains_it_at_its_next_refit() -> None:
    """``eval calibrate`` refits on every input of the answer's, those added since the fit in use too
    (the ratio and how common the word is, for a fit stored before either)."""
    before = tuple(f for f in ANSWER_FEATURES if f not in ("log_bert_ratio", "common_word"))
    old = dataclasses.replace(
        shipped("confidence_fit.json"),
        features=before,
        mean=(0.0,) * len(before),
        scale=(1.0,) * len(before),
        coef=(0.0,) * len(before),
        lower=(),
        upper=(),
    )
    assert refit_features(old) == ANSWER_FEATURES
    with_knn = dataclasses.replace(
        old,
        features=(*old.features, "knn_entropy"),
        mean=(*old.mean, 0.0),
        scale=(*old.scale, 1.0),
        coef=(*old.coef, 0.0),
    )
    assert refit_features(with_knn) == (*ANSWER_FEATURES, "knn_entropy")
