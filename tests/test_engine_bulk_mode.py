"""Bulk mode on real OpenSearch and Elasticsearch nodes: the one restore record in the articles index,
a run of writes that refreshes once, the article docs of one write sent as parallel requests.

While an add runs, both indices run without periodic refresh, and the values to put back are recorded
in the articles index's ``_meta`` only: the contexts index's mapping is never updated after it is made
(OpenSearch's k-NN 2.19.1 fails a graph-less shard on a mapping update). Older versions recorded each
index's values in its own ``_meta``; such a record is still restored, and removed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from bertknn_search.backends.engines import backend as engine_module
from bertknn_search.backends.engines import bodies, bulk_mode
from bertknn_search.backends.engines.backend import EngineBackend
from bertknn_search.config import Config
from bertknn_search.records import Article, EncodedArticle
from tests.conftest import drop_indices, engine_config
from tests.test_engine_backend import ARTICLES, META, NO_WAIT, patch_bulk, raw


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(EngineBackend, "retry", NO_WAIT)


@pytest.fixture
def config(engines: Any, engine_name: str) -> Iterator[Config]:
    made = engine_config(Config(), engines, engine_name, "bk-bulk")
    drop_indices(made)
    yield made
    drop_indices(made)


def index_meta(config: Config, kind: str) -> dict[str, Any]:
    name = bodies.index_names(config.opensearch_prefix)[kind]
    return dict(raw(config).indices.get_mapping(index=name)[name]["mappings"].get("_meta", {}))


def index_settings(config: Config, kind: str) -> tuple[str | None, str]:
    name = bodies.index_names(config.opensearch_prefix)[kind]
    found = raw(config).indices.get_settings(index=name)[name]["settings"]["index"]
    return found.get("refresh_interval"), found["number_of_replicas"]


def test_an_add_never_updates_the_contexts_mapping(config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = EngineBackend.create(config, META)
    contexts = bodies.index_names(config.opensearch_prefix)["contexts"]
    updated = spy_indices(backend, monkeypatch, "put_mapping")
    backend.add_articles(ARTICLES[:1])
    # The record of both indices' values is in the articles index's _meta, none in the contexts'.
    record = index_meta(config, "articles")[bodies.RESTORE_KEY]
    assert set(record["indices"]) == set(bodies.index_names(config.opensearch_prefix).values())
    assert bodies.RESTORE_KEY not in index_meta(config, "contexts")
    backend.add_articles(ARTICLES[1:])
    backend.close()
    assert updated and not [name for name in updated if contexts in name.split(",")]
    assert bodies.RESTORE_KEY not in index_meta(config, "articles")
    assert EngineBackend.open(config).meta() == META


@pytest.mark.reliability
def test_the_record_an_older_version_left_in_the_contexts_index_is_restored_and_removed(
    config: Config,
) -> None:
    EngineBackend.create(config, META).close()
    contexts = bodies.index_names(config.opensearch_prefix)["contexts"]
    client = raw(config)
    # An older version's add died in bulk mode: its record in the contexts index's own _meta.
    client.indices.put_settings(
        index=contexts, body={"index": {"refresh_interval": "-1", "number_of_replicas": 2}}
    )
    old = {"owner": "older", "settings": {"refresh_interval": "7s", "number_of_replicas": "2"}}
    client.indices.put_mapping(
        index=contexts, body={"_meta": {**index_meta(config, "contexts"), bodies.RESTORE_KEY: old}}
    )

    backend = EngineBackend.open(config)
    backend.add_articles(ARTICLES[:1])
    assert bodies.RESTORE_KEY not in index_meta(config, "contexts")  # moved to the articles index
    assert index_meta(config, "articles")[bodies.RESTORE_KEY]["indices"][contexts] == old["settings"]
    backend.close()
    assert index_settings(config, "contexts") == ("7s", "2")
    assert bodies.RESTORE_KEY not in index_meta(config, "articles")
    assert EngineBackend.open(config).meta() == META


LAZY = dataclasses.replace(META, contexts="lazy")


def text_only(aid: str, title: str, fingerprint: str = "t1") -> EncodedArticle:
    """An article as a lazy ingest writes it: its text, no contexts."""
    return EncodedArticle(Article(aid, title, f"{title} is a place in Zorbland."), None, fingerprint)


def spy_indices(backend: EngineBackend, monkeypatch: pytest.MonkeyPatch, method: str) -> list[str]:
    """The ``index`` of each call of the client's ``indices.<method>`` from now on (the call still made)."""
    called: list[str] = []
    real = getattr(backend.client.indices, method)

    def spy(**kwargs: Any) -> Any:
        called.append(str(kwargs.get("index")))
        return real(**kwargs)

    monkeypatch.setattr(backend.client.indices, method, spy)
    return called


def spy_refreshes(backend: EngineBackend, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    return spy_indices(backend, monkeypatch, "refresh")


def test_a_run_of_text_only_writes_refreshes_once_at_its_end(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = EngineBackend.create(config, LAZY)
    refreshed = spy_refreshes(backend, monkeypatch)
    with backend.bulk(100, 10_000):
        backend.add_articles([text_only("1", "Quimby"), text_only("2", "Flarn")])
        backend.add_articles([text_only("3", "Zorbland")])
        # Each write is whole and read by id at once (a resumed ingest skips it); searched at the end.
        assert backend.fingerprints(["1", "2", "3"]) == {"1": "t1", "2": "t1", "3": "t1"}
        assert refreshed == []
    assert refreshed == [bodies.index_names(config.opensearch_prefix)["articles"]]
    assert sorted(hit.id for hit in backend.search_articles("zorbland place", 5)) == ["1", "2", "3"]
    backend.close()


def test_a_run_that_fails_still_makes_what_it_wrote_searchable(config: Config) -> None:
    backend = EngineBackend.create(config, LAZY)
    with pytest.raises(RuntimeError), backend.bulk(100, 10_000):
        backend.add_articles([text_only("1", "Quimby")])
        raise RuntimeError("the next chunk could not be read")
    assert [hit.id for hit in backend.search_articles("quimby", 5)] == ["1"]
    backend.close()


def test_a_write_that_replaces_contexts_refreshes_at_once_inside_a_run(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its old contexts are deleted next: readers must see the new article doc before that."""
    backend = EngineBackend.create(config, LAZY)
    backend.add_articles(ARTICLES[:1])  # encoded contexts of article 1
    refreshed = spy_refreshes(backend, monkeypatch)
    with backend.bulk(100, 10_000):
        backend.add_articles([text_only("1", "Zorbland", "t2")])
        assert bodies.index_names(config.opensearch_prefix)["articles"] in refreshed
        assert backend.fingerprints(["1"]) == {"1": "t2"}
    backend.close()


def test_the_article_docs_of_a_large_write_go_out_as_parallel_requests(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "WRITER_MIN_DOCS", 2)
    backend = EngineBackend.create(config, LAZY)
    sent: list[int] = []
    real_bulk = backend.client.bulk

    def bulk(*args: Any, **kwargs: Any) -> Any:
        sent.append(1)
        return real_bulk(*args, **kwargs)

    patch_bulk(monkeypatch, backend, bulk)
    backend.add_articles([text_only(str(i), f"Place {i}") for i in range(6)])
    assert len(sent) == engine_module.ARTICLE_WRITERS == 2
    assert backend.stats().articles == 6
    backend.close()


def segments(config: Config) -> int:
    name = bodies.index_names(config.opensearch_prefix)["articles"]
    found = raw(config).indices.stats(index=name, metric="segments")
    return int(found["_all"]["primaries"]["segments"]["count"])


def force_merges(monkeypatch: pytest.MonkeyPatch, backend: EngineBackend) -> list[str]:
    """The indices ``backend`` asks to force-merge from now on (none is merged)."""
    merged: list[str] = []
    monkeypatch.setattr(backend.client.indices, "forcemerge", lambda **kw: merged.append(kw["index"]))
    return merged


def test_a_run_that_wrote_most_of_the_index_leaves_it_in_one_segment(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The docs' IR terms are left out of ``_source``, so the engine keeps their whole source for
    recovery until a merge: a first ingest merges at its end (a third of the disk at 5,000 articles)."""
    monkeypatch.setattr(bulk_mode, "MERGE_MIN_DOCS", 12)
    backend = EngineBackend.create(config, LAZY)
    with backend.bulk(100, 10_000):
        backend.add_articles([text_only(str(i), f"Place {i}") for i in range(6)])
        raw(config).indices.flush(index=bodies.index_names(config.opensearch_prefix)["articles"])
        backend.add_articles([text_only(str(i), f"Town {i}") for i in range(6, 12)])  # a second segment
    assert segments(config) == 1
    assert backend.stats().articles == 12
    merged = force_merges(monkeypatch, backend)
    monkeypatch.setattr(bulk_mode, "MERGE_MIN_DOCS", 1)  # only the share can hold this run back now
    with backend.bulk(100, 10_000):  # a few articles more: the engine's own merges see to them
        backend.add_articles([text_only("12", "Quimby")])
    assert merged == []
    assert backend.stats().articles == 13
    backend.close()


def test_a_small_first_run_is_left_to_the_engines_own_merges(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``MERGE_MIN_DOCS`` articles the merge costs more of the ingest than the disk it saves."""
    monkeypatch.setattr(bulk_mode, "MERGE_MIN_DOCS", 13)
    backend = EngineBackend.create(config, LAZY)
    merged = force_merges(monkeypatch, backend)
    with backend.bulk(100, 10_000):
        backend.add_articles([text_only(str(i), f"Place {i}") for i in range(6)])
        backend.add_articles([text_only(str(i), f"Town {i}") for i in range(6, 12)])
    assert merged == []
    assert backend.stats().articles == 12  # searchable all the same: the run's refresh
    backend.close()
