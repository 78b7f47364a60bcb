"""The lazy datastore: contexts encoded when a query first needs an article give the eager answers."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bertknn_search.backends.lazy import LazyDatastore
from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.errors import LazyIndexError
from bertknn_search.ingest.pipeline import add_articles, ingest
from bertknn_search.query.search import Searcher
from bertknn_search.records import Answer, Question
from tests.test_backends import questions as backend_questions


@pytest.fixture(scope="module")
def lazy_index(base_config: Config, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Config:
    config = base_config.replace(index=tmp_path_factory.mktemp("lazy") / "index", contexts="lazy")
    ingest(corpus, config, progress=False)
    return config


@pytest.fixture
def lazy_copy(lazy_index: Config, tmp_path: Path) -> Config:
    shutil.copytree(lazy_index.index, tmp_path / "index")
    return lazy_index.replace(index=tmp_path / "index")


@pytest.fixture
def pair(built_index: Config, lazy_copy: Config) -> Iterator[tuple[Searcher, Searcher]]:
    # exact: every context of a question's articles first, as an eager index holds them (a budget's
    # partial answers are tests/test_anytime.py's).
    eager, lazy = Searcher.open(built_index), Searcher.open(lazy_copy.replace(exact=True))
    yield eager, lazy
    eager.close()
    lazy.close()


def questions(facts: list[Fact]) -> list[Question]:
    return backend_questions(facts, 5)


def test_a_lazy_ingest_stores_text_and_no_contexts(lazy_index: Config, built_index: Config) -> None:
    searcher = Searcher.open(lazy_index)
    try:
        stats, eager = searcher.backend.stats(), Searcher.open(built_index)
        try:
            assert stats.meta.contexts == "lazy"
            assert (stats.articles, stats.contexts, stats.encoded_articles) == (
                eager.backend.stats().articles,
                0,
                0,
            )
        finally:
            eager.close()
    finally:
        searcher.close()


def test_lazy_answers_equal_eager_answers(pair: tuple[Searcher, Searcher], facts: list[Fact]) -> None:
    eager, lazy = pair
    qs = questions(facts)
    assert isinstance(lazy.backend, LazyDatastore)
    for round_ in ("cold", "warm"):
        for q, a, b in zip(qs, eager.score_batch(qs), lazy.score_batch(qs)):
            what = f"{round_}: {q.text}"
            assert [h.id for h in a.hits or []] == [h.id for h in b.hits or []], what
            assert a.neighbors.article_ids == b.neighbors.article_ids, what
            np.testing.assert_array_equal(a.neighbors.token_ids, b.neighbors.token_ids, err_msg=what)
            # Keys come from other batches (other padding) than at ingest: float32 rounding differs.
            np.testing.assert_allclose(a.neighbors.distances, b.neighbors.distances, rtol=1e-5, err_msg=what)
            np.testing.assert_allclose(a.p, b.p, atol=1e-6, err_msg=what)
    for a, b in zip(eager.answer_batch(qs), lazy.answer_batch(qs)):
        assert_same_answer(a, b)


def assert_same_answer(a: Answer, b: Answer) -> None:
    """Rankings, articles and evidence alike; probabilities and distances to float32 rounding."""
    assert (a.question, a.articles, a.n_neighbors) == (b.question, b.articles, b.n_neighbors)
    for name in ("bert_knn", "bert", "knn"):
        x, y = getattr(a, name), getattr(b, name)
        assert [p.word for p in x] == [p.word for p in y], name
        np.testing.assert_allclose([p.prob for p in x], [p.prob for p in y], atol=1e-6)
    assert [e.word for e in a.evidence] == [e.word for e in b.evidence]
    for ea, eb in zip(a.evidence, b.evidence):
        assert [replace(s, distance=0.0) for s in ea.sentences] == [
            replace(s, distance=0.0) for s in eb.sentences
        ]


def test_only_the_articles_queries_need_are_encoded(
    pair: tuple[Searcher, Searcher], facts: list[Fact]
) -> None:
    eager, lazy = pair
    backend = lazy.backend
    assert isinstance(backend, LazyDatastore)
    q = Question(f"{facts[0].person.title()} was born in [MASK].", facts[0].person.title())
    hits = lazy.retrieve(q)
    assert len(hits) == 1  # the subject's own article
    encoded = backend.ensure_contexts([h.id for h in hits])
    stats = backend.stats()
    assert stats.encoded_articles == 1 and stats.contexts == encoded > 0
    assert stats.context_bytes > 0
    # One article's contexts per character, scaled to all the text: near the eager index's count.
    eager_total = eager.backend.stats().contexts
    assert 0.5 * eager_total < stats.estimated_contexts < 2 * eager_total
    assert eager.backend.stats().estimated_contexts == eager_total
    # The same number of contexts an eager ingest stored for that article, and nothing to do again.
    assert encoded == len(eager.backend.knn(np.zeros(eager.encoder.dim, np.float32), 10_000, [hits[0].id]))
    assert backend.ensure_contexts([h.id for h in hits]) == 0


def test_a_batch_encodes_every_missing_article_in_one_pass(
    lazy_copy: Config, facts: list[Fact], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bertknn_search.ingest import contexts as contexts_module

    calls: list[int] = []
    real = contexts_module.encode_rows

    def counting(rows, encoder, batch_size, on_batch=None):  # type: ignore[no-untyped-def]
        calls.append(len(rows))
        return real(rows, encoder, batch_size, on_batch)

    monkeypatch.setattr(contexts_module, "encode_rows", counting)
    # A budget of contexts alone: under the default's seconds, a process's first encode is a short step
    # that measures the encoder's rate, then one for the rest (tests/test_budget_seconds.py).
    searcher = Searcher.open(lazy_copy.replace(budget=64))
    try:
        searcher.score_batch(questions(facts))
    finally:
        searcher.close()
    assert len(calls) == 1 and calls[0] > 0


def test_no_ir_on_a_lazy_index_is_a_clear_error(lazy_index: Config, facts: list[Fact]) -> None:
    searcher = Searcher.open(lazy_index.replace(use_ir=False))
    try:
        with pytest.raises(LazyIndexError, match=r"--no-ir.*ingest wiki --contexts eager"):
            searcher.score_batch(questions(facts)[:1])
    finally:
        searcher.close()


def test_no_ir_on_a_lazy_index_searches_every_context_once_all_are_encoded(
    pair: tuple[Searcher, Searcher], corpus: Path, facts: list[Fact]
) -> None:
    eager, lazy = pair
    ids = [json.loads(line)["id"] for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    lazy.backend.ensure_contexts(ids[:-1])
    qs = questions(facts)[:3]
    no_ir = eager.config.replace(use_ir=False)
    with pytest.raises(LazyIndexError, match=r"before every article is encoded"):
        lazy.score_batch(qs[:1], no_ir)
    lazy.backend.ensure_contexts(ids[-1:])
    for q, a, b in zip(qs, eager.score_batch(qs, no_ir), lazy.score_batch(qs, no_ir)):
        assert a.hits is None and b.hits is None, q.text
        assert len(b.neighbors.article_ids) == len(a.neighbors.article_ids) > 0, q.text
        np.testing.assert_array_equal(a.neighbors.token_ids, b.neighbors.token_ids, err_msg=q.text)
        np.testing.assert_allclose(a.neighbors.distances, b.neighbors.distances, rtol=1e-5, err_msg=q.text)
        np.testing.assert_allclose(a.p, b.p, atol=1e-6, err_msg=q.text)


def test_a_replaced_article_drops_its_cached_contexts(lazy_copy: Config, tmp_path: Path) -> None:
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    text = "Zyxa Qorv was born in {town}. Zyxa Qorv worked as a baker in {town}."
    for path, town in ((first, "Farrowby"), (second, "Quenton")):
        path.write_text(
            json.dumps({"id": "new-1", "title": "Zyxa Qorv", "text": text.format(town=town)}) + "\n"
        )
    q = Question("Zyxa Qorv was born in [MASK].", "Zyxa Qorv")
    add_articles(first, lazy_copy, progress=False)
    searcher = Searcher.open(lazy_copy.replace(temperature=1.0))  # the tiny model's l (see test_search)
    try:
        assert searcher.answer(q).knn[0].word == "farrowby"
        add_articles(second, lazy_copy, progress=False)  # another process's add, while this one serves
        assert searcher.answer(q).knn[0].word == "quenton"
        with sqlite3.connect(lazy_copy.index / "index.sqlite") as conn:
            rows = conn.execute(
                "SELECT COUNT(*) FROM contexts c JOIN articles a ON a.rowid = c.article WHERE a.id = 'new-1'"
            ).fetchone()[0]
        assert rows == 1
    finally:
        searcher.close()


def test_contexts_of_a_text_replaced_while_encoding_are_not_stored(
    lazy_copy: Config, tmp_path: Path, facts: list[Fact]
) -> None:
    """A query read the old text, an add replaced it, then the query stores: the new text must win."""
    searcher = Searcher.open(lazy_copy)
    try:
        backend = searcher.backend
        assert isinstance(backend, LazyDatastore)
        hit = searcher.retrieve(Question("x [MASK].", facts[0].person.title()))[0]
        todo = backend.store.unencoded([hit.id])
        article = todo[0].article
        path = tmp_path / "new.jsonl"
        path.write_text(json.dumps({"id": hit.id, "title": article.title, "text": "Brand new text."}) + "\n")
        add_articles(path, lazy_copy, progress=False)
        assert backend.store.put_contexts(_encode(searcher, todo, lazy_copy)) == 0
        assert [p.article.text for p in backend.store.unencoded([hit.id])] == ["Brand new text."]
    finally:
        searcher.close()


def test_an_interrupted_encode_stores_nothing_and_the_next_query_finishes_it(
    lazy_copy: Config, facts: list[Fact], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bertknn_search.ingest import contexts as contexts_module

    def interrupted(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    q = Question(f"{facts[1].person.title()} was born in [MASK].", facts[1].person.title())
    searcher = Searcher.open(lazy_copy)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(contexts_module, "encode_rows", interrupted)
            with pytest.raises(KeyboardInterrupt):
                searcher.answer(q)
        assert searcher.backend.stats().encoded_articles == 0
        assert searcher.answer(q).knn[0].word == facts[1].city
    finally:
        searcher.close()


def test_the_cache_budget_evicts_least_recently_used_contexts(
    built_index: Config, lazy_copy: Config, facts: list[Fact]
) -> None:
    probe = Searcher.open(lazy_copy)
    try:
        own = [Question(f"{f.person.title()} was born in [MASK].", f.person.title()) for f in facts[:4]]
        probe.score_batch(own[:1])
        one_article = probe.backend.stats().context_bytes
    finally:
        probe.close()
    budget = int(one_article * 2.5)  # room for two articles of this corpus's size, not three
    searcher = Searcher.open(lazy_copy.replace(cache_size=budget))
    eager = Searcher.open(built_index)
    try:
        for q in own:
            a, b = searcher.answer(q), eager.answer(q)
            assert_same_answer(a, b)  # evicting others never changes an answer
            stats = searcher.backend.stats()
            assert stats.context_bytes <= budget and stats.encoded_articles <= 2
        # The least recently used went first: the first subject's article was evicted, the last kept.
        backend = searcher.backend
        assert isinstance(backend, LazyDatastore)
        ids = [searcher.retrieve(q)[0].id for q in own]
        missing = {p.article.id for p in backend.store.unencoded(ids)}
        assert ids[0] in missing and ids[-1] not in missing
        assert_same_answer(searcher.answer(own[0]), eager.answer(own[0]))  # encoded again on demand
    finally:
        searcher.close()
        eager.close()


def test_two_processes_encoding_one_article_leave_one_copy(lazy_copy: Config, facts: list[Fact]) -> None:
    """Two searchers (separate connections, as two processes have) both find the article unencoded."""
    a, b = Searcher.open(lazy_copy), Searcher.open(lazy_copy)
    try:
        q = Question(f"{facts[2].person.title()} was born in [MASK].", facts[2].person.title())
        ids = [h.id for h in a.retrieve(q)]
        assert isinstance(a.backend, LazyDatastore) and isinstance(b.backend, LazyDatastore)
        todo_a, todo_b = a.backend.store.unencoded(ids), b.backend.store.unencoded(ids)
        assert [(p.article, p.fingerprint) for p in todo_a] == [(p.article, p.fingerprint) for p in todo_b]
        assert len(todo_a) == 1
        assert a.backend.ensure_contexts(ids) > 0
        # b read the same state before a stored; storing its own encoding replaces, never adds.
        stored = b.backend.store.put_contexts(_encode(b, todo_b, lazy_copy))
        assert stored == 1
        stats = b.backend.stats()
        assert stats.encoded_articles == 1
        assert_same_answer(a.answer(q), b.answer(q))
    finally:
        a.close()
        b.close()


def _encode(searcher: Searcher, todo: list, config: Config) -> list:
    """What LazyDatastore.ensure_contexts would store for ``todo``, encoded here by hand."""

    from bertknn_search.ingest.contexts import build_blocks, encode_rows, make_rows
    from bertknn_search.ingest.sentences import split_sentences

    articles = [p.article for p in todo]
    sentences = [split_sentences(a.text) for a in articles]
    rows = make_rows(sentences, searcher.encoder, config.mask_policy, config.max_length)
    blocks = build_blocks(articles, sentences, rows, encode_rows(rows, searcher.encoder, 32), config)
    return [replace(block, fingerprint=p.fingerprint) for block, p in zip(blocks, todo)]


def test_warm_encodes_what_the_questions_need_and_nothing_else(lazy_copy: Config, facts: list[Fact]) -> None:
    from bertknn_search.warm import needed_articles, warm

    qs = questions(facts)
    searcher = Searcher.open(lazy_copy)
    try:
        ids = needed_articles(searcher, qs)
        assert len(ids) == len(set(ids)) and 5 <= len(ids) < searcher.backend.stats().articles
        summary = warm(searcher, ids, progress=False)
        assert (summary.articles, summary.encoded_articles) == (len(ids), len(ids))
        assert summary.contexts == summary.index_contexts > 0
        assert summary.estimated_contexts > summary.index_contexts
        again = warm(searcher, ids, progress=False)
        assert (again.encoded_articles, again.contexts) == (0, 0)
        assert searcher.backend.ensure_contexts(ids) == 0  # questions now run warm
    finally:
        searcher.close()
