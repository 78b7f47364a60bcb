"""Kinds of answer a fit never calls "low" (issue 49): kNN alone cannot tell a question that wants a year
from one that does not, and a right year to a date question then gets a low ``p`` though its neighbours
mostly hold words; "low" promises "right at most 1 time in 20", which such a ``p`` cannot keep."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from bertknn_search.errors import ConfigError
from bertknn_search.eval.calibration import Measured, calibrate, left_out
from bertknn_search.eval.index_calibration import (
    NO_HEAD_NEVER_LOW,
    never_low_kinds,
    refit_features,
    write_calibration,
)
from bertknn_search.query.answer_kinds import KindSignals
from bertknn_search.query.confidence import (
    ANSWER_FEATURES,
    WORD_FEATURES,
    Fit,
    Signals,
    describe_fit,
    judge,
    shipped,
)
from tests.test_confidence import synthetic


def _year(votes: int = 1, n: int = 20, majority: str = "word") -> Signals:
    kinds = KindSignals(kind="year", majority=majority, share=0.3 if majority != "year" else 1.0)
    return Signals(0.3, 0.1, votes, n, votes / n, True, 0.5, 1.0, n, 1.0, kinds)


def test_a_kind_never_low_is_medium_however_low_p_is() -> None:
    fit = dataclasses.replace(shipped("confidence_fit_bert_knn.json"), never_low=("year",))
    assert fit.level(0.001, 1, False, kind="year") == "medium"
    assert fit.level(0.001, 1, True, kind="word") == "low"
    assert fit.level(0.99, 5, False, kind="year") == "medium"  # and still never "high" against its neighbours
    as_json = json.loads(json.dumps(fit.as_json()))
    assert Fit.from_json(as_json, "test").never_low == ("year",)
    with pytest.raises(ConfigError, match="never_low"):
        Fit.from_json({**as_json, "never_low": ["dates"]}, "test")
    assert Fit.from_json({k: v for k, v in as_json.items() if k != "never_low"}, "old").never_low == ()


def test_minilms_shipped_fit_never_calls_a_year_or_a_month_low_and_bert_knns_does() -> None:
    minilm, bert_knn = shipped("confidence_fit.json"), shipped("confidence_fit_bert_knn.json")
    assert set(minilm.never_low) == set(NO_HEAD_NEVER_LOW) == {"year", "month"}
    assert bert_knn.never_low == ()
    # `stats` says so
    assert describe_fit(None, "all-minilm-l6-v2", "knn").endswith("never low: year, month)")
    assert "never low" not in describe_fit(None, "bert-base-uncased", "interpolated")
    strict = dataclasses.replace(minilm, medium=0.9, high=1.0)  # every p here is under "medium"
    said = judge(_year(), False, strict)
    assert said is not None and said.p < strict.medium and said.level == "medium"
    low = judge(dataclasses.replace(_year(), kinds=KindSignals(share=0.3)), False, strict)
    assert low is not None and low.level == "low"


def test_the_low_cut_is_chosen_on_the_answers_that_may_be_low() -> None:
    """Years that look like the rarely right answers with one vote of many, never right in four
    relations and right 6 times in 10 in the fifth (a date relation: nothing in the signals tells it):
    scored by fits without their relation, they drag the "low" cut down; never "low", the cut is chosen
    on the others and keeps its promise there."""
    rows = synthetic(relations=5, per=300)
    rng = np.random.default_rng(5)
    word = dataclasses.replace(_year(1, 59, majority="year"), kinds=KindSignals())
    for r in range(5):
        for i in range(40):
            rows.append(Measured(f"R{r}/word{i}", f"R{r}", word, bool(rng.random() < 0.02)))
        for i in range(20):
            right = bool(rng.random() < (0.6 if r == 4 else 0.0))
            rows.append(Measured(f"R{r}/year{i}", f"R{r}", _year(1, 59, majority="year"), right))
    plain, _ = calibrate(rows)
    kept, check = calibrate(rows, never_low=("year",))
    assert kept.never_low == ("year",) and check["bands"]["never_low"] == ["year"]
    assert kept.medium > plain.medium
    p = left_out(rows)
    hits = np.array([r.hit for r in rows])
    may = np.array([r.signals.kind != "year" for r in rows])
    low = (p < kept.medium) & may
    assert low.any() and hits[low].mean() <= 0.05
    assert hits[(p < kept.medium) & ~may].mean() > 0.05  # what "low" would have held
    assert check["left_out"]["bands"]["low"]["answers"] == int(low.sum())


def test_a_refit_keeps_the_fits_choices_and_a_model_without_a_head_gets_the_words_and_the_kinds() -> None:
    minilm, bert_knn = shipped("confidence_fit.json"), shipped("confidence_fit_bert_knn.json")
    assert "common_word" in refit_features(minilm, with_head=False)
    assert "common_word" not in refit_features(bert_knn) and "knn_entropy" in refit_features(bert_knn)
    # a model with a head answering by kNN alone falls back to MiniLM's fit: it reads no word frequency
    assert refit_features(minilm, with_head=True) == ANSWER_FEATURES
    assert refit_features(None, with_head=False) == (*ANSWER_FEATURES, *WORD_FEATURES)
    assert refit_features(None) == ANSWER_FEATURES
    # a fit stored before the word input gains it for a model without a head
    n = len(ANSWER_FEATURES)
    assert minilm.features[:n] == ANSWER_FEATURES
    cut = {f: getattr(minilm, f)[:n] for f in ("features", "mean", "scale", "coef", "lower", "upper")}
    old = dataclasses.replace(minilm, **cut, never_low=())
    assert "common_word" in refit_features(old, with_head=False)
    assert never_low_kinds(False) == NO_HEAD_NEVER_LOW and never_low_kinds(True) == ()


def test_eval_calibrate_stores_the_kinds_with_a_fit_for_a_model_without_a_head(tmp_path: Path) -> None:
    """Lines of a model without an MLM head (no ``bert_p``): the stored fit never calls a year "low"."""
    rng = np.random.default_rng(2)
    lines = []
    for i in range(600):
        votes = int(rng.integers(1, 8))
        year = i % 5 == 0
        said = {
            **{"top1": 0.1 + 0.05 * votes, "margin": 0.05, "votes": votes, "neighbors": 20},
            **{"near_votes": votes / 20, "agree": bool(i % 2), "distinct": 0.5, "nearest": 10.0},
            **{"contexts": 20, "coverage": 1.0, "kind": "year" if year else "word", "majority": "word"},
            **{"kind_share": 0.3 if year else 1.0, "word_zipf": None},
        }
        right = bool(rng.random() < (0.4 if year else 0.05 * votes))
        lines.append(
            {
                "key": f"T-REx/P{i % 6}/{i}",
                "relation": f"P{i % 6}",
                "ranks": {"bert_knn": 1 if right else None},
                "skipped": None,
                "confidence_signals": said,
            }
        )
    checkpoint = tmp_path / "facts.jsonl"
    checkpoint.write_text("".join(json.dumps(line) + "\n" for line in lines))
    (tmp_path / "out").mkdir()
    made, check = write_calibration(checkpoint, tmp_path / "out", "no-head", None, None)
    assert made.never_low == NO_HEAD_NEVER_LOW and "common_word" in made.features
    assert check["bands"]["never_low"] == list(NO_HEAD_NEVER_LOW)
    report = (tmp_path / "out" / "calibration.md").read_text()
    assert "Never low: answers that are a year or a month." in report
