"""Searcher end to end on the synthetic corpus: invented facts are recovered through kNN."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.errors import IndexMismatchError, QuestionError
from bertknn_search.ingest.pipeline import add_articles
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question

# The tiny random model's distances between different contexts are ~1.5-4, where BERT-base's are in the
# hundreds; l=1 puts the kernel on the same footing as l=6 on BERT-base (the nearest context dominates).
SHARP = 1.0


@pytest.fixture(scope="module")
def searcher(built_index: Config) -> Searcher:
    s = Searcher.open(built_index.replace(temperature=SHARP))
    yield s
    s.close()


def born(f: Fact) -> Question:
    return Question(f"{f.person.title()} was born in [MASK].", f.person.title())


def rank_of(ranking: list, word: str) -> int:
    words = [p.word for p in ranking]
    return words.index(word) if word in words else len(words)


def test_invented_facts_are_recovered_through_knn(searcher: Searcher, facts: list[Fact]) -> None:
    answers = searcher.answer_batch([born(f) for f in facts])
    p_bert = searcher.encoder.query([a.question for a in answers])[1]
    bert_ranks = []
    for f, a, pb in zip(facts, answers, p_bert):
        assert a.knn[0].word == f.city
        assert a.bert_knn[0].word == f.city
        city = searcher.encoder.single_token_id(f.city)
        bert_ranks.append(int((pb > pb[city]).sum()))
        # The explanation: the corpus sentence that voted for the answer, with the word's span.
        first = a.evidence[0].sentences[0]
        assert a.evidence[0].word == f.city
        assert first.sentence == f"{f.person.title()} was born in {f.city.title()}."
        assert first.sentence[first.start : first.end] == f.city.title()
        assert first.title == f.person.title()
    # BERT alone cannot know invented facts: it is near chance (1 in 137 words) on them.
    assert sum(r == 0 for r in bert_ranks) <= 1 and np.mean(bert_ranks) > 10


def test_paper_settings_never_rank_the_gold_answer_below_bert(built_index: Config, facts: list[Fact]) -> None:
    s = Searcher.open(built_index)  # l=6, λ=0.3, k=128, N=3
    try:
        for f, a in zip(facts, s.answer_batch([born(f) for f in facts])):
            assert rank_of(a.bert_knn, f.city) <= rank_of(a.bert, f.city)
    finally:
        s.close()


@pytest.mark.parametrize(("lam", "same_as"), [(0.0, "bert"), (1.0, "knn")])
def test_lambda_endpoints(built_index: Config, facts: list[Fact], lam: float, same_as: str) -> None:
    s = Searcher.open(built_index.replace(lam=lam, top=20))
    try:
        for a in s.answer_batch([born(f) for f in facts[:3]]):
            other = getattr(a, same_as)
            assert [p.word for p in a.bert_knn] == [p.word for p in other]
            np.testing.assert_allclose([p.prob for p in a.bert_knn], [p.prob for p in other], rtol=1e-6)
    finally:
        s.close()


def test_ir_uses_the_subjects_own_article(searcher: Searcher, facts: list[Fact]) -> None:
    f = facts[2]
    own = searcher.retrieve(Question("[MASK] is here.", f.person.upper()))
    assert [h.title for h in own] == [f.person.title()]
    free = searcher.retrieve(Question(f"Where was {f.person.title()} born? In [MASK]."))
    assert free[0].title == f.person.title() and len(free) == 3


def test_a_stored_key_returns_its_own_value_first(searcher: Searcher, facts: list[Fact]) -> None:
    f = facts[4]
    a = searcher.answer(
        Question(f"Many people in [MASK] knew {f.person.title()} as a famous {f.job}.", f.person)
    )
    assert a.knn[0].word == f.city
    assert a.evidence[0].sentences[0].distance == pytest.approx(0.0, abs=1e-2)


def test_no_ir_mode_searches_all_articles(built_index: Config, facts: list[Fact]) -> None:
    s = Searcher.open(built_index.replace(use_ir=False, temperature=SHARP))
    try:
        a = s.answer(born(facts[0]))
        assert a.articles == [] and a.n_neighbors == 128 and a.knn[0].word == facts[0].city
    finally:
        s.close()


def test_unknown_subject_without_articles_falls_back_to_bert(searcher: Searcher) -> None:
    a = searcher.answer(Question("[MASK] [MASK]".replace(" [MASK]", "") + " and the of.", "the"))
    assert a.n_neighbors == 0 and a.knn == [] and a.bert_knn == a.bert


def test_bad_question_fails_before_any_work(searcher: Searcher) -> None:
    with pytest.raises(QuestionError):
        searcher.answer_batch([Question("fine [MASK]."), Question("no mask here")])


def test_adding_an_article_makes_a_new_fact_answerable(index_copy: Config, tmp_path: Path) -> None:
    q = Question("Quillam was born in [MASK].", "Quillam")
    new = {"id": "105", "title": "Quillam", "text": "Quillam was born in Yentil. Quillam was a sailor."}
    path = tmp_path / "new.jsonl"
    path.write_text(json.dumps(new) + "\n", encoding="utf-8")
    index_copy = index_copy.replace(temperature=SHARP)
    before = Searcher.open(index_copy)
    assert before.answer(q).knn[0].word == "hullweck"  # the corpus's invented fact
    before.close()
    summary = add_articles(path, index_copy, progress=False)
    assert (summary.articles, summary.already_stored) == (1, 0)
    after = Searcher.open(index_copy)
    assert after.answer(q).knn[0].word == "yentil"
    stats = after.backend.stats()
    after.close()
    again = add_articles(path, index_copy, progress=False)
    assert (again.articles, again.already_stored) == (0, 1)
    s2 = Searcher.open(index_copy)
    assert s2.backend.stats() == stats  # nothing duplicated
    s2.close()


def test_querying_with_another_model_is_a_clear_error(built_index: Config, tmp_path: Path) -> None:
    from bertknn_search.demo import build_tiny_model

    other = build_tiny_model(tmp_path / "other", hidden=32)
    with pytest.raises(IndexMismatchError, match="use the index's model"):
        Searcher.open(built_index.replace(model=str(other)))


def test_int8_store_answers_like_float16_in_fewer_bytes(
    built_index: Config, corpus: Path, facts: list[Fact], tmp_path: Path
) -> None:
    from bertknn_search.ingest.pipeline import ingest

    config = built_index.replace(index=tmp_path / "int8", store_dtype="int8", temperature=SHARP)
    ingest(corpus, config, progress=False)
    small, full = Searcher.open(config), Searcher.open(built_index.replace(temperature=SHARP))
    try:
        assert small.backend.meta().store_dtype == "int8"
        vector_bytes = []
        for index in (config.index, built_index.index):
            with sqlite3.connect(index / "index.sqlite") as conn:
                vector_bytes.append(conn.execute("SELECT SUM(LENGTH(vectors)) FROM contexts").fetchone()[0])
        # 500 contexts of dim 64: 64 codes + a 4-byte scale each, against 128 bytes of float16.
        assert vector_bytes == [500 * 68, 500 * 128]
        for a, b in zip(
            small.answer_batch([born(f) for f in facts]), full.answer_batch([born(f) for f in facts])
        ):
            assert a.bert_knn[0].word == b.bert_knn[0].word
            assert [p.word for p in a.knn[:3]] == [p.word for p in b.knn[:3]]
    finally:
        small.close()
        full.close()


def test_special_tokens_are_never_listed_as_answers(
    searcher: Searcher, facts: list[Fact], monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = searcher.encoder.tokenizer
    specials = [tok.mask_token_id, tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.unk_token_id]
    real = searcher.encode

    def peaked(questions):  # type: ignore[no-untyped-def]
        states, p_bert = real(questions)
        p_bert = p_bert.copy()
        p_bert[:, specials] = 0.15  # BERT puts most of its mass on special tokens
        return states, p_bert

    monkeypatch.setattr(searcher, "encode", peaked)
    answer = searcher.answer(born(facts[0]))
    p_bert = peaked([born(facts[0])])[1][0]
    for ranking in (answer.bert, answer.bert_knn, answer.knn):
        assert not {p.token_id for p in ranking} & set(specials)
    # The other words keep their probabilities: no renormalisation over what is left.
    assert [p.prob for p in answer.bert] == pytest.approx([float(p_bert[p.token_id]) for p in answer.bert])
    assert answer.bert_knn[0].word == facts[0].city
