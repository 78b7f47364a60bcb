"""Answer confidence: p from the signals, the bands, where it shows (JSON, text, client), and its fit."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.errors import ConfigError
from bertknn_search.eval.calibration import (
    BERT_ALONE_FEATURES,
    Measured,
    bert_alone_rows,
    calibrate,
    choose_bands,
    fit,
    left_out,
    logistic,
)
from bertknn_search.eval.reliability import auc, ece, reliability
from bertknn_search.output import render_answer, render_coverage, to_json
from bertknn_search.query.confidence import (
    FIT_FILE,
    LEVELS,
    MIN_HIGH_VOTES,
    Fit,
    Signals,
    assess,
    fit_for,
    shipped,
    signals,
)
from bertknn_search.query.search import Searcher
from bertknn_search.query.signals_json import signals_from_json, signals_json
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


RANKING = [Prediction("paris", 7, 0.5), Prediction("lyon", 8, 0.2)]


# -- the signals and p -------------------------------------------------------------------------------
def test_the_signals_count_votes_neighbours_and_coverage() -> None:
    nb = neighbors([7, 7, 8, 9, 7, 9, 9, 9], [3.0, 1.0, 2.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    found = signals(RANKING, nb, {"a": Coverage(8, 32), "b": Coverage(8, 8)})
    assert (found.votes, found.neighbors, found.nearest, found.agree) == (3, 8, 1.0, True)
    assert found.margin == pytest.approx(0.3) and found.distinct == 3 / 8 and found.share == 3 / 8
    assert (found.contexts, found.coverage, found.partial) == (40, 16 / 40, True)
    whole = signals(RANKING, nb)  # an eager index: the articles are whole, their size is what was found
    assert (whole.contexts, whole.coverage, whole.partial) == (8, 1.0, False)
    assert signals_from_json(json.loads(json.dumps(signals_json(found)))) == found


def test_p_is_a_probability_that_grows_with_the_votes() -> None:
    ps = []
    for votes in range(1, 20):
        nb = neighbors([7] * votes + [9] * (20 - votes))
        conf = assess(RANKING, nb, bert_available=False)
        assert conf is not None and 0.0 <= conf.p <= 1.0
        assert (conf.votes, conf.neighbours) == (votes, 20)
        ps.append(conf.p)
    assert ps == sorted(ps) and ps[-1] > ps[0]


def test_one_neighbour_holding_the_answer_is_never_high() -> None:
    # Issue 39: "confidence: high (1.00: 1 of 1 neighbours holds ...)" on nearly every starved answer.
    conf = assess(RANKING, neighbors([7]), bert_available=False)
    assert conf is not None and conf.level != "high" and conf.p < shipped().high
    # Even where the fit puts p above "high", one vote is not enough.
    eager = dataclasses.replace(shipped(), high=0.0, medium=0.0)
    one = assess(RANKING, neighbors([7, 9, 9]), False, None, eager)
    two = assess(RANKING, neighbors([7, 7, 9]), False, None, eager)
    assert (one.level, two.level) == ("medium", "high") and MIN_HIGH_VOTES == 2  # type: ignore[union-attr]


def test_a_partial_answer_has_a_lower_p_than_the_same_answer_whole() -> None:
    nb = neighbors([7] * 6 + [9] * 10)
    whole = assess(RANKING, nb, False, {"a": Coverage(16, 16)})
    part = assess(RANKING, nb, False, {"a": Coverage(16, 400)})
    assert whole is not None and part is not None and part.p < whole.p


def test_an_answer_without_neighbours_is_bert_alone_or_no_answer() -> None:
    alone = assess([Prediction("paris", 7, 0.6)], Neighbors.empty(), bert_available=True)
    assert alone == Confidence("medium" if shipped().medium <= 0.6 else "low", 0.6, 0, 0)
    # No head and no neighbour: the ranking is all zeros, no answer was computed.
    assert assess([Prediction("x", 1, 0.0)], Neighbors.empty(), bert_available=False) is None


def test_the_band_never_falls_as_p_rises() -> None:
    model = shipped()
    assert 0.0 < model.medium < model.high < 1.0
    ranks = [LEVELS.index(model.level(float(p), 5, True, kind="word")) for p in np.linspace(0.0, 1.0, 201)]
    assert ranks == sorted(ranks) and set(ranks) == {0, 1, 2}


# -- the fit ----------------------------------------------------------------------------------------
def synthetic(relations: int = 4, per: int = 150, seed: int = 0) -> list[Measured]:
    """Answers whose chance of being right rises with their votes (a logistic truth)."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(relations):
        for i in range(per):
            n = int(rng.integers(3, 60))
            votes = int(rng.integers(1, n + 1))
            truth = 1 / (1 + math.exp(-(2.0 * math.log1p(votes) - 4.0)))
            found = Signals(0.3, 0.1, votes, n, votes / n, True, 0.5, 1.0, n, 1.0)
            rows.append(Measured(f"R{r}/{i}", f"R{r}", found, bool(rng.random() < truth)))
    return rows


def test_logistic_regression_finds_the_weights() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4000, 2))
    y = (rng.random(4000) < 1 / (1 + np.exp(-(1.5 * x[:, 0] - 0.5)))).astype(float)
    coef, intercept = logistic(x, y, l2=0.0)
    assert coef[0] == pytest.approx(1.5, abs=0.15) and abs(coef[1]) < 0.15
    assert intercept == pytest.approx(-0.5, abs=0.15)


def test_bert_alone_rows_read_berts_own_answer_from_a_checkpoint() -> None:
    said = signals_json(Signals(0.4, 0.2, 7, 30, 0.5, True, 0.3, 1.0, 30, 1.0))
    said |= {"majority": "word"}
    line = {"key": "T/P19/1", "relation": "P19", "neighbors": 30, "signals": {"top1": 0.6}}
    lines = [
        line
        | {"ranks": {"bert": 1, "bert_knn": 1}, "top": {"bert": ["paris"], "bert_knn": ["paris"]}}
        | {"confidence_signals": said},
        line
        | {
            "key": "T/P19/2",
            "ranks": {"bert": 2, "bert_knn": 1},
            "top": {"bert": ["1960"], "bert_knn": ["rome"]},
        }
        | {"confidence_signals": said},
        line | {"key": "T/P19/3", "skipped": "no article", "ranks": {}},
        line
        | {"key": "T/P19/4", "ranks": {"knn": 1, "bert_knn": 1}, "top": {"knn": ["x"], "bert_knn": ["x"]}},
    ]
    same, other = bert_alone_rows(lines)
    assert (same.hit, same.signals.top1, same.signals.votes, same.signals.kind_agrees) == (True, 0.6, 7, True)
    # BERT put another word first than BERT-kNN: its votes are unknown (0), its kind is its own word's.
    assert (other.hit, other.signals.votes, other.signals.kind, other.signals.majority) == (
        False,
        0,
        "year",
        "word",
    )
    assert fit([same, other] * 3, ("top1", "kind_agree")).features == BERT_ALONE_FEATURES


def test_a_top1_fit_gives_the_answers_own_probability_and_round_trips() -> None:
    alone = Fit((), (), (), (), 0.0, 0.5, 0.05, {"model": "m"}, p_from="top1")
    rows = [Signals(t, 0.0, 3, 9, 0.3, True, 0.2, 1.0, 9, 1.0) for t in (0.02, 0.3, 0.9)]
    assert alone.probability(rows).tolist() == [0.02, 0.3, 0.9]
    assert [alone.level(p, 3, True, kind="word") for p in (0.02, 0.3, 0.9)] == ["low", "medium", "high"]
    assert Fit.from_json(alone.as_json(), "test") == alone
    assert Fit.from_json({k: v for k, v in shipped().as_json().items() if k != "p_from"}, "t").p_from == "fit"
    with pytest.raises(ConfigError, match="p_from 'bert'"):
        Fit.from_json({**alone.as_json(), "p_from": "bert"}, "test")


def test_each_relation_is_scored_by_a_fit_that_never_saw_it() -> None:
    rows = synthetic()
    p = left_out(rows)
    # Whatever relation R0's answers say, their left-out p stays: no answer of R0 was in their fit.
    flipped = [dataclasses.replace(r, hit=not r.hit) if r.relation == "R0" else r for r in rows]
    again = left_out(flipped)
    mine = np.array([r.relation == "R0" for r in rows])
    assert np.allclose(p[mine], again[mine]) and not np.allclose(p[~mine], again[~mine])


def test_a_fit_of_a_logistic_truth_is_calibrated_on_left_out_relations() -> None:
    rows = synthetic(relations=5, per=400)
    model, check = calibrate(rows)
    head = check["left_out"]
    assert head["ece"] < 0.05 and head["auroc"] > 0.7 and head["high_on_one_vote"] == 0
    assert head["bands"]["high"]["P@1"] > 2 * head["bands"]["low"]["P@1"]
    assert set(check["relations"]) == {f"R{i}" for i in range(5)}
    assert model.about["relations"] == sorted(check["relations"]) and model.high == check["bands"]["high"]
    with pytest.raises(ValueError, match="two relations"):
        calibrate([r for r in rows if r.relation == "R0"])


def test_calibrate_keeps_the_bands_promises_on_partial_answers_too() -> None:
    """ "Low" is cut on every answer, partial ones included, and "high" on whole ones: partial answers
    whose low coverage makes their p low although they are often right (BERT-kNN's, whose BERT part
    sees the whole question) must not make "low" a band of right answers."""
    rows = synthetic(relations=5, per=300)
    rng = np.random.default_rng(3)
    for r in range(5):
        for i in range(150):
            n = int(rng.integers(3, 20))
            found = Signals(0.3, 0.1, 1, n, 1 / n, True, 0.5, 1.0, 10 * n, 0.05)  # 1 vote, 5% seen
            # Right 2 times in 100 in four relations, 4 in 10 in the fifth: its left-out p is too low.
            rows.append(
                Measured(f"R{r}/partial{i}", f"R{r}", found, bool(rng.random() < (0.4 if r == 4 else 0.02)))
            )
    model, _ = calibrate(rows)
    p = left_out(rows)
    hits = np.array([r.hit for r in rows])
    partial = np.array([r.signals.partial for r in rows])
    assert partial.any() and hits[partial].mean() > 0.05
    low = p < model.medium
    assert not low.any() or hits[low].mean() <= 0.05  # on all answers, the partial ones among them
    high = (p >= model.high) & ~partial & np.array([r.signals.votes >= MIN_HIGH_VOTES for r in rows])
    assert high.any() and hits[high].mean() >= 0.5
    # Cut on whole answers alone, "low" would take in partial answers that are right more than 1 in 20.
    whole_only, _ = calibrate([r for r in rows if not r.signals.partial])
    under = partial & (p < whole_only.medium)
    assert under.any() and hits[under].mean() > 0.05


def test_bands_ece_and_auc() -> None:
    assert auc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert auc([0.5, 0.5], [True, False]) == 0.5 and auc([0.5, 0.6], [True, True]) is None
    p = [0.05] * 100 + [0.95] * 100
    hits = [i < 5 for i in range(100)] + [i < 95 for i in range(100)]
    assert ece(p, hits) == pytest.approx(0.0) and ece([0.9] * 10, [False] * 10) == pytest.approx(0.9)
    assert [(b["answers"], b["low"]) for b in reliability(p, hits)] == [(100, 0.0), (100, 0.9)]


def test_bands_are_probabilities_checked_on_left_out_answers() -> None:
    # A calibrated p (each answer right with its own p): the bands are p < 0.05 and p >= 0.5 themselves.
    p = np.repeat(np.arange(1, 100) / 100, 100)
    hits = np.concatenate([np.arange(100) < round(x * 100) for x in np.arange(1, 100) / 100])
    assert choose_bands(p, hits) == (0.5, 0.05)
    # The bottom right more often than p says: "low" shrinks until the answers under it are right <= 5%.
    wrong_low = hits | ((p == 0.03) & (np.arange(len(p)) % 100 < 40))
    assert choose_bands(p, wrong_low) == (0.5, 0.03)
    # A strong model: nearly everything right; "low" may hold nothing, "high" stays p >= 0.5.
    high, medium = choose_bands(p, np.ones(len(p), dtype=bool))
    assert high == 0.5 and not (p < medium).any()
    # The top right less often than p says: "high" rises until the answers at or above it are right
    # half the time; only the answers that may be "high" (eligible) count.
    over_sure = hits & ~((p >= 0.5) & (p < 0.8))
    high, _ = choose_bands(p, over_sure)
    assert high > 0.5 and over_sure[p >= high].mean() >= 0.5
    assert over_sure[p >= high - 0.01].mean() < 0.5
    eligible = p >= 0.8  # the over-sure answers never may be "high": they do not pull the cut up
    assert choose_bands(p, over_sure, eligible)[0] == 0.5
    # No left-out answer right enough anywhere: no cut is "high" by the data, none is "low" by force.
    assert choose_bands([0.6, 0.7], [False, False]) == (0.71, 0.05)
    assert choose_bands([], []) == (0.5, 0.05)


def test_a_fit_round_trips_and_a_bad_one_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = fit(synthetic(), bands=(0.3, 0.1), about={"model": "m"})
    path = model.save(tmp_path / FIT_FILE)
    assert Fit.read(path) == model and fit_for(tmp_path) == model
    assert fit_for(tmp_path / "nothing-here") == shipped()
    path.write_text('{"format": 1, "features": ["votes_of_mars"]}')
    with pytest.raises(ConfigError, match="is refused"):
        fit_for(tmp_path)


# -- where it shows ----------------------------------------------------------------------------------
def test_every_answer_has_a_confidence_in_its_json(searcher: Searcher, facts: list[Fact]) -> None:
    questions = [Question(f"{f.person.title()} was born in [MASK].", f.person.title()) for f in facts[:3]]
    for a, s in zip(searcher.answer_batch(questions), searcher.score_batch(questions)):
        votes = int(np.sum(s.neighbors.token_ids == a.bert_knn[0].token_id))
        assert votes > 0  # the subject's own sentence votes for its city
        assert a.confidence is not None and (a.confidence.votes, a.confidence.neighbours) == (
            votes,
            len(s.neighbors),
        )
        data = json.loads(to_json(a))
        assert data["confidence"] == {
            "level": a.confidence.level,
            "p": a.confidence.p,
            "votes": votes,
            "neighbours": len(s.neighbors),
            "kind": "word",  # a city, and the neighbours hold cities
            "neighbours_kind": "word",
            "fit": "shipped:confidence_fit_bert_knn.json",  # tiny BERT has a head: BERT-kNN's fit
        }
        assert answer_from_json(data) == a  # the client reads it back


def test_query_prints_the_confidence_in_text_and_json(built_index: Config) -> None:
    common = ["Zorblat was born in [MASK].", "--subject", "Zorblat", "--index", str(built_index.index)]
    r = CliRunner().invoke(main, ["query", *common, "--json"], catch_exceptions=False)
    conf = json.loads(r.output)["confidence"]
    assert set(conf) == {"level", "p", "votes", "neighbours", "kind", "neighbours_kind", "fit"}
    assert conf["level"] in LEVELS
    assert isinstance(conf["votes"], int) and isinstance(conf["neighbours"], int)
    r = CliRunner().invoke(main, ["query", *common], catch_exceptions=False)
    said = (
        f"confidence: {conf['level']} (p {conf['p']:.2f}: {conf['votes']} of {conf['neighbours']} neighbours"
    )
    assert r.exit_code == 0 and said in r.output


def test_the_text_line_says_p_and_the_votes_and_marks_a_low_answer() -> None:
    low = render_answer(answer(Confidence("low", 0.03, 1, 20)), 2)
    assert (
        "confidence: low (p 0.03: 1 of 20 neighbours holds 'paris'); a low-confidence answer is mostly" in low
    )
    high = render_answer(answer(Confidence("high", 0.5, 10, 20)), 2)
    assert "confidence: high (p 0.50: 10 of 20 neighbours hold 'paris')\n" in high + "\n"
    assert "mostly wrong" not in high
    none = render_answer(answer(Confidence("low", 0.0, 0, 20)), 2)
    assert "confidence: low (p 0.00: 0 of 20 neighbours hold 'paris': BERT's answer alone);" in none
    assert "BERT's answer alone" not in low + high
    alone = render_answer(answer(Confidence("medium", 0.2), n=0), 2)
    assert "confidence: medium (p 0.20: BERT's top-1 probability; no neighbours)" in alone
    assert "confidence" not in render_answer(answer(None), 2)
    part = answer(
        Confidence("medium", 0.12, 3, 16),
        articles=[ArticleHit("1", "X", math.inf)],
        coverage={"1": Coverage(16, 400)},
    )
    assert (
        "confidence: medium (p 0.12: 3 of 16 neighbours hold 'paris'), of part of its articles"
        in render_answer(part, 2)
    )


def test_a_partial_answer_does_not_promise_that_more_contexts_make_it_better() -> None:
    partial = answer(
        Confidence("low", 0.05, 1, 20),
        articles=[ArticleHit("1", "Lincoln", math.inf)],
        coverage={"1": Coverage(64, 900)},
    )
    line = render_coverage(partial)
    assert line.startswith("partial answer: contexts encoded so far of 'Lincoln' 64 of 900")
    assert "not always for the better" in line and "encodes more" not in line
