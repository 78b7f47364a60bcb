"""How hard a question is, as confidence inputs: the signals, their JSON, and fits that name them."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from bertknn_search.errors import ConfigError
from bertknn_search.eval.calibration import ANSWER_FEATURES, Measured, fit
from bertknn_search.eval.index_calibration import refit_features, write_calibration
from bertknn_search.query.answer_kinds import KindSignals
from bertknn_search.query.confidence import FEATURES, HARDNESS_FEATURES, WORD_FEATURES, Fit, Signals, shipped
from bertknn_search.query.hardness import Hardness, entropy, hardness
from bertknn_search.query.signals_json import signals_from_json, signals_json


def test_entropy_of_known_distributions() -> None:
    assert math.isclose(entropy(np.full(8, 0.125)) or 0, math.log(8))
    assert entropy(np.array([0.0, 1.0, 0.0])) == 0.0
    assert math.isclose(entropy(np.array([2.0, 2.0])) or 0, math.log(2))  # normalised first
    assert entropy(np.zeros(5)) is None


def test_hardness_reads_bert_over_answerable_ids_and_the_knn_spread() -> None:
    p_bert = np.array([0.5, 0.3, 0.2])  # id 0 is a special token: left out, the rest renormalised
    found = hardness(
        np.array([0.25, 0.25, 0.25, 0.25]), np.array([1.0, 2.0, 6.0]), p_bert, np.array([False, True, True])
    )
    assert math.isclose(found.bert_top1 or 0, 0.3)  # the top answerable id's probability
    assert math.isclose(found.bert_entropy or 0, -(0.6 * math.log(0.6) + 0.4 * math.log(0.4)))
    assert math.isclose(found.knn_entropy or 0, math.log(4))  # four values equally likely
    assert found.mean_distance == 3.0


def test_without_an_mlm_head_or_neighbours_the_signals_are_unknown() -> None:
    no_head = hardness(np.array([1.0, 0.0]), np.array([4.0]), None, None)
    assert no_head.bert_top1 is None and no_head.bert_entropy is None and no_head.knn_entropy == 0.0
    alone = hardness(np.zeros(3), np.zeros(0), np.array([0.2, 0.8, 0.0]), None)
    assert alone.knn_entropy is None and alone.mean_distance is None and alone.bert_top1 == 0.8


def _signals(votes: int, hard: Hardness) -> Signals:
    return Signals(0.4, 0.1, votes, 20, votes / 20, votes > 5, 0.5, 9.0, 20, 1.0, KindSignals(), hard)


def test_an_unknown_signal_enters_the_fit_as_zero() -> None:
    known = _signals(4, Hardness(0.3, 2.0, 1.5, 99.0))
    unknown = _signals(4, Hardness())
    assert FEATURES["bert_entropy"](known) == 2.0 and FEATURES["bert_entropy"](unknown) == 0.0
    assert math.isclose(FEATURES["log_mean_distance"](known), math.log(100.0))
    assert FEATURES["log_mean_distance"](unknown) == 0.0
    assert math.isclose(FEATURES["log_distinct"](known), math.log(11.0))  # 0.5 of 20 neighbours distinct
    assert FEATURES["log_nearest"](dataclasses.replace(known, nearest=math.inf)) == 0.0


def test_the_signals_json_round_trips_and_an_old_line_reads_as_unknown() -> None:
    found = _signals(7, Hardness(0.25, 3.5, 1.25, 42.0))
    line = json.loads(json.dumps(signals_json(found)))
    assert line["bert_entropy"] == 3.5 and line["mean_distance"] == 42.0
    assert signals_from_json(line) == found
    old = {
        k: v
        for k, v in line.items()
        if k not in ("bert_top1", "bert_entropy", "knn_entropy", "mean_distance")
    }
    assert signals_from_json(old).hard == Hardness()


def test_a_fit_with_the_hardness_inputs_learns_from_them_and_round_trips(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(5)
    rows = []
    for i in range(400):
        spread = float(rng.uniform(0.5, 6.0))  # BERT's entropy: the harder the question, the rarer right
        hit = bool(rng.random() < 1 / (1 + math.exp(spread - 3)))
        found = _signals(int(rng.integers(0, 10)), Hardness(0.2, spread, 1.0, 50.0))
        rows.append(Measured(str(i), ("P19", "P20", "P106")[i % 3], found, hit))
    features = (*ANSWER_FEATURES, *HARDNESS_FEATURES)
    made = fit(rows, features)
    assert made.coef[features.index("bert_entropy")] < -0.5  # it learnt that entropy means wrong
    easy, hard = _signals(3, Hardness(0.2, 1.0, 1.0, 50.0)), _signals(3, Hardness(0.2, 5.5, 1.0, 50.0))
    assert made.probability([easy])[0] > made.probability([hard])[0] + 0.2
    back = Fit.read(made.save(tmp_path / "fit.json"))
    assert back == made and back.features == features


def test_a_fit_of_the_answers_signals_alone_still_loads_and_ignores_hardness() -> None:
    old = shipped("confidence_fit_bert.json").as_json() | {
        "features": list(ANSWER_FEATURES[:3]),
        "mean": [0.0] * 3,
        "scale": [1.0] * 3,
        "coef": [0.5, 0.2, -0.1],
        "lower": [],
        "upper": [],
        "curve": [],
        "p_from": "fit",
    }
    loaded = Fit.from_json(json.loads(json.dumps(old)), "an old fit")
    a, b = _signals(4, Hardness()), _signals(4, Hardness(0.9, 0.1, 0.1, 1.0))
    assert loaded.probability([a])[0] == loaded.probability([b])[0]
    # its inputs are read by name, whatever FEATURES now holds: p is its own regression, by hand
    x = [FEATURES[name](a) for name in ANSWER_FEATURES[:3]]
    z = 0.5 * x[0] + 0.2 * x[1] - 0.1 * x[2] + old["intercept"]
    assert loaded.probability([a])[0] == pytest.approx(1 / (1 + math.exp(-z)))


def test_eval_calibrate_refits_on_the_inputs_of_the_fit_in_use() -> None:
    bert_knn = shipped("confidence_fit_bert_knn.json")
    # the shipped BERT-kNN fit reads the kNN's half of them (with BERT's answer ratio, BERT's half
    # checked no better: docs/evaluation.md#confidence)
    assert {"knn_entropy", "log_distinct", "log_nearest", "log_mean_distance"} <= set(
        refit_features(bert_knn)
    )
    assert "log_bert_ratio" in refit_features(bert_knn)
    # MiniLM's reads how common a word the answer is, none of them
    assert refit_features(shipped("confidence_fit.json"), with_head=False) == (
        *ANSWER_FEATURES,
        *WORD_FEATURES,
    )
    assert refit_features(shipped("confidence_fit_bert.json")) == ANSWER_FEATURES  # p is BERT's top-1
    assert refit_features(None) == ANSWER_FEATURES


def _line(i: int, hardness_recorded: bool) -> dict[str, object]:
    said: dict[str, object] = {
        "top1": 0.2 + 0.01 * (i % 50),
        "margin": 0.1,
        "votes": 1 + i % 7,
        "neighbors": 20,
        "near_votes": 0.1 * (i % 5),
        "agree": bool(i % 2),
        "distinct": 0.5,
        "nearest": 100.0 + i,
        "contexts": 40,
        "coverage": 1.0,
        "kind": "word",
        "majority": "word",
        "kind_share": 1.0,
        "bert_kind_share": 0.9,
        "bert_p": 0.3,
    }
    if hardness_recorded:
        said |= {"bert_top1": 0.3, "bert_entropy": 2.0 + i % 3, "knn_entropy": 0.5, "mean_distance": 300.0}
    right = i % 3 == 0
    return {
        "key": f"T-REx/P{i % 6}/{i}",
        "relation": f"P{i % 6}",
        "ranks": {"bert_knn": 1 if right else None},
        "skipped": None,
        "confidence_signals": said,
    }


def test_calibrate_refuses_a_checkpoint_that_mixes_lines_with_and_without_hardness(tmp_path: Path) -> None:
    """A run resumed across the change would give the hardness fit zeros that mean 'unknown', silently."""
    in_use = (shipped("confidence_fit_bert_knn.json"), "shipped")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(_line(i, i >= 200)) + "\n" for i in range(400)))
    with pytest.raises(ConfigError, match="mixes answers recorded with and without"):
        write_calibration(mixed, tmp_path / "out", "bert-base-uncased", None, in_use)
    whole = tmp_path / "whole.jsonl"
    whole.write_text("".join(json.dumps(_line(i, True)) + "\n" for i in range(400)))
    (tmp_path / "out2").mkdir()
    fit_made, _ = write_calibration(whole, tmp_path / "out2", "bert-base-uncased", None, in_use)
    assert set(fit_made.features) == set(refit_features(in_use[0]))  # those since the fit was made too


def test_the_answer_ratio_alone_refuses_a_mixed_checkpoint_of_a_model_with_a_head(tmp_path: Path) -> None:
    """A fit of the answer's inputs alone reads BERT's top-1 through ``log_bert_ratio``: with an MLM head
    (the lines have ``bert_p``) a checkpoint resumed across versions is refused as well."""
    in_use = (shipped("confidence_fit.json"), "shipped")  # the answer's inputs only
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(_line(i, i >= 200)) + "\n" for i in range(400)))
    with pytest.raises(ConfigError, match="mixes answers recorded with and without"):
        write_calibration(mixed, tmp_path / "out", "bert-base-uncased", None, in_use)


def test_every_input_is_in_one_group() -> None:
    """A new input must be named as the answer's, its word's or the question's: refits choose inputs by
    group."""
    groups = [set(ANSWER_FEATURES), set(WORD_FEATURES), set(HARDNESS_FEATURES)]
    assert set().union(*groups) == set(FEATURES)
    assert sum(len(g) for g in groups) == len(FEATURES)
