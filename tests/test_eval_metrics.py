"""Tests for eval.metrics: P@k, LAMA's macro average, skipped facts and popularity buckets."""

from __future__ import annotations

import math

import pytest

from bertknn_search.errors import ConfigError
from bertknn_search.eval.metrics import (
    NO_ARTICLE,
    Bucket,
    FactResult,
    Score,
    adaptive_thresholds,
    first_gold_rank,
    macro_average,
    popularity_buckets,
    precision_at_k,
)


def row(
    corpus: str, relation: str, uuid: str, bert: int | None, knn: int | None, both: int | None, **kw
) -> FactResult:
    return FactResult(corpus, relation, uuid, {"bert": bert, "knn": knn, "bert_knn": both}, **kw)


def test_precision_at_k_uses_the_given_order_for_ties():
    # "paris" and "lyon" may share a probability; the ranking list already broke the tie.
    ranked = ["lyon", "paris", "nice"]
    assert [precision_at_k(ranked, {"paris"}, k) for k in (1, 2, 3, 10)] == [0.0, 1.0, 1.0, 1.0]
    assert precision_at_k(ranked, {"rome", "nice"}, 3) == 1.0
    assert precision_at_k([], {"paris"}, 1) == 0.0
    assert first_gold_rank(ranked, {"nice", "paris"}) == 2
    assert first_gold_rank(ranked, {"rome"}) is None


def test_precision_at_k_rejects_k_below_one():
    with pytest.raises(ConfigError, match="k must be >= 1"):
        precision_at_k(["a"], {"a"}, 0)


def test_macro_average_weights_relations_equally():
    rows = [
        row("T-REx", "P19", "a", 1, 2, 1),
        row("T-REx", "P19", "b", 1, None, 6),
        row("T-REx", "P19", "c", 1, 11, 1),
        row("T-REx", "P20", "d", None, 1, 3),
    ]
    result = macro_average(rows)
    assert result.relations == [
        Score(
            "P19",
            "T-REx",
            3,
            3,
            1,
            {},
            0,
            {
                "bert": {1: 1.0, 5: 1.0, 10: 1.0},
                "knn": {1: 0.0, 5: 1 / 3, 10: 1 / 3},
                "bert_knn": {1: 2 / 3, 5: 2 / 3, 10: 1.0},
            },
        ),
        Score(
            "P20",
            "T-REx",
            1,
            1,
            1,
            {},
            0,
            {
                "bert": {1: 0.0, 5: 0.0, 10: 0.0},
                "knn": {1: 1.0, 5: 1.0, 10: 1.0},
                "bert_knn": {1: 0.0, 5: 1.0, 10: 1.0},
            },
        ),
    ]
    # Macro: (1 + 0) / 2 = 0.5 for BERT P@1; the micro average would be 3/4.
    trex = result.corpora[0]
    assert trex == Score(
        "T-REx",
        "T-REx",
        4,
        4,
        2,
        {},
        0,
        {
            "bert": {1: 0.5, 5: 0.5, 10: 0.5},
            "knn": {1: 0.5, 5: 2 / 3, 10: 2 / 3},
            "bert_knn": {1: 1 / 3, 5: (2 / 3 + 1) / 2, 10: 1.0},
        },
    )
    assert result.aggregates == [Score("LAMA", "T-REx", 4, 4, 2, {}, 0, trex.precision)]
    assert result.popularity == []


def test_lama_aggregate_spans_trex_and_google_re_but_not_squad():
    rows = [
        row("T-REx", "P19", "a", 1, 1, 1),
        row("Google-RE", "place_of_birth", "b", None, None, None),
        row("Google-RE", "place_of_death", "c", None, None, None),
        row("SQuAD", "SQuAD", "d", 1, 1, 1),
    ]
    result = macro_average(rows, models=["bert"], ks=[1])
    assert [(s.name, s.relations, s.precision) for s in result.corpora] == [
        ("T-REx", 1, {"bert": {1: 1.0}}),
        ("Google-RE", 2, {"bert": {1: 0.0}}),
        ("SQuAD", 1, {"bert": {1: 1.0}}),
    ]
    # Three relations: (1 + 0 + 0) / 3, not the mean of the two corpus means.
    assert result.aggregates == [Score("LAMA", "T-REx+Google-RE", 3, 3, 3, {}, 0, {"bert": {1: 1 / 3}})]


def test_skipped_facts_are_counted_not_wrong():
    rows = [
        row("T-REx", "P19", "a", 1, 1, 1),
        FactResult("T-REx", "P19", "b", skipped="multi-token-answer"),
        row("T-REx", "P19", "c", 1, None, 1, skipped=NO_ARTICLE),
        FactResult("T-REx", "P19", "d", skipped="multi-token-answer"),
    ]
    result = macro_average(rows, models=["bert", "knn"], ks=[1])
    assert result.relations == [
        Score(
            "P19",
            "T-REx",
            4,
            1,
            1,
            {"multi-token-answer": 2, NO_ARTICLE: 1},
            1,
            {"bert": {1: 1.0}, "knn": {1: 1.0}},
        )
    ]
    # The reference code's convention: a fact without retrieved context is wrong for every model.
    wrong = macro_average(rows, models=["bert", "knn"], ks=[1], no_article_wrong=True)
    assert wrong.relations == [
        Score("P19", "T-REx", 4, 2, 1, {"multi-token-answer": 2}, 1, {"bert": {1: 0.5}, "knn": {1: 0.5}})
    ]


def test_relation_without_scored_facts_is_reported_and_left_out_of_the_mean():
    rows = [
        row("T-REx", "P19", "a", 1, 1, 1),
        FactResult("T-REx", "P20", "b", skipped="multi-token-answer"),
    ]
    result = macro_average(rows, models=["bert"], ks=[1])
    assert result.relations[1] == Score("P20", "T-REx", 1, 0, 0, {"multi-token-answer": 1}, 0, {})
    assert result.corpora == [
        Score("T-REx", "T-REx", 2, 1, 1, {"multi-token-answer": 1}, 0, {"bert": {1: 1.0}})
    ]


def test_macro_average_of_nothing_is_empty():
    result = macro_average([])
    assert (result.relations, result.corpora, result.aggregates, result.popularity) == ([], [], [], [])


def test_popularity_buckets_use_ten_histogram_edges_of_log_popularity():
    logs_and_hits = [(0.0, 1), (0.5, None), (5.5, 1), (5.6, 1), (10.0, None)]
    rows = [
        row("PopQA", "occupation", str(i), hit, None, 1, popularity=math.exp(lg))
        for i, (lg, hit) in enumerate(logs_and_hits)
    ]
    rows.append(row("PopQA", "occupation", "no-pop", 1, 1, 1))  # no popularity: not bucketed
    buckets = popularity_buckets(rows, models=["bert", "bert_knn"])
    assert [b.facts for b in buckets] == [2, 0, 0, 0, 0, 2, 0, 0, 0, 1]
    assert [b.low for b in buckets] == pytest.approx(list(range(10)))
    assert [b.high for b in buckets] == pytest.approx(list(range(1, 11)))
    assert [b.precision for b in buckets if b.facts] == [
        {"bert": 0.5, "bert_knn": 1.0},
        {"bert": 1.0, "bert_knn": 1.0},
        {"bert": 0.0, "bert_knn": 1.0},
    ]
    assert buckets[1] == Bucket(buckets[1].low, buckets[1].high, 0, {})
    assert popularity_buckets([row("T-REx", "P19", "a", 1, 1, 1)]) == []


def test_popularity_below_one_counts_as_one():
    rows = [
        row("PopQA", "genre", "a", 1, 1, 1, popularity=0.0),
        row("PopQA", "genre", "b", 1, 1, 1, popularity=1.0),
    ]
    buckets = popularity_buckets(rows, models=["bert"], bins=2)
    # Both logs are 0, so numpy centres the range on 0: edges -0.5, 0, 0.5.
    assert buckets == [Bucket(-0.5, 0.0, 0, {}), Bucket(0.0, 0.5, 2, {"bert": 1.0})]


def test_adaptive_thresholds_retrieve_below_the_best_edge():
    # Rare subjects: only retrieval is right; popular ones: only BERT is right.
    rows = [
        row("PopQA", "director", "a", None, None, 1, popularity=math.exp(0.0)),
        row("PopQA", "director", "b", None, None, 1, popularity=math.exp(1.0)),
        row("PopQA", "director", "c", 1, None, None, popularity=math.exp(9.0)),
        row("PopQA", "director", "d", 1, None, None, popularity=math.exp(10.0)),
        row("PopQA", "genre", "e", 1, None, 1, popularity=5.0),
        FactResult("PopQA", "color", "f", skipped="multi-token-answer", popularity=3.0),
    ]
    thresholds = adaptive_thresholds(rows)
    # Edges 2..9 all reach 4/4; the lowest wins. A relation with one popularity has edges around it.
    assert thresholds == {"director": pytest.approx(2.0), "genre": pytest.approx(math.log(5.0) - 0.5)}
