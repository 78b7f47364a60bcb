"""Answer kinds (issue 49): a token's kind, the neighbours' majority kind, what the confidence and the
ranking do with them."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.eval.calibration import Measured, kinds_left_out
from bertknn_search.output import render_answer, to_json
from bertknn_search.query.answer_kinds import KindSignals, KindTable, kind_of
from bertknn_search.query.confidence import Signals, assess, shipped
from bertknn_search.records import Answer, Confidence, Neighbors, Prediction

VOCAB = ["[PAD]", "[MASK]", "paris", "lyon", "1960", "1961", "april", ",", "12", "##ville", "may"]


def neighbors(values: list[int]) -> Neighbors:
    n = len(values)
    ints = np.zeros(n, dtype=np.int32)
    d = np.arange(n, dtype=np.float32)
    return Neighbors(d, np.asarray(values, np.int64), ["a"] * n, ints, ints.copy(), ints.copy())


@pytest.mark.parametrize(
    ("token", "kind"),
    [
        ("1960", "year"),
        ("2019", "year"),
        ("12", "number"),
        ("3,000", "number"),
        ("21st", "number"),
        ("3000", "number"),  # not a year the data holds
        ("April", "month"),
        ("may", "month"),
        (",", "punctuation"),
        ("##.", "punctuation"),
        ("[UNK]", "word"),
        ("paris", "word"),
        ("##ville", "word"),
    ],
)
def test_a_token_has_one_kind(token: str, kind: str) -> None:
    assert kind_of(token) == kind


def test_the_majority_kind_is_weighted_by_the_knn_probability() -> None:
    table = KindTable(VOCAB)
    values = np.array([4, 5, 4, 2])  # three years, one place
    # The place is nearest by far: its kNN weight outweighs the three years.
    heavy_place = table.signals(2, values, np.array([0.01, 0.01, 0.01, 1.0]))
    assert (heavy_place.kind, heavy_place.majority, heavy_place.agree) == ("word", "word", True)
    assert heavy_place.share == pytest.approx(1.0 / 1.03)
    even = table.signals(2, values, np.ones(4))
    assert (even.majority, even.agree, even.share) == ("year", False, 0.25)
    # A word of several wordpieces (a hashed key, outside the vocabulary) is a word.
    assert table.signals(2**40, values, np.ones(4)).kind == "word"


def test_bert_mass_on_the_kind_and_the_answer_where_there_is_a_head() -> None:
    table = KindTable(VOCAB)
    p_bert = np.zeros(len(VOCAB))
    p_bert[[4, 5, 2]] = [0.5, 0.2, 0.3]
    said = table.signals(4, np.array([4]), np.ones(1), p_bert)
    assert said.bert_share == pytest.approx(0.7) and said.bert_p == pytest.approx(0.5)
    assert table.signals(4, np.array([4]), np.ones(1)).bert_share is None


def test_same_kind_keeps_only_the_majority_kind() -> None:
    table = KindTable(VOCAB)
    p = np.array([0, 0, 0.1, 0.1, 0.5, 0.2, 0.05, 0.05, 0, 0, 0, 0.3])  # last: a word of several pieces
    kept = table.same_kind(p, "word")
    assert kept.argmax() == 11 and kept[4] == 0 and kept[2] == 0.1
    assert table.same_kind(p, "year").argmax() == 4
    assert table.same_kind(p, None) is p


def test_a_wrong_kind_answer_is_never_high_and_says_so() -> None:
    # Issue 49: 'lebanon' to "X (born [MASK])." was "high"; a year among place neighbours likewise.
    table = KindTable(VOCAB)
    nb = neighbors([4] * 3 + [2] * 12)  # the answer "1960" holds 3 votes; most neighbours hold places
    kinds = table.signals(4, nb.token_ids, np.ones(len(nb)))
    eager = dataclasses.replace(shipped(), high=0.0, medium=0.0)  # p alone would make it "high"
    ranking = [Prediction("1960", 4, 0.9), Prediction("paris", 2, 0.05)]
    wrong = assess(ranking, nb, False, None, eager, kinds, "shipped:x")
    assert wrong is not None and wrong.level == "medium"
    assert (wrong.kind, wrong.neighbours_kind, wrong.fit) == ("year", "word", "shipped:x")
    right = assess(
        ranking,
        neighbors([4] * 12 + [2] * 3),
        False,
        None,
        eager,
        table.signals(4, np.array([4] * 12 + [2] * 3), np.ones(15)),
    )
    assert right is not None and right.level == "high"
    answer = Answer(
        "X (born [MASK]).",
        None,
        [],
        ranking,
        None,
        ranking,
        [],
        n_neighbors=15,
        bert_available=False,
        confidence=wrong,
    )
    assert "the answer is a year but most neighbours hold a word" in render_answer(answer, 3)
    data = json.loads(to_json(answer))["confidence"]
    assert (data["kind"], data["neighbours_kind"]) == ("year", "word")


def test_no_json_body_carries_nan() -> None:
    # Issue 51.3: a NaN p was sent as HTTP 200 with NaN in the body, which JSON.parse rejects.
    bad = Answer(
        "Q [MASK].", None, [], [], None, [], [], 0, False, confidence=Confidence("low", float("nan"))
    )
    with pytest.raises(ValueError, match="not JSON compliant"):
        to_json(bad)


def test_kinds_left_out_scores_each_kind_by_a_fit_that_never_saw_it() -> None:
    rng = np.random.default_rng(3)
    rows = []
    for relation in ("P19", "P20", "P27", "P495", "P569"):
        for i in range(120):
            votes = int(rng.integers(1, 40))
            agrees = relation != "P569" or rng.random() < 0.5
            found = Signals(
                0.3,
                0.1,
                votes,
                40,
                votes / 40,
                True,
                0.5,
                1.0,
                40,
                1.0,
                KindSignals(
                    kind="year" if relation == "P569" else "word",
                    majority="year" if agrees == (relation == "P569") else "word",
                ),
            )
            hit = bool(rng.random() < (votes / 50 if found.kind_agrees else 0.0))
            rows.append(Measured(f"{relation}/{i}", relation, found, hit))
    p, fits = kinds_left_out(rows)
    assert set(fits) == {"places", "countries", "dates"}
    dates = [i for i, r in enumerate(rows) if r.relation == "P569"]
    assert p[dates] == pytest.approx(fits["dates"].probability([rows[i].signals for i in dates]))
    assert len(p) == len(rows) and ((p >= 0) & (p <= 1)).all()


def test_query_same_kind_ranks_only_the_neighbours_kind(built_index: Config) -> None:
    ask = ["query", "Zorblat was born in [MASK].", "--subject", "Zorblat", "--index", str(built_index.index)]
    r = CliRunner().invoke(main, [*ask, "--same-kind", "--json"], catch_exceptions=False)
    data = json.loads(r.output)
    conf = data["confidence"]
    assert r.exit_code == 0 and conf["kind"] == conf["neighbours_kind"]
    assert all(kind_of(p["word"]) == conf["neighbours_kind"] for p in data["bert_knn"] if p["prob"] > 0)
