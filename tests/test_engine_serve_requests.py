"""What a warm question through the HTTP server costs an engine: requests counted on real nodes.

The server answers on threads of its own (a batch's task, the IR search beside the encoder) and checks
its engine for ``/health``: none of that may add a request to the two of a warm question asked in
process (``test_engine_requests``), and the answers are the embedded index's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question
from bertknn_search.server.app import ServerSettings, create_app
from tests.test_engine_requests import Requests, limit, questions

LOCAL = "http://localhost"  # a Host the server answers for (see hosts.py)


def ask(client: TestClient, question: Question) -> dict[str, Any]:
    asked = {"question": question.text, "subject": question.subject}
    reply = client.post("/query", json={"questions": [asked]})
    assert reply.status_code == 200, reply.text
    return dict(reply.json()["answers"][0])


@pytest.mark.opensearch
def test_a_warm_question_through_the_server_is_two_requests_with_embedded_answers(
    cluster_config: Config,
    corpus: Path,
    built_index: Config,
    facts: list[Fact],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = cluster_config.replace(contexts="eager")
    ingest(corpus, config, progress=False)
    embedded = Searcher.open(built_index)  # the same corpus and model, stored in the embedded index
    try:
        with TestClient(create_app(ServerSettings(config)), base_url=LOCAL) as client:
            batcher = client.app.state.batcher  # type: ignore[attr-defined]
            assert batcher.done.wait(120) and batcher.error is None, batcher.error
            qs = questions(facts)
            for q in qs:
                ask(client, q)  # each article's sentences are read once, then kept
            requests = Requests(monkeypatch)
            for q in qs:
                before = len(requests.sent)
                answer = ask(client, q)
                sent = requests.sent[before:]
                expected = embedded.answer(q)
                assert len(sent) <= limit(q, expected), (q.text, sent)
                assert all(r.endswith(("/_search", "/_msearch")) for r in sent), sent
                assert answer["closest_titles"] == expected.closest_titles
                assert [p["word"] for p in answer["bert_knn"][:5]] == [p.word for p in expected.bert_knn[:5]]
                assert [a["id"] for a in answer["articles"]] == [a.id for a in expected.articles]
            # A load balancer's health check reaches the node with a TCP connection, not a request.
            before = len(requests.sent)
            assert client.get("/health").json()["status"] == "ready"
            assert requests.sent[before:] == []
    finally:
        embedded.close()
