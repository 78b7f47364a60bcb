"""How common the answer word is, as a confidence input (issue 49): a fact's answer is mostly a name, a
wrong kNN answer often a common word of the sentence; a model without an MLM head has nothing else that
says so."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bertknn_search.config import Config
from bertknn_search.eval.calibration import ANSWER_FEATURES, from_lines
from bertknn_search.eval.datasets import Fact
from bertknn_search.eval.harness import evaluate
from bertknn_search.query.answer_kinds import KindSignals
from bertknn_search.query.confidence import FEATURES, WORD_FEATURES, Signals, shipped
from bertknn_search.query.search import Question, Searcher
from bertknn_search.query.signals_json import signals_from_json, signals_json
from bertknn_search.query.word_frequency import COMMON, above_common, zipf
from tests.test_eval_harness import born_facts

common = FEATURES["common_word"]


def _signals(zipf_value: float | None, votes: int = 3) -> Signals:
    return Signals(0.4, 0.1, votes, 20, votes / 20, True, 0.5, 9.0, 20, 1.0, KindSignals(zipf=zipf_value))


def test_common_words_read_above_names_and_pieces_and_numbers_read_unknown() -> None:
    assert zipf("the") > zipf("based") > COMMON > zipf("glasgow") > 0  # type: ignore[operator]
    assert zipf("Glasgow") == zipf("glasgow")  # a cased model's answer reads as its lower case
    assert zipf("qzxvbnwq") == 0.0  # rarer than the list holds
    assert zipf("##s") is None and zipf("") is None and zipf("  ") is None
    assert zipf("1948") is None and zipf("4th") is None


def test_every_word_of_berts_vocabulary_reads_as_wordfreq_reads_it(minilm: Path) -> None:
    """The list is read from wordfreq's data file (its API's first call imports ftfy and langcodes, 0.3 s
    of a first answer): wordfreq's own ``zipf_frequency`` is the reference, on bert-base-uncased's
    vocabulary (all-MiniLM-L6-v2's), every wordpiece that is a word and no number."""
    from wordfreq import zipf_frequency

    vocab = json.loads((minilm / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    words = [w for w in vocab if zipf(w) is not None and not (w.startswith("[") and w.endswith("]"))]
    assert len(words) > 20_000
    differ = [w for w in words if abs(zipf(w) - zipf_frequency(w, "en", wordlist="small")) > 0.011]  # type: ignore[operator]
    # wordfreq folds the degree sign into the letter ('°c' reads as 'c'); nothing else differs
    assert set(differ) <= {"°c", "°f"}


def test_the_input_is_how_far_above_common_and_nan_where_unknown() -> None:
    assert above_common(COMMON - 1.5) == 0.0 and above_common(COMMON + 0.75) == 0.75
    assert common(_signals(zipf("glasgow"))) == 0.0
    assert common(_signals(zipf("the"))) == pytest.approx(zipf("the") - COMMON)  # type: ignore[operator]
    assert math.isnan(common(_signals(None)))
    assert "common_word" in WORD_FEATURES and "common_word" not in ANSWER_FEATURES  # a group of its own


def test_minilms_fit_puts_a_common_word_under_a_name_and_an_unknown_word_at_the_mean() -> None:
    fit = shipped("confidence_fit.json")
    at = fit.features.index("common_word")
    name, word = _signals(zipf("glasgow")), _signals(zipf("based"))
    assert fit.probability([name])[0] > fit.probability([word])[0]
    assert fit.matrix([_signals(None)])[0, at] == 0.0  # taken at the fit's mean: no weight either way
    # BERT-kNN's fit was measured with it and does not read it (BERT's ratio says as much)
    assert "common_word" not in shipped("confidence_fit_bert_knn.json").features


def test_the_json_round_trip_keeps_it() -> None:
    said = _signals(4.19)
    data = signals_json(said)
    assert data["word_zipf"] == 4.19
    assert signals_from_json(data) == said


def test_a_checkpoint_line_written_before_it_reads_it_from_its_top_word() -> None:
    """An evaluation stored before the input existed can still be refitted with it: the line holds the
    word the query path reads it from; a line that recorded it keeps its own."""
    said = signals_json(_signals(None))
    said.pop("word_zipf")
    old = {
        "key": "T-REx/P19/1",
        "relation": "P19",
        "ranks": {"bert_knn": 1},
        "skipped": None,
        "top": {"knn": ["glasgow"], "bert_knn": ["based"]},
        "confidence_signals": said,
    }
    assert from_lines([old])[0].signals.kinds.zipf == zipf("based")  # BERT-kNN's top: what p is of
    new = {**old, "confidence_signals": {**said, "word_zipf": 3.0}}
    assert from_lines([new])[0].signals.kinds.zipf == 3.0
    bare = {**old, "top": {}}
    assert from_lines([bare])[0].signals.kinds.zipf is None


def test_the_query_path_and_an_evaluation_read_the_same_word(
    searcher: Searcher, built_index: Config, facts: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Searcher.answer_batch`` reads it from the answer's word, an evaluation's line from the same
    word: under a fit that reads it (MiniLM's), a live answer's ``p`` is the one its line records."""
    fit = shipped("confidence_fit.json")
    monkeypatch.setattr(searcher, "_fit", (fit, "shipped:confidence_fit.json"))
    scorable = born_facts(facts[:6]) + [
        # answered with common words ('born', 'in'): their frequency moves p
        Fact(
            "Synthetic",
            "verb",
            f"{f.person.title()} was [MASK] in {f.city.title()} .",
            ("born",),
            f.person.title(),
            f.person,
        )
        for f in facts[:6]
    ]
    result = evaluate(searcher, scorable, built_index, tmp_path)
    lines = {
        line["key"]: line
        for line in map(json.loads, result.checkpoint.read_text(encoding="utf-8").splitlines())
    }
    answers = searcher.answer_batch([Question(f.question, f.subject) for f in scorable])
    read, common_seen = 0, 0
    for fact, answer in zip(scorable, answers):
        line = lines[fact.key]
        if not line.get("confidence_signals"):
            continue
        top = answer.bert_knn[0].word
        assert line["confidence_signals"]["word_zipf"] == zipf(top)
        assert answer.confidence is not None and line["confidence"]["p"] == answer.confidence.p
        row = from_lines([line])[0]
        assert fit.probability([row.signals])[0] == pytest.approx(answer.confidence.p, abs=1e-4)
        read += 1
        common_seen += (zipf(top) or 0.0) > COMMON
    assert read >= 12 and common_seen >= 2
