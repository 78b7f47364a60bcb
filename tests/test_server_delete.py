"""``delete_articles`` (behind ``DELETE /articles/{id}``) on every backend: the article, its contexts and its
IR entries go, and the rest of the index ranks as if it had never been there."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bertknn_search.backends import open_backend, searchable
from bertknn_search.config import Config
from bertknn_search.demo import Fact, person_text
from bertknn_search.encoding.encoder import Encoder
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.query.search import Searcher
from bertknn_search.records import Article, Question

QUERY = "Zorblat worked as a painter in the north"


@pytest.fixture(params=["embedded", "lazy", "opensearch", "elasticsearch"])
def index(
    request: pytest.FixtureRequest,
    built_index: Config,
    corpus: Path,
    tmp_path: Path,
    make_cluster_config: Any,
) -> Iterator[Config]:
    """A private index of the test corpus, one per backend kind."""
    if request.param == "embedded":
        shutil.copytree(built_index.index, tmp_path / "index")
        yield built_index.replace(index=tmp_path / "index")
        return
    if request.param == "lazy":
        config = built_index.replace(index=tmp_path / "lazy", contexts="lazy")
    else:
        config = make_cluster_config(request.param)
    ingest(corpus, config, progress=False)
    yield config


def test_a_deleted_article_is_gone_and_the_rest_ranks_as_before(index: Config, facts: list[Fact]) -> None:
    searcher = Searcher.open(index)
    backend = searcher.backend
    try:
        zorblat = Question("Zorblat was born in [MASK].", "Zorblat")
        assert searcher.answer(zorblat).articles[0].id == "100"
        before = backend.stats()
        ranked = [(h.id, round(h.score, 5)) for h in backend.search_articles(QUERY, 20)]
        assert ranked[0][0] == "100"

        assert backend.delete_articles(["100", "no-such-id"]) == 1
        assert backend.fingerprints(["100"]) == {}
        assert backend.find_titles("Zorblat", 3) == []
        assert len(backend.knn(searcher.encode([zorblat])[0][0], 5, ["100"])) == 0
        assert {h.id for h in backend.search_articles(QUERY, 20)} == {i for i, _ in ranked} - {"100"}
        after = backend.stats()
        assert after.articles == before.articles - 1
        assert after.contexts < before.contexts or index.contexts == "lazy"
        answer = searcher.answer(zorblat)
        assert all(a.id != "100" for a in answer.articles)
        assert all(s.article_id != "100" for e in answer.evidence for s in e.sentences)
        assert backend.delete_articles(["100"]) == 0
    finally:
        searcher.close()

    # Added back, it is found first again. (Scores differ a little: Lucene and tantivy count a deleted
    # document in the term statistics until its segment is merged, after a replace as after a delete.)
    ingest([Article("100", "Zorblat", person_text(facts[0]))], index, progress=False, existing_only=True)
    again = open_backend(index)
    try:
        hits = again.search_articles(QUERY, 20)
        assert hits[0].id == "100" and {h.id for h in hits} == {i for i, _ in ranked}
    finally:
        again.close()


def test_the_lazy_datastore_delegates_the_delete(built_index: Config, corpus: Path, tmp_path: Path) -> None:
    config = built_index.replace(index=tmp_path / "lazy", contexts="lazy")
    ingest(corpus, config, progress=False)
    encoder = Encoder(config.model, config.layer, "cpu", config.max_length, config.precision)
    lazy = searchable(open_backend(config), encoder, config)
    try:
        assert lazy.ensure_contexts(["100", "101"]) > 0
        assert lazy.delete_articles(["101"]) == 1
        assert lazy.fingerprints(["100", "101"]).keys() == {"100"}
        assert lazy.ensure_contexts(["101"]) == 0  # nothing left to encode: the article is gone
    finally:
        lazy.close()
