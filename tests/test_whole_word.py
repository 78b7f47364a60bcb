"""Whole-word answers: a word of several wordpieces is one context under one [MASK], and an answer.

The tiny model's vocabulary has "##s", so the invented towns are given plural names ("Quentons" is
``quenton ##s``): under the paper's single-wordpiece policy such a word can never be an answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.encoding.encoder import Encoder
from bertknn_search.eval.datasets import Fact as EvalFact
from bertknn_search.eval.harness import NOT_ONE_TOKEN, prepare, vocab_mask
from bertknn_search.ingest.contexts import make_rows
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.query.knn import knn_probs
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question
from bertknn_search.values import Candidates, ValueSpace, word_value
from tests.test_backends import assert_same


def town(f: Fact) -> str:
    return f"{f.city.title()}s"


def write_towns(path: Path, facts: list[Fact]) -> Path:
    rows = []
    for i, f in enumerate(facts):
        text = (
            f"{f.person.title()} was born in {town(f)}. {f.person.title()} worked as a {f.job} in the north."
            f" Many people in {town(f)} knew {f.person.title()}."
        )
        rows.append({"id": str(100 + i), "title": f.person.title(), "text": text})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def encoder(tiny_model: Path) -> Encoder:
    return Encoder(str(tiny_model), layer=11, device="cpu", max_length=64)


@pytest.fixture(scope="module")
def towns(tmp_path_factory: pytest.TempPathFactory, facts: list[Fact]) -> Path:
    return write_towns(tmp_path_factory.mktemp("towns") / "towns.jsonl", facts)


def build(base_config: Config, corpus: Path, root: Path, policy: str, contexts: str = "eager") -> Config:
    config = base_config.replace(index=root / f"{policy}-{contexts}", mask_policy=policy, contexts=contexts)
    ingest(corpus, config, progress=False)
    return config


@pytest.fixture(scope="module")
def indexes(base_config: Config, towns: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Config]:
    root = tmp_path_factory.mktemp("ww")
    return {
        "single": build(base_config, towns, root, "single-wordpiece"),
        "whole": build(base_config, towns, root, "whole-word"),
        "whole-lazy": build(base_config, towns, root, "whole-word", "lazy"),
    }


@pytest.fixture(scope="module")
def searchers(indexes: dict[str, Config]) -> Iterator[dict[str, Searcher]]:
    opened = {name: Searcher.open(config) for name, config in indexes.items()}
    yield opened
    for s in opened.values():
        s.close()


def born(facts: list[Fact]) -> list[Question]:
    return [Question(f"{f.person.title()} was born in [MASK].", f.person.title()) for f in facts]


# -- values -----------------------------------------------------------------------------------------
def test_a_word_of_several_pieces_has_a_stable_negative_value_and_one_piece_keeps_its_id() -> None:
    assert word_value([17]) == 17
    value = word_value([40, 7])
    assert value < 0 and value == word_value([40, 7])
    assert value != word_value([7, 40]) and value != word_value([40, 7, 7])
    assert value >= -(1 << 31)  # fits the stores' int32 columns


def test_value_space_puts_the_neighbours_words_after_the_vocabulary() -> None:
    values = np.array([3, -9, 5, -2, -9])
    space = ValueSpace.of(values, vocab_size=10)
    assert space.size == 12 and space.words.tolist() == [-9, -2]  # nearest first
    assert space.index(values).tolist() == [3, 10, 5, 11, 10]
    assert [space.value(i) for i in (3, 10, 11)] == [3, -9, -2]
    assert space.position(-2) == 11 and space.position(-4) is None and space.position(4) == 4
    p = knn_probs(np.array([0.0, 0.0, 0.0, 0.0, 0.0]), space.index(values), space.size, 6.0)
    assert p[10] == pytest.approx(0.4) and p[11] == pytest.approx(0.2) and p.sum() == pytest.approx(1)


def test_knn_probs_refuses_a_word_value_where_a_position_is_due() -> None:
    with pytest.raises(ValueError, match=r"ValueSpace\.index"):
        knn_probs(np.array([1.0]), np.array([-5]), 10, 6.0)


def test_candidates_allow_listed_words_only() -> None:
    space = ValueSpace.of(np.array([-3, -4]), vocab_size=3)
    mask = np.array([True, False, True])
    assert Candidates(mask).over(space).tolist() == [True, False, True, True, True]
    listed = Candidates(mask, frozenset({-4}))
    assert listed.over(space).tolist() == [True, False, True, False, True]
    assert -4 in listed and -3 not in listed and 1 not in listed and 2 in listed


# -- rows -----------------------------------------------------------------------------------------
def test_whole_word_masks_every_word_with_one_mask(encoder: Encoder) -> None:
    text = "Zorblat, an unknown poet, was born in Quentons."
    rows = make_rows([[text]], encoder, "whole-word", 64)
    assert [text[r.start : r.end] for r in rows] == [
        "Zorblat", "an", "unknown", "poet", "was", "born", "in", "Quentons"
    ]  # fmt: skip
    tok = encoder.tokenizer
    mask = tok.mask_token_id
    for r in rows:
        pieces = tok(text[r.start : r.end], add_special_tokens=False)["input_ids"]
        assert r.token_id == word_value(pieces)
        assert r.input_ids.count(mask) == 1 and r.input_ids[r.mask_position] == mask
        # The question's form: the sentence with the word (all its pieces) replaced by one [MASK].
        masked = f"{text[: r.start]}[MASK]{text[r.end :]}"
        assert r.input_ids == tok(masked)["input_ids"]
    assert rows[-1].token_id < 0 and rows[2].token_id < 0  # quenton ##s, un ##known


def test_single_piece_words_give_the_same_rows_under_both_policies(encoder: Encoder) -> None:
    text = "Many people in Quentons knew Zorblat as a famous painter."
    single = make_rows([[text]], encoder, "single-wordpiece", 64)
    whole = [r for r in make_rows([[text]], encoder, "whole-word", 64) if r.token_id >= 0]
    assert whole == single and len(single) == 8  # "knew" is [UNK] here


def test_stopword_free_whole_word_policy(encoder: Encoder) -> None:
    text = "Zorblat was born in Quentons."
    rows = make_rows([[text]], encoder, "whole-word-no-stopwords", 64)
    assert [text[r.start : r.end] for r in rows] == ["Zorblat", "born", "Quentons"]


def test_long_sentences_are_windowed_around_a_whole_word(encoder: Encoder) -> None:
    text = " ".join(["quenton river poet quentons"] * 20)
    rows = make_rows([[text]], encoder, "whole-word", 16)
    assert len(rows) == 80
    tok, mask = encoder.tokenizer, encoder.tokenizer.mask_token_id
    for r in rows:
        assert len(r.input_ids) <= 16 and r.input_ids.count(mask) == 1
        masked = tok(f"{text[: r.start]}[MASK]{text[r.end :]}", add_special_tokens=False)["input_ids"]
        window = r.input_ids[1:-1]
        lo = masked.index(mask) - (r.mask_position - 1)  # the masked sentence around the mask, in order
        assert lo >= 0 and window == masked[lo : lo + len(window)]


# -- answers ----------------------------------------------------------------------------------------
def test_a_word_of_several_wordpieces_is_answered_only_under_whole_word(
    searchers: dict[str, Searcher], facts: list[Fact]
) -> None:
    whole = searchers["whole"].answer_batch(born(facts))
    single = searchers["single"].answer_batch(born(facts))
    hits = 0
    for f, a, b in zip(facts, whole, single):
        word = town(f).lower()
        assert word not in [p.word for p in b.knn + b.bert_knn]
        first = a.knn[0]
        if first.word == word:
            hits += 1
            assert first.pieces == (f.city, "##s") and first.token_id < 0
            # BERT gives the word no probability of its own: BERT-kNN holds λ of its kNN mass.
            mixed = next(p for p in a.bert_knn if p.word == word)
            assert mixed.prob == pytest.approx(0.3 * first.prob)
            ev = next(e for e in a.evidence if e.word == word)
            assert any(s.sentence[s.start : s.end] == town(f) for s in ev.sentences)
        assert all(p.pieces == () for p in a.knn if p.token_id >= 0)
    assert hits >= len(facts) - 1  # the question's own sentence is stored: its word is the nearest


def test_lazy_whole_word_answers_as_eager(searchers: dict[str, Searcher], facts: list[Fact]) -> None:
    qs = born(facts)[:4]
    for a, b in zip(searchers["whole"].score_batch(qs), searchers["whole-lazy"].score_batch(qs)):
        np.testing.assert_array_equal(a.neighbors.token_ids, b.neighbors.token_ids)
        np.testing.assert_array_equal(a.space.words, b.space.words)
        np.testing.assert_allclose(a.p, b.p, atol=1e-6)


def test_query_json_carries_the_word_and_its_pieces(indexes: dict[str, Config], facts: list[Fact]) -> None:
    f = facts[0]
    args = ["query", f"{f.person.title()} was born in [MASK].", "--subject", f.person.title()]
    result = CliRunner().invoke(main, [*args, "--index", str(indexes["whole"].index), "--json"])
    assert result.exit_code == 0, result.output
    top = json.loads(result.stdout)["knn"][0]
    assert top["word"] == town(f).lower() and top["pieces"] == [f.city, "##s"] and top["token_id"] < 0
    text = CliRunner().invoke(main, [*args, "--index", str(indexes["whole"].index)])
    assert f"evidence for '{town(f).lower()}'" in text.stdout
    assert f"whole words of several wordpieces: {town(f).lower()} ({f.city} ##s)" in text.stdout


def test_eval_scores_a_word_of_several_pieces_under_whole_word(
    searchers: dict[str, Searcher], facts: list[Fact]
) -> None:
    items = [
        EvalFact(
            "Test", "P19", f"{f.person.title()} was born in [MASK].", (town(f),), f.person.title(), str(i)
        )
        for i, f in enumerate(facts)
    ]
    ready, skipped = prepare(searchers["whole"], items, None)
    assert len(ready) == len(items) and not skipped
    assert all(p.gold == (searchers["whole"].value(town(f)),) for p, f in zip(ready, facts))
    ready, skipped = prepare(searchers["single"], items, None)
    assert not ready and {reason for _, reason in skipped} == {NOT_ONE_TOKEN}
    # LAMA's common vocabulary lists words; under whole-word a listed word of several pieces counts.
    common = vocab_mask(searchers["whole"], [town(facts[0]), "poet"])
    assert searchers["whole"].value(town(facts[0])) in common and searchers["whole"].value("poet") in common
    assert searchers["whole"].value(town(facts[1])) not in common


def test_a_phrase_or_unknown_word_has_no_value(searchers: dict[str, Searcher]) -> None:
    whole = searchers["whole"]
    assert whole.value("Quentons") is not None
    assert whole.value("new quenton") is None  # two words: no single context holds them
    assert whole.value("xyzzq") is None  # [UNK]
    assert searchers["single"].value("Quentons") is None


def test_evidence_for_a_word_of_several_wordpieces(searchers: dict[str, Searcher], facts: list[Fact]) -> None:
    f = facts[0]
    asked = Question(f"{f.person.title()} was born in [MASK].", f.person.title(), evidence_for=(town(f),))
    whole = searchers["whole"].answer(asked).evidence_for[0]
    assert whole.answerable and whole.votes >= 2 and whole.sentences  # born in, and many people in
    assert all(s.sentence[s.start : s.end] == town(f) for s in whole.sentences)
    single = searchers["single"].answer(asked).evidence_for[0]
    assert (single.answerable, single.votes, single.sentences) == (False, 0, [])


@pytest.mark.opensearch
def test_whole_word_answers_alike_on_both_backends(
    searchers: dict[str, Searcher],
    cluster_config: Config,
    towns: Path,
    facts: list[Fact],
) -> None:
    """A lazy whole-word OpenSearch index answers as the eager embedded one: same words, same pieces."""
    config = cluster_config.replace(mask_policy="whole-word", contexts="lazy", exact=True)
    ingest(towns, config, progress=False)
    opensearch = Searcher.open(config)
    try:
        qs = born(facts)[:4]
        for a, b in zip(searchers["whole"].score_batch(qs), opensearch.score_batch(qs)):
            assert_same(a, b, "whole-word")
            np.testing.assert_array_equal(a.space.words, b.space.words)
        for a, b in zip(searchers["whole"].answer_batch(qs), opensearch.answer_batch(qs)):
            assert [(p.word, p.pieces) for p in a.knn] == [(p.word, p.pieces) for p in b.knn]
            assert any(p.pieces for p in b.knn)
    finally:
        opensearch.close()


def test_the_server_answers_whole_words_with_their_pieces(
    indexes: dict[str, Config], facts: list[Fact]
) -> None:
    pytest.importorskip("fastapi", reason="the server needs fastapi (pip install -e '.[test]')")
    from fastapi.testclient import TestClient

    from bertknn_search.server.app import ServerSettings, create_app
    from bertknn_search.server.client import answer_from_json
    from tests.test_server import LOCAL, start

    f = facts[1]
    with TestClient(create_app(ServerSettings(indexes["whole-lazy"])), base_url=LOCAL) as client:
        start(client)
        body = {"question": f"{f.person.title()} was born in [MASK].", "subject": f.person.title()}
        answer = client.post("/query", json=body).json()["answers"][0]
    assert answer["knn"][0]["word"] == town(f).lower() and answer["knn"][0]["pieces"] == [f.city, "##s"]
    assert answer_from_json(answer).knn[0].pieces == (f.city, "##s")  # the CLI's --server path reads it back
