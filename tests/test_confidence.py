"""Answer confidence: the band mapping, the score an answer gets, and where it shows (JSON, text, client)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.eval.calibration import auc, bands, calibrate, fit, held_out
from bertknn_search.output import render_answer, render_coverage, to_json
from bertknn_search.query.confidence import HIGH, LEVELS, MEDIUM, assess, level, signals
from bertknn_search.query.search import Searcher
from bertknn_search.records import Answer, ArticleHit, Confidence, Coverage, Neighbors, Prediction, Question
from bertknn_search.server.client import answer_from_json


def neighbors(values: list[int], distances: list[float] | None = None) -> Neighbors:
    n = len(values)
    ints = np.zeros(n, dtype=np.int32)
    d = np.asarray(distances if distances is not None else np.arange(n, dtype=float), np.float32)
    return Neighbors(d, np.asarray(values, np.int64), ["a"] * n, ints, ints.copy(), ints.copy())


def answer(conf: Confidence | None, n: int = 20, **more: object) -> Answer:
    ranking = [Prediction("paris", 7, 0.03), Prediction("lyon", 8, 0.02)]
    fields: dict[str, object] = {"articles": [], **more}
    return Answer(
        "Q [MASK].",
        None,
        bert_knn=ranking,
        bert=None,
        knn=ranking,
        evidence=[],
        n_neighbors=n,
        bert_available=False,
        confidence=conf,
        **fields,
    )  # type: ignore[arg-type]


# -- the bands ---------------------------------------------------------------------------------------
def test_the_band_never_falls_as_the_score_rises() -> None:
    assert 0.0 < MEDIUM < HIGH <= 1.0
    scores = np.linspace(0.0, 1.0, 201)
    ranks = [LEVELS.index(level(float(s))) for s in scores]
    assert ranks == sorted(ranks)
    assert {level(float(s)) for s in scores} == set(LEVELS)
    assert (level(MEDIUM), level(HIGH), level(math.nextafter(MEDIUM, 0.0))) == ("medium", "high", "low")


def test_the_score_is_the_share_of_neighbours_holding_the_top_answer() -> None:
    ranking = [Prediction("paris", 7, 0.5), Prediction("lyon", 8, 0.2)]
    nb = neighbors([7, 7, 8, 9, 7, 9, 9, 9], [3.0, 1.0, 2.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    found = signals(ranking, nb)
    assert (found.votes, found.nearest, found.agree, found.neighbors) == (3 / 8, 1.0, True, 8)
    assert found.margin == pytest.approx(0.3) and found.distinct == 3 / 8
    conf = assess(ranking, nb, bert_available=False)
    assert conf == Confidence(level(3 / 8), 0.375)


def test_an_answer_without_neighbours_is_bert_alone_or_no_answer() -> None:
    ranking = [Prediction("paris", 7, 0.6)]
    assert assess(ranking, Neighbors.empty(), bert_available=True) == Confidence(level(0.6), 0.6)
    # No head and no neighbour: the ranking is all zeros, no answer was computed.
    assert assess([Prediction("x", 1, 0.0)], Neighbors.empty(), bert_available=False) is None


# -- where it shows ----------------------------------------------------------------------------------
def test_every_answer_has_a_confidence_in_its_json(searcher: Searcher, facts: list[Fact]) -> None:
    questions = [Question(f"{f.person.title()} was born in [MASK].", f.person.title()) for f in facts[:3]]
    for a, s in zip(searcher.answer_batch(questions), searcher.score_batch(questions)):
        share = float(np.mean(s.neighbors.token_ids == a.bert_knn[0].token_id))
        assert share > 0  # the subject's own sentence votes for its city
        assert a.confidence == Confidence(level(share), round(share, 4))
        data = json.loads(to_json(a))
        assert data["confidence"] == {"level": a.confidence.level, "score": a.confidence.score}
        assert answer_from_json(data) == a  # the client reads it back


def test_query_prints_the_confidence_in_text_and_json(built_index: Config) -> None:
    common = ["Zorblat was born in [MASK].", "--subject", "Zorblat", "--index", str(built_index.index)]
    r = CliRunner().invoke(main, ["query", *common, "--json"], catch_exceptions=False)
    conf = json.loads(r.output)["confidence"]
    assert set(conf) == {"level", "score"} and conf["level"] in LEVELS
    r = CliRunner().invoke(main, ["query", *common], catch_exceptions=False)
    assert r.exit_code == 0 and f"confidence: {conf['level']} ({conf['score']:.2f}: " in r.output


def test_a_low_confidence_answer_is_marked_and_a_high_one_is_not() -> None:
    low = render_answer(answer(Confidence("low", 0.05)), 2)
    assert (
        "confidence: low (0.05: 1 of 20 neighbours holds 'paris'); a low-confidence answer is mostly" in low
    )
    high = render_answer(answer(Confidence("high", 0.5)), 2)
    assert "confidence: high (0.50: 10 of 20 neighbours hold 'paris')\n" in high + "\n"
    assert "mostly wrong" not in high
    alone = render_answer(answer(Confidence("medium", 0.2), n=0), 2)
    assert "confidence: medium (0.20: BERT's top-1 probability; no neighbours)" in alone
    assert "confidence" not in render_answer(answer(None), 2)


def test_a_partial_answer_does_not_promise_that_more_contexts_make_it_better() -> None:
    partial = answer(
        Confidence("low", 0.05),
        articles=[ArticleHit("1", "Lincoln", math.inf)],
        coverage={"1": Coverage(64, 900)},
    )
    line = render_coverage(partial)
    assert line.startswith("partial answer: contexts encoded so far of 'Lincoln' 64 of 900")
    assert "not always for the better" in line and "encodes more" not in line


# -- calibration -------------------------------------------------------------------------------------
def test_auc_counts_right_answers_ranked_above_wrong_ones() -> None:
    assert auc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert auc([0.1, 0.2, 0.9, 0.8], [True, True, False, False]) == 0.0
    assert auc([0.5, 0.5], [True, False]) == 0.5
    assert auc([0.5, 0.6], [True, True]) is None


def test_bands_are_fitted_where_the_hit_rate_changes() -> None:
    scores = [i / 100 for i in range(100)]
    hits = [s >= 0.6 for s in scores]  # right exactly from 0.6 up
    high, medium = fit(scores, hits, min_share=0.15)
    table = bands(scores, hits, high, medium)
    assert table["high"]["P@1"] == 1.0 and table["low"]["P@1"] == 0.0
    assert sum(row["answers"] for row in table.values()) == 100


def test_the_split_is_by_fact_and_the_same_on_every_run() -> None:
    keys = [f"T-REx/P19/{i}" for i in range(400)]
    first = [held_out(k) for k in keys]
    assert first == [held_out(k) for k in keys] and 150 < sum(first) < 250
    assert calibrate([])["answers"] == {"calibration": 0, "held_out": 0}
