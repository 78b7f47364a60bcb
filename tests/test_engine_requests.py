"""What a question costs an engine: requests counted on real OpenSearch and Elasticsearch nodes.

A warm question (its articles encoded, their sentences read once before) is two requests: the IR
search (with a subject, its title lookup and the BM25 search in one ``_msearch``), whose hits carry
what the question needs of its articles, and the kNN search, whose hits carry
the neighbours' stored keys, so that evidence needs no second encoder pass. A subject that is no title
has its closest titles asked in the kNN request (an ``_msearch`` then), or alone where BM25 found no
article to search. The index stores each
article's text once (sentences as offsets into it, terms indexed but not kept) and still ranks
articles the same after their docs are updated.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bertknn_search.backends.base import title_patterns
from bertknn_search.backends.engines.backend import EngineBackend
from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.query.search import Searcher
from bertknn_search.records import Answer, Question, SubjectArticles
from tests.conftest import drop_indices


def engine_of(searcher: Searcher) -> EngineBackend:
    backend = searcher.backend
    store = getattr(backend, "store", backend)  # a lazy index wraps the engine
    assert isinstance(store, EngineBackend)
    return store


class Requests:
    """Counts the HTTP requests an engine client sends (at its transport, below every retry)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import elastic_transport
        import opensearchpy.transport

        self.sent: list[str] = []
        for cls in (opensearchpy.transport.Transport, elastic_transport.Transport):
            original = cls.perform_request

            def counted(self_: Any, method: str, path: str, *args: Any, _o: Any = original, **kw: Any) -> Any:
                self.sent.append(f"{method} {path.split('?')[0]}")
                return _o(self_, method, path, *args, **kw)

            monkeypatch.setattr(cls, "perform_request", counted)

    def during(self, fn: Any) -> tuple[Any, list[str]]:
        before = len(self.sent)
        result = fn()
        return result, self.sent[before:]


def questions(facts: list[Fact]) -> list[Question]:
    out = []
    for f in facts[:3]:
        out.append(Question(f"{f.person.title()} was born in [MASK].", f.person.title()))
        out.append(Question(f"Many people in [MASK] knew {f.person.title()} as a famous {f.job}."))
    # A subject that is no title and no term: no article to search, so its closest titles come alone.
    out.append(Question("The famous [MASK] came from there.", f"{facts[1].person[1:].title()} Qqzz"))
    # A subject with no article of its title: IR is the BM25 top n for the subject, in the same request.
    out.append(Question(f"The famous {facts[0].job} lived in [MASK].", f"{facts[0].job} {facts[0].city}"))
    return out


def limit(question: Question, answer: Answer) -> int:
    """Requests a warm question makes: 2, a subject that is no title too (its closest titles are asked
    in the ``_msearch`` of its kNN search, or alone where there is none)."""
    return 2


def summary(answer: Answer) -> tuple[Any, ...]:
    evidence = [(e.word, [(s.article_id, s.sentence, s.title) for s in e.sentences]) for e in answer.evidence]
    return (
        [a.id for a in answer.articles],
        [(p.word, round(p.prob, 6)) for p in answer.bert_knn[:5]],
        evidence,
        answer.split_words,
    )


@pytest.fixture(params=["eager", "lazy"])
def engine_searcher(
    request: pytest.FixtureRequest, cluster_config: Config, corpus: Path
) -> Iterator[Searcher]:
    config = cluster_config.replace(contexts=request.param)
    ingest(corpus, config, progress=False)
    searcher = Searcher.open(config)
    yield searcher
    searcher.close()


@pytest.mark.opensearch
def test_a_warm_question_is_two_requests_and_one_encoder_pass(
    engine_searcher: Searcher, facts: list[Fact], monkeypatch: pytest.MonkeyPatch
) -> None:
    searcher = engine_searcher
    qs = questions(facts)
    cold = [searcher.answer(q) for q in qs]  # encodes (lazy) and reads each article's sentences once
    assert any(a.evidence for a in cold), "the scenario reaches evidence"
    assert cold[-1].articles and cold[-1].closest_titles, "a subject that is no title: BM25, titles"

    def no_second_pass(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("evidence encoded the neighbours' sentences again")

    monkeypatch.setattr(Searcher, "reencode", no_second_pass)
    requests = Requests(monkeypatch)
    for q, before in zip(qs, cold):
        answer, sent = requests.during(lambda q=q: searcher.answer(q))
        assert len(sent) == limit(q, answer), (q.text, sent)
        assert all(r.endswith(("/_search", "/_msearch")) for r in sent), sent
        # Same articles (BM25 still finds the docs the encode updated), answers and evidence.
        assert summary(answer) == summary(before), q.text


@pytest.mark.opensearch
def test_a_subject_s_articles_in_one_request_are_its_title_s_else_bm25_s(
    cluster_config: Config, corpus: Path, facts: list[Fact], monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest(corpus, cluster_config.replace(contexts="eager"), progress=False)
    backend = EngineBackend.open(cluster_config)
    try:
        person, job, city = facts[1].person.title(), facts[1].job, facts[1].city
        cases = [
            (person, person),
            (f" {person.upper()} ", "x"),
            (job, job),
            (f"{job} {city}", f"{job} {city}"),  # no title; a word of it is one (closest titles)
            (job, "zzzunseen"),
            ("the", "the"),
        ]
        requests = Requests(monkeypatch)
        for subject, query in cases:
            for closest in (0, 5):
                found, sent = requests.during(
                    lambda s=subject, q=query, c=closest: backend.subject_articles(s, q, 3, c)
                )
                own = backend.find_titles(subject, 3)
                assert found.articles == (own or backend.search_articles(query, 3)), (subject, query)
                near = None if own or not closest else backend.closest_titles(subject, closest)
                assert found.closest == near, (subject, query, closest)
                assert len(sent) == 1, sent
        assert backend.subject_articles(job, job, 3).articles, "the scenario reaches BM25"
        assert backend.subject_articles(f"{job} {city}", job, 3, 5).closest, "the scenario names titles"
        assert backend.subject_articles(person, person, 3).articles[0].score == float("inf")

        # A search the engine refused inside the _msearch is asked again alone (its retries, its errors).
        send = backend.client.msearch

        def refused(*args: Any, **kwargs: Any) -> Any:
            body = dict(getattr(answer := send(*args, **kwargs), "body", answer))
            refusal = {"error": {"type": "es_rejected_execution_exception"}, "status": 429}
            body["responses"] = [refusal] * len(body["responses"])
            return body

        monkeypatch.setattr(backend.client, "msearch", refused)
        for subject, query in cases:
            found, sent = requests.during(lambda s=subject, q=query: backend.subject_articles(s, q, 3))
            assert found.articles == (backend.find_titles(subject, 3) or backend.search_articles(query, 3))
            own = bool(found.articles) and found.articles[0].score == float("inf")
            # Asked again: the title lookup, then (a miss) the BM25 search, where the query has terms.
            assert len(sent) == (2 if own or query == "the" else 3)
    finally:
        backend.close()


@pytest.mark.opensearch
def test_a_title_miss_s_closest_titles_ride_its_knn_request_and_a_title_s_requests_carry_none(
    cluster_config: Config, corpus: Path, facts: list[Fact], monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest(corpus, cluster_config.replace(contexts="eager"), progress=False)
    backend = EngineBackend.open(cluster_config)
    try:
        bodies: list[list[dict[str, Any]]] = []  # each _msearch's lines
        send = backend.client.msearch

        def spied(*args: Any, **kwargs: Any) -> Any:
            bodies.append(kwargs["body"])
            return send(*args, **kwargs)

        monkeypatch.setattr(backend.client, "msearch", spied)
        requests = Requests(monkeypatch)
        vector = np.random.default_rng(0).standard_normal(backend.meta().dim).astype(np.float32)
        person, job, city = facts[1].person.title(), facts[1].job, facts[1].city

        def knn(found: SubjectArticles) -> list[str]:
            return requests.during(lambda: backend.knn(vector, 5, [h.id for h in found.articles]))[1]

        # A title: the IR request is its title lookup and BM25 search only, the kNN request a _search.
        found, sent = requests.during(lambda: backend.subject_articles(person, person, 3, 5))
        assert len(sent) == 1 and len(bodies[-1]) == 4 and found.articles[0].score == float("inf")
        assert [r.rsplit("/", 1)[1] for r in knn(found)] == ["_search"] and found.closest is None

        # Two misses (a batch's IR requests), then one kNN request: it carries both subjects' searches.
        misses = [f"{job} {city}", f"{job} of {city}"]
        asked = []
        for subject in misses:
            miss, sent = requests.during(lambda s=subject: backend.subject_articles(s, s, 3, 5))
            assert len(sent) == 1 and len(bodies[-1]) == 4 and miss.articles, subject
            asked.append(miss)
        assert [r.rsplit("/", 1)[1] for r in knn(asked[0])] == ["_msearch"]
        carried = bodies[-1][2:]  # one search a subject, its patterns ranked in it
        assert len(carried) == 2 * len(misses)
        assert all(header["index"] == backend.names["articles"] for header in carried[::2])
        for subject, miss in zip(misses, asked):
            closest, sent = requests.during(lambda m=miss: m.closest)
            assert sent == [] and closest == backend.closest_titles(subject, 5), subject
        assert asked[0].closest, "the scenario names titles"
        # Titles by the first pattern any title holds, only its (one here; the next pattern holds two).
        for subject in [*misses, f"{facts[6].person} rin", "xx rin", "the", "zzzunseen"]:
            patterns = title_patterns(subject)
            want = next((hits for p in patterns if (hits := backend.list_titles(p, 5))), [])
            assert backend.closest_titles(subject, 5) == want, subject
        assert len(backend.closest_titles(f"{facts[6].person} rin", 5)) == 1
        assert len(backend.closest_titles("xx rin", 5)) == 2, "the scenario: a pattern two titles hold"
        assert [r.rsplit("/", 1)[1] for r in knn(asked[0])] == ["_search"], "each is carried once"

        # No article to search, so no kNN request follows: read, its titles are asked alone.
        subject = f"{facts[1].person[1:].title()} Qqzz"
        nothing = backend.subject_articles(subject, subject, 3, 5)
        closest, sent = requests.during(lambda: nothing.closest)
        assert nothing.articles == [] and len(sent) == 1 and closest, sent
        assert closest == backend.closest_titles(subject, 5)
        assert [r.rsplit("/", 1)[1] for r in knn(found)] == ["_search"], "read: no longer waiting"

        # Searches the engine refused in the kNN request are asked again alone (their retries, errors).
        def refusing(first: bool) -> Any:
            def refused(*args: Any, **kwargs: Any) -> Any:
                body = dict(getattr(answer := spied(*args, **kwargs), "body", answer))
                refusal = {"error": {"type": "es_rejected_execution_exception"}, "status": 429}
                answers = body["responses"]
                body["responses"] = (
                    [refusal, *answers[1:]] if first else [answers[0]] + [refusal] * (len(answers) - 1)
                )
                return body

            return refused

        plain = backend.knn(vector, 5, [h.id for h in asked[0].articles])
        for first in (False, True):
            miss = backend.subject_articles(misses[0], misses[0], 3, 5)
            ids = [h.id for h in miss.articles]
            with monkeypatch.context() as patch:
                patch.setattr(backend.client, "msearch", refusing(first))
                neighbours, sent = requests.during(lambda i=ids: backend.knn(vector, 5, i))
            assert list(neighbours.article_ids) == list(plain.article_ids), first
            assert len(sent) == (2 if first else 1), sent
            closest, sent = requests.during(lambda m=miss: m.closest)
            assert closest == backend.closest_titles(misses[0], 5) and len(sent) == (0 if first else 1)
    finally:
        backend.close()


@pytest.mark.opensearch
def test_neighbours_come_with_the_keys_they_were_stored_with(
    engine_searcher: Searcher, facts: list[Fact]
) -> None:
    searcher = engine_searcher
    q = questions(facts)[0]
    scored = searcher.score_batch([q])[0]
    nb = scored.neighbors
    assert len(nb) > 0 and nb.vectors is not None
    # The stored keys are what the distances were computed from: d² between them and the question.
    state, _ = searcher.encode([q])
    d2 = ((nb.vectors - state[0][None, :].astype(np.float32)) ** 2).sum(axis=1)
    np.testing.assert_allclose(d2, nb.distances, rtol=1e-4, atol=1e-4)


@pytest.mark.opensearch
def test_an_article_doc_keeps_its_text_once(cluster_config: Config, corpus: Path) -> None:
    config = cluster_config.replace(contexts="eager")
    ingest(corpus, config, progress=False)
    backend = EngineBackend.open(config)
    try:
        hit = backend.search_articles("born", 1)[0]
        doc = backend._mget([hit.id], ["*"], realtime=False)[hit.id]
        assert "terms" not in doc and "bigrams" not in doc  # indexed, not kept
        assert doc.get("sentences") is None and isinstance(doc["spans"], str)
        sentences = backend.sentences([(hit.id, 0)])
        assert sentences[0] and sentences[0] in doc["text"]
    finally:
        backend.close()


def made_before(load: Any) -> Any:
    """``bodies.load_mapping`` as it was before keys and spans (older indexes)."""

    def old(name: str) -> dict[str, Any]:
        body = load(name)
        mappings = body["mappings"]
        for field in ("key", "spans"):
            mappings["properties"].pop(field, None)
        mappings.pop("_source", None)
        if name.endswith("contexts"):
            mappings["_source"] = {"excludes": ["vector"]}
        if name == "opensearch-contexts":
            body["settings"]["index"] = {"knn": True}
            method = {"name": "hnsw", "space_type": "l2", "engine": "lucene"}
            mappings["properties"]["vector"]["method"] = method
        return body

    return old


@pytest.mark.opensearch
def test_an_index_made_before_answers_as_a_new_one(
    cluster_config: Config, corpus: Path, facts: list[Fact], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bertknn_search.backends.engines import bodies

    new = cluster_config.replace(contexts="lazy")
    old = new.replace(opensearch_prefix=new.opensearch_prefix + "-old")
    with monkeypatch.context() as patch:
        patch.setattr(bodies, "load_mapping", made_before(bodies.load_mapping))
        ingest(corpus, old, progress=False)
    ingest(corpus, new, progress=False)
    before, now = Searcher.open(old), Searcher.open(new)
    try:
        for q in questions(facts):
            assert summary(before.answer(q)) == summary(now.answer(q)), q.text
        assert not engine_of(before)._has_key and engine_of(now)._has_key
    finally:
        before.close()
        now.close()
        drop_indices(old)
