"""Parity: the same ingest + questions through the embedded backend and a real engine give the same answers.

Each test runs twice, on a real OpenSearch node (with the k-NN plugin) and a real Elasticsearch node that
the session starts from Maven jars (``conftest.Engines``), or on the clusters at ``OPENSEARCH_URL`` /
``ELASTICSEARCH_URL``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bertknn_search.backends.engines.backend import EngineBackend
from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.ingest.pipeline import add_articles, ingest
from bertknn_search.query.search import Scored, Searcher
from bertknn_search.records import Question

TOLERANCE = 1e-4
QUESTION = "Many people in [MASK] knew Zorblat.\n"


@pytest.fixture
def both(built_index: Config, cluster_config: Config, corpus: Path) -> Iterator[tuple[Searcher, Searcher]]:
    """Searchers over the same corpus: embedded (the session's index) and OpenSearch (ingested here)."""
    ingest(corpus, cluster_config, progress=False)
    embedded, opensearch = Searcher.open(built_index), Searcher.open(cluster_config)
    yield embedded, opensearch
    embedded.close()
    opensearch.close()


def questions(facts: list[Fact], n: int = 6) -> list[Question]:
    """KB questions (subject → own article), free questions (BM25 top-3), one with no match at all, and
    subjects that are no title."""
    qs = []
    for f in facts[:n]:
        qs.append(Question(f"{f.person.title()} was born in [MASK].", f.person.title()))
        qs.append(Question(f"Many people in [MASK] knew {f.person.title()} as a famous {f.job}."))
    qs.append(Question("[MASK] zzzunseen qqqunknown."))
    # Subjects without an article of their title: the BM25 top 3 for the subject, and nothing to search.
    qs.append(Question(f"The famous {facts[0].job} lived in [MASK].", facts[0].job))
    qs.append(Question("It was born in [MASK].", "the"))
    return qs


def assert_same(a: Scored, b: Scored, what: str, rtol: float = 1e-5) -> None:
    """Same articles, neighbours and answers; distances within ``rtol``, probabilities within 1e-4."""
    assert [h.id for h in a.hits or []] == [h.id for h in b.hits or []], what
    np.testing.assert_array_equal(a.neighbors.token_ids, b.neighbors.token_ids, err_msg=what)
    assert a.neighbors.article_ids == b.neighbors.article_ids, what
    np.testing.assert_allclose(a.neighbors.distances, b.neighbors.distances, rtol=rtol, atol=1e-5)
    for name in ("p_knn", "p"):
        np.testing.assert_allclose(
            getattr(a, name), getattr(b, name), atol=TOLERANCE, err_msg=f"{what} {name}"
        )
    assert int(np.argmax(a.p)) == int(np.argmax(b.p)), what


@pytest.mark.opensearch
def test_same_answers_on_both_backends(both: tuple[Searcher, Searcher], facts: list[Fact]) -> None:
    embedded, opensearch = both
    qs = questions(facts)
    found = 0
    for q, a, b in zip(qs, embedded.score_batch(qs), opensearch.score_batch(qs)):
        assert_same(a, b, q.text)
        found += len(a.neighbors) > 0
    assert found >= 12  # the scenarios really reach the kNN step


@pytest.mark.opensearch
def test_same_articles_and_closest_titles_for_subjects_on_both_backends(
    both: tuple[Searcher, Searcher], facts: list[Fact]
) -> None:
    embedded, engine = both
    person, job, city = facts[0].person.title(), facts[0].job, facts[0].city
    for subject in (
        person,
        f" {person.upper()} ",
        job,
        f"{job} of {city}",
        f"xx {city[:4]}",
        "zzzunseen",
        "the",
    ):
        for n in (1, 3):  # ids and titles (the engines' BM25 scores are scaled: test_engine_exact)
            want = [(h.id, h.title) for h in embedded.backend.subject_articles(subject, subject, n)]
            got = engine.backend.subject_articles(subject, subject, n)
            assert [(h.id, h.title) for h in got] == want, (subject, n)
        want = [(h.id, h.title) for h in embedded.backend.closest_titles(subject, 5)]
        assert [(h.id, h.title) for h in engine.backend.closest_titles(subject, 5)] == want, subject
    assert embedded.backend.closest_titles(f"{job} of {city}", 5), "the scenario finds a title by a word"


@pytest.mark.opensearch
def test_same_rankings_and_evidence_on_both_backends(
    both: tuple[Searcher, Searcher], facts: list[Fact]
) -> None:
    embedded, opensearch = both
    qs = questions(facts)[:4]
    for a, b in zip(embedded.answer_batch(qs), opensearch.answer_batch(qs)):
        assert [p.word for p in a.bert_knn] == [p.word for p in b.bert_knn]
        assert [p.word for p in a.knn] == [p.word for p in b.knn]
        assert a.evidence, "the scenario shows supporting sentences"
        assert [e.word for e in a.evidence] == [e.word for e in b.evidence]
        for ea, eb in zip(a.evidence, b.evidence):
            assert [replace(s, distance=0.0) for s in ea.sentences] == [
                replace(s, distance=0.0) for s in eb.sentences
            ]
            np.testing.assert_allclose(
                [s.distance for s in ea.sentences], [s.distance for s in eb.sentences], rtol=1e-5, atol=1e-5
            )


@pytest.mark.opensearch
def test_added_article_answers_the_same_on_both_backends(
    index_copy: Config, cluster_config: Config, corpus: Path, tmp_path: Path
) -> None:
    ingest(corpus, cluster_config, progress=False)
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    text = "Zyxa Qorv was born in {town}. Zyxa Qorv worked as a baker in {town}."
    for path, town in ((first, "Tallinn"), (second, "Quenton")):
        path.write_text(
            json.dumps({"id": "new-1", "title": "Zyxa Qorv", "text": text.format(town=town)}) + "\n"
        )
    for config in (index_copy, cluster_config):
        assert add_articles(first, config, progress=False).articles == 1
        assert add_articles(second, config, progress=False).articles == 1  # a new text replaces the old
    q = [Question("Zyxa Qorv was born in [MASK].", "Zyxa Qorv")]
    embedded, opensearch = Searcher.open(index_copy), Searcher.open(cluster_config)
    try:
        e_stats, o_stats = embedded.backend.stats(), opensearch.backend.stats()
        assert (e_stats.articles, e_stats.contexts) == (o_stats.articles, o_stats.contexts)
        # Counted on the server, not from the article docs: no context of the replaced text is left.
        backend = opensearch.backend
        assert isinstance(backend, EngineBackend)
        response = backend.client.search(
            index=backend.names["contexts"],
            body={"size": 1000, "query": {"term": {"article_id": "new-1"}}, "_source": ["generation"]},
        )
        generations = {h["_source"]["generation"] for h in response["hits"]["hits"]}
        assert (
            len(generations) == 1
            and len(response["hits"]["hits"])
            == embedded.backend.knn(embedded.encode(q)[0][0], 1000, ["new-1"]).distances.shape[0]
        )
        a, b = embedded.score_batch(q)[0], opensearch.score_batch(q)[0]
        assert_same(a, b, q[0].text)
        assert embedded.encoder.vocab[int(np.argmax(a.p_knn))] == "quenton"
    finally:
        embedded.close()
        opensearch.close()


@pytest.mark.opensearch
def test_cli_gives_the_same_answers_on_both_backends(
    base_config: Config, cluster_config: Config, corpus: Path, tmp_path: Path
) -> None:
    """The CLI flags reach the backend: ingest, stats and query through ``bertknn-search`` on each."""
    engine = cluster_config.backend
    flags = {
        "embedded": ["--index", str(tmp_path / "index")],
        "opensearch": [
            "--backend",
            engine,
            f"--{engine}-url",
            str(getattr(cluster_config, f"{engine}_url")),
            "--index-prefix",
            cluster_config.opensearch_prefix,
        ],
    }
    answers, stats = {}, {}
    for name, where in flags.items():
        model = ["--model", base_config.model, "--device", "cpu", "--max-length", "64"]
        r = cli("ingest", "wiki", str(corpus), "--no-progress", *model, *where)
        assert r.exit_code == 0, r.output
        stats[name] = json.loads(cli("stats", "--json", *where).output)
        r = cli("query", "--json", "--temperature", "1", "--file", "-", *where, input=QUESTION)
        assert r.exit_code == 0, r.output
        answers[name] = json.loads(r.output)
    a, b = answers["embedded"], answers["opensearch"]
    assert (stats["embedded"]["contexts"], stats["embedded"]["articles"]) == (
        stats["opensearch"]["contexts"],
        stats["opensearch"]["articles"],
    )
    assert stats["opensearch"]["backend"] == engine
    assert [x["id"] for x in a["articles"]] == [x["id"] for x in b["articles"]]
    assert len(a["articles"]) == 3 and a["n_neighbors"] == b["n_neighbors"] > 0
    for ranking in ("bert_knn", "knn", "bert"):
        assert [p["word"] for p in a[ranking]] == [p["word"] for p in b[ranking]]
        np.testing.assert_allclose(
            [p["prob"] for p in a[ranking]], [p["prob"] for p in b[ranking]], atol=TOLERANCE
        )


def cli(*args: str, input: str | None = None) -> Any:
    from click.testing import CliRunner

    from bertknn_search.cli import main

    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


@pytest.mark.opensearch
def test_a_lazy_opensearch_index_answers_as_the_eager_embedded_one(
    built_index: Config, cluster_config: Config, corpus: Path, facts: list[Fact]
) -> None:
    lazy_config = cluster_config.replace(contexts="lazy", exact=True)
    ingest(corpus, lazy_config, progress=False)
    qs = questions(facts)
    embedded, lazy = Searcher.open(built_index), Searcher.open(lazy_config)
    try:
        assert lazy.backend.stats().contexts == 0
        for q, a, b in zip(qs, embedded.score_batch(qs), lazy.score_batch(qs)):
            # Keys encoded in other batches than at ingest differ in float32 rounding, which can move a
            # float16 stored value by one step: distances agree to 1e-4, answers exactly.
            assert_same(a, b, q.text, rtol=1e-4)
        stats = lazy.backend.stats()
        searched = {h.id for s in lazy.score_batch(qs) for h in s.hits or []}
        assert stats.encoded_articles == len(searched) < stats.articles
        assert stats.estimated_contexts > stats.contexts  # extrapolated to the articles not yet encoded
        # A second process encoding the same articles writes the same context ids: still one copy.
        store = lazy.backend.store  # type: ignore[attr-defined]
        again = Searcher.open(lazy_config)
        try:
            todo = [(a, fp) for a, fp in _texts(store, sorted(searched))]
            from bertknn_search.backends.lazy import LazyDatastore

            assert isinstance(again.backend, LazyDatastore)
            store.put_contexts(_encoded(again, todo, lazy_config))
        finally:
            again.close()
        response = store.client.count(index=store.names["contexts"])
        assert response["count"] == stats.contexts
    finally:
        embedded.close()
        lazy.close()


def _texts(store: EngineBackend, ids: list[str]) -> list[tuple[Any, str]]:
    docs = store._mget(ids, ["title", "text", "fingerprint"], realtime=True)
    from bertknn_search.records import Article

    return [
        (Article(aid, src["title"], src["text"]), src["fingerprint"]) for aid, src in sorted(docs.items())
    ]


def _encoded(searcher: Searcher, todo: list[tuple[Any, str]], config: Config) -> list[Any]:
    from bertknn_search.ingest.contexts import build_blocks, encode_rows, make_rows
    from bertknn_search.ingest.sentences import split_sentences

    articles = [a for a, _ in todo]
    sentences = [split_sentences(a.text) for a in articles]
    rows = make_rows(sentences, searcher.encoder, config.mask_policy, config.max_length)
    blocks = build_blocks(articles, sentences, rows, encode_rows(rows, searcher.encoder, 32), config)
    return [replace(b, fingerprint=fp) for b, (_, fp) in zip(blocks, todo)]


@pytest.mark.opensearch
def test_partial_answers_grow_alike_on_both_backends(
    base_config: Config, cluster_config: Config, corpus: Path, facts: list[Fact], tmp_path: Path
) -> None:
    """A budget encodes the same rows on both backends, their coverage grows alike to the whole article."""
    embedded_config = base_config.replace(index=tmp_path / "lazy", contexts="lazy", budget=7)
    opensearch_lazy = cluster_config.replace(contexts="lazy", budget=7)
    for config in (embedded_config, opensearch_lazy):
        ingest(corpus, config, progress=False)
    q = Question(f"{facts[0].person.title()} was born in [MASK].", facts[0].person.title())
    embedded, opensearch = Searcher.open(embedded_config), Searcher.open(opensearch_lazy)
    try:
        for _ in range(10):
            (a,), (b,) = embedded.score_batch([q]), opensearch.score_batch([q])
            assert a.coverage == b.coverage and a.coverage, (a.coverage, b.coverage)
            e, o = embedded.backend.stats(), opensearch.backend.stats()
            assert (e.partial_articles, e.partial_contexts) == (o.partial_articles, o.partial_contexts)
            assert_same(a, b, q.text, rtol=1e-4)
            if all(c.complete for c in a.coverage.values()):
                break
        assert all(c.complete for c in b.coverage.values())
        store = opensearch.backend.store  # type: ignore[attr-defined]
        count = store.client.count(index=store.names["contexts"])["count"]
        assert count == embedded.backend.stats().contexts == sum(c.total for c in b.coverage.values())
        assert opensearch.backend.stats().encoded_articles == 1
    finally:
        embedded.close()
        opensearch.close()
