"""What a question costs an engine: requests counted on real OpenSearch and Elasticsearch nodes.

A warm question (its articles encoded, their sentences read once before) is two requests: the IR
search, whose hits carry what the question needs of its articles, and the kNN search, whose hits carry
the neighbours' stored keys, so that evidence needs no second encoder pass. The index stores each
article's text once (sentences as offsets into it, terms indexed but not kept) and still ranks
articles the same after their docs are updated.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bertknn_search.backends.engines.backend import EngineBackend
from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.query.search import Searcher
from bertknn_search.records import Answer, Question
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
    return out


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

    def no_second_pass(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("evidence encoded the neighbours' sentences again")

    monkeypatch.setattr(Searcher, "reencode", no_second_pass)
    requests = Requests(monkeypatch)
    for q, before in zip(qs, cold):
        answer, sent = requests.during(lambda q=q: searcher.answer(q))
        assert len(sent) <= 2, (q.text, sent)
        assert all(r.endswith("/_search") for r in sent), sent
        # Same articles (BM25 still finds the docs the encode updated), answers and evidence.
        assert summary(answer) == summary(before), q.text


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
