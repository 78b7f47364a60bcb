"""EngineBackend on real OpenSearch and Elasticsearch nodes, and on a mocked client for exact call sequences.

Writes, metadata, replacement, settings restore and bulk errors run on both real engines (``cluster_config``
is parametrized over them); the order of requests in a kNN query and the retry paths run on a mocked
OpenSearch client, where a fault can be injected at an exact request. Node loss and refused writes on
real clusters are in ``test_engine_faults.py``; exactness in ``test_engine_exact.py``.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import pytest
from opensearchpy import JSONSerializer
from opensearchpy.exceptions import ConnectionError as OSConnectionError
from opensearchpy.exceptions import TransportError

from bertknn_search.backends.engines import backend as engine_module
from bertknn_search.backends.engines import bodies, dialect_for, neighbors
from bertknn_search.backends.engines import client as engine_client
from bertknn_search.backends.engines.backend import EngineBackend
from bertknn_search.backends.engines.client import RetryPolicy
from bertknn_search.backends.engines.opensearch import OpenSearchDialect
from bertknn_search.backends.engines.reads import STATE_FIELDS
from bertknn_search.config import Config
from bertknn_search.errors import BackendError, IndexCorruptError, IndexMismatchError, IndexNotFoundError
from bertknn_search.records import Article, ArticleHit, ContextBlock, EncodedArticle, IndexMeta
from tests.conftest import drop_indices, engine_config

META = IndexMeta("tiny-bert", 4, 8, 100, "single-wordpiece")
NO_WAIT = RetryPolicy(attempts=3, initial_backoff=0, max_backoff=0)


def article(aid: str, title: str, text: str, n: int, fingerprint: str, seed: int = 0) -> EncodedArticle:
    """An invented article with ``n`` contexts of dim 8 (random but fixed by ``seed``)."""
    rng = np.random.default_rng(seed)
    ints = np.arange(n, dtype=np.int32)
    block = ContextBlock(
        sentences=[f"{title} sentence one.", f"{title} sentence two."],
        vectors=rng.normal(size=(n, 8)).astype(np.float16),
        token_ids=ints + 1000,
        sentence_ids=ints % 2,
        starts=ints * 3,
        ends=ints * 3 + 2,
    )
    return EncodedArticle(Article(aid, title, text), block, fingerprint)


ARTICLES = [
    article("1", "Zorbland", "Zorbland is a country. Its capital is Quimby.", 3, "a1", seed=1),
    article("2", "Quimby", "Quimby is the capital of Zorbland. Quimby has a harbour.", 2, "a2", seed=2),
    article("3", "Flarn River", "The Flarn River flows through Zorbland.", 4, "a3", seed=3),
]


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries without waiting: no test sleeps."""
    monkeypatch.setattr(EngineBackend, "retry", NO_WAIT)


# -- real engines ---------------------------------------------------------------------------------
@pytest.fixture
def config(engines: Any, engine_name: str) -> Iterator[Config]:
    """An empty index pair ``bk-*`` on a real engine (each test runs on OpenSearch and Elasticsearch)."""
    made = engine_config(Config(), engines, engine_name, "bk")
    drop_indices(made)
    yield made
    drop_indices(made)


@pytest.fixture
def backend(config: Config) -> Iterator[EngineBackend]:
    made = EngineBackend.create(config, META)
    yield made
    made.close()


def raw(config: Config) -> Any:
    """The engine's own client, for looking behind the backend's back."""
    return dialect_for(config.backend).client(config)


def connection_error(config: Config) -> Exception:
    """What the engine's client raises when a connection drops."""
    if config.backend == "elasticsearch":
        from elastic_transport import ConnectionError as ESConnectionError

        return ESConnectionError("connection reset by peer")
    return OSConnectionError("N/A", "connection reset", OSError("reset by peer"))


def patch_bulk(monkeypatch: pytest.MonkeyPatch, backend: EngineBackend, bulk: Any) -> None:
    """Route the backend's bulk requests through ``bulk``.

    Elasticsearch's helpers send through ``client.options()``, a copy of the client: it is made to
    return the patched client itself.
    """
    monkeypatch.setattr(backend.client, "bulk", bulk)
    if backend.name == "elasticsearch":
        monkeypatch.setattr(backend.client, "options", lambda **kw: backend.client)


def url(config: Config) -> str:
    return str(getattr(config, f"{config.backend}_url"))


def names(config: Config) -> dict[str, str]:
    return bodies.index_names(config.opensearch_prefix)


def context_ids(config: Config) -> list[str]:
    client = raw(config)
    client.indices.refresh(index=names(config)["contexts"])
    body = {"size": 1000, "query": {"match_all": {}}}
    response = client.search(index=names(config)["contexts"], body=body)
    return sorted(h["_id"] for h in response["hits"]["hits"])


def test_create_writes_meta_and_open_reads_it(config: Config) -> None:
    EngineBackend.create(config, META).close()
    opened = EngineBackend.open(config)
    assert opened.meta() == META
    mappings = raw(config).indices.get_mapping(index="bk-articles,bk-contexts")
    vector = mappings["bk-contexts"]["mappings"]["properties"]["vector"]
    assert vector.get("dimension", vector.get("dims")) == 8
    assert mappings["bk-articles"]["mappings"]["_meta"] == bodies.meta_doc(META)
    assert mappings["bk-contexts"]["mappings"]["_meta"] == bodies.meta_doc(META)
    opened.close()


def test_create_again_keeps_the_data(backend: EngineBackend, config: Config) -> None:
    backend.add_articles(ARTICLES)
    again = EngineBackend.create(config, META)
    assert again.stats().articles == 3
    again.close()


def test_create_with_other_meta_is_a_mismatch(backend: EngineBackend, config: Config) -> None:
    with pytest.raises(IndexMismatchError) as info:
        EngineBackend.create(config, IndexMeta("tiny-bert", 5, 8, 100, "single-wordpiece"))
    assert str(info.value) == (
        f"index at {url(config)}/bk-* was built with layer=4, not 5; use the index's layer or a new --index"
    )


def test_open_without_indices_is_not_found(config: Config) -> None:
    with pytest.raises(
        IndexNotFoundError, match=r"no bertknn-search index at .*\(bk-articles, bk-contexts\)"
    ):
        EngineBackend.open(config)


def test_open_foreign_indices_is_corrupt(config: Config) -> None:
    client = raw(config)
    client.indices.create(index="bk-articles", body={"mappings": {"properties": {"id": {"type": "keyword"}}}})
    client.indices.create(index="bk-contexts", body={"mappings": {"properties": {"id": {"type": "keyword"}}}})
    with pytest.raises(IndexCorruptError, match="no bertknn-search metadata"):
        EngineBackend.open(config)


def test_add_twice_gives_the_same_counts(backend: EngineBackend, config: Config) -> None:
    backend.add_articles(ARTICLES)
    first = backend.stats()
    backend.add_articles(ARTICLES)
    second = backend.stats()
    assert (first.articles, first.sentences, first.contexts) == (3, 6, 9)
    assert (second.articles, second.sentences, second.contexts) == (3, 6, 9)
    assert second.backend == config.backend
    assert second.bytes_on_disk > 0
    assert context_ids(config) == sorted(
        [f"1:a1:{r}" for r in range(3)] + [f"2:a2:{r}" for r in range(2)] + [f"3:a3:{r}" for r in range(4)]
    )


def test_replacing_an_article_removes_its_old_contexts(backend: EngineBackend, config: Config) -> None:
    backend.add_articles(ARTICLES)
    backend.add_articles([article("1", "Zorbland", "Zorbland is a republic.", 2, "b1", seed=9)])
    assert backend.fingerprints(["1", "2", "404"]) == {"1": "b1", "2": "a2"}
    assert [i for i in context_ids(config) if i.startswith("1:")] == ["1:b1:0", "1:b1:1"]
    assert backend.stats().contexts == 8


def test_deletes_past_one_page_of_ids_are_scrolled(
    backend: EngineBackend, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bertknn_search.backends.engines import dialect, elasticsearch, opensearch

    for module in (dialect, opensearch, elasticsearch):  # article 3's 4 old contexts: a page and a scroll
        monkeypatch.setattr(module, "SCAN_PAGE", 2)
    backend.add_articles(ARTICLES)
    backend.add_articles([article("3", "Flarn River", "The Flarn River is dry.", 1, "b3", seed=4)])
    assert [i for i in context_ids(config) if i.startswith("3:")] == ["3:b3:0"]
    assert backend.delete_articles(["1", "3"]) == 2
    assert [i.split(":")[0] for i in context_ids(config)] == ["2", "2"]


def test_requests_are_compressed_only_off_this_machine() -> None:
    from bertknn_search.backends.engines.dialect import Connection

    def remote(url: str) -> bool:
        return Connection(url, None, None, None, True).remote

    assert not remote("http://127.0.0.1:9200") and not remote("http://localhost:9200")
    assert not remote("http://[::1]:9200") and remote("https://search.example.org:9200")


def test_last_copy_of_an_id_in_one_batch_wins(backend: EngineBackend, config: Config) -> None:
    backend.add_articles([ARTICLES[0], article("1", "Zorbland", "Again.", 1, "c1")])
    assert backend.fingerprints(["1"]) == {"1": "c1"}
    assert context_ids(config) == ["1:c1:0"]


def test_reads(backend: EngineBackend) -> None:
    backend.add_articles([*ARTICLES, article("0", "quimby", "A second Quimby, a village.", 1, "z0")])
    own = float("inf")
    assert backend.find_titles("QUIMBY", 3) == [
        ArticleHit("0", "quimby", own),
        ArticleHit("2", "Quimby", own),
    ]
    assert backend.find_titles("QUIMBY", 1) == [ArticleHit("0", "quimby", own)]  # lowest id first
    assert backend.find_titles("Flarn river", 3) == [ArticleHit("3", "Flarn River", own)]
    assert backend.find_titles("Atlantis", 3) == []
    assert backend.titles(["3", "1", "404"]) == {"3": "Flarn River", "1": "Zorbland"}
    assert backend.sentences([("3", 1), ("1", 0), ("1", 7), ("404", 0)]) == [
        "Flarn River sentence two.",
        "Zorbland sentence one.",
        "",
        "",
    ]


def test_search_articles(backend: EngineBackend) -> None:
    backend.add_articles(ARTICLES)
    hits = backend.search_articles("Which river flows through [MASK]?", 3)
    assert [h.id for h in hits] == ["3"]
    assert [h.id for h in backend.search_articles("harbour", 3)] == ["2"]
    assert backend.search_articles("the of and", 3) == []
    assert backend.search_articles("unknownword", 3) == []


def test_wrong_vector_dimension_writes_nothing(backend: EngineBackend) -> None:
    bad = article("9", "Nine", "Nine.", 2, "n9")
    bad = EncodedArticle(bad.article, ContextBlock.empty(4, ["x"]), "n9")
    with pytest.raises(IndexMismatchError, match="has vectors of shape"):
        backend.add_articles([bad])
    assert backend.stats().articles == 0


def test_bulk_rejection_is_one_line_and_hides_the_article(config: Config) -> None:
    # An index whose mapping disagrees with its _meta: the server rejects every context.
    made = dialect_for(config.backend).create_bodies(bodies.meta_doc(META), 4)
    client = raw(config)
    for kind, name in bodies.index_names("bk").items():
        client.indices.create(index=name, body=made[kind])
    backend = EngineBackend.open(config)
    with pytest.raises(BackendError) as info:
        backend.add_articles([ARTICLES[0]])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"{dialect_for(config.backend).title} at {url(config)} rejected 3 of 3 documents while trying to"
        " write contexts (first: index '1:a1:0', status 400, "
    )
    assert "dimension" in message.lower()
    assert backend.fingerprints(["1"]) == {}
    backend.close()


def test_bulk_settings_are_applied_then_restored(backend: EngineBackend, config: Config) -> None:
    def index_settings() -> dict[str, Any]:
        return raw(config).indices.get_settings(index="bk-contexts")["bk-contexts"]["settings"]["index"]

    before = index_settings()
    backend.add_articles(ARTICLES[:1])
    during = index_settings()
    # No periodic refresh while loading, and the replicas kept: a node lost during an add loses nothing.
    assert (during["refresh_interval"], during["number_of_replicas"]) == ("-1", before["number_of_replicas"])
    backend.close()
    after = index_settings()
    assert after.get("refresh_interval") == before.get("refresh_interval")
    assert after["number_of_replicas"] == before["number_of_replicas"]


@pytest.mark.reliability
def test_settings_survive_an_add_that_died_in_bulk_mode(config: Config) -> None:
    first = EngineBackend.create(config, META)
    raw(config).indices.put_settings(index="bk-articles", body={"index": {"number_of_replicas": 2}})
    first.add_articles(ARTICLES[:1])
    first.client.close()  # the process dies: close() never restores
    stuck = raw(config).indices.get_settings(index="bk-articles")["bk-articles"]["settings"]["index"]
    assert (stuck["refresh_interval"], stuck["number_of_replicas"]) == ("-1", "2")

    second = EngineBackend.open(config)
    second.add_articles(ARTICLES[1:2])
    second.close()
    after = raw(config).indices.get_settings(index="bk-articles")["bk-articles"]["settings"]["index"]
    assert after["number_of_replicas"] == "2" and after.get("refresh_interval") != "-1"
    meta = raw(config).indices.get_mapping(index="bk-articles")["bk-articles"]["mappings"]["_meta"]
    assert bodies.RESTORE_KEY not in meta
    assert EngineBackend.open(config).meta() == META


@pytest.mark.reliability
def test_bulk_cut_half_way_is_resent_without_duplicates(
    backend: EngineBackend, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "BULK_CHUNK", 2)  # 9 contexts -> 5 bulk requests
    real_bulk = backend.client.bulk
    calls = {"n": 0}

    def flaky_bulk(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:  # two chunks are already stored when the connection drops
            raise connection_error(config)
        return real_bulk(*args, **kwargs)

    patch_bulk(monkeypatch, backend, flaky_bulk)
    backend.add_articles(ARTICLES)
    assert len(context_ids(config)) == len(set(context_ids(config))) == 9
    assert backend.stats().contexts == 9


@pytest.mark.reliability
def test_add_that_gave_up_can_be_run_again(
    backend: EngineBackend, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "BULK_CHUNK", 2)
    real_bulk = backend.client.bulk
    calls = {"n": 0}

    def dying_bulk(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] >= 2:
            raise connection_error(config)
        return real_bulk(*args, **kwargs)

    patch_bulk(monkeypatch, backend, dying_bulk)
    title = dialect_for(config.backend).title
    with pytest.raises(
        BackendError, match=rf"^cannot reach {title} at .* to write contexts after 3 attempts"
    ):
        backend.add_articles(ARTICLES)
    assert context_ids(config) and backend.fingerprints(["1", "2", "3"]) == {}  # stored, but invisible
    monkeypatch.setattr(backend.client, "bulk", real_bulk)
    backend.add_articles(ARTICLES)
    assert len(context_ids(config)) == len(set(context_ids(config))) == 9


@pytest.mark.reliability
def test_leftovers_of_a_failed_cleanup_are_removed_by_running_again(
    backend: EngineBackend, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.add_articles(ARTICLES[:1])
    real_scan = backend.dialect.scan_ids

    def unreachable(*args: Any) -> Any:
        raise connection_error(config)

    monkeypatch.setattr(backend.dialect, "scan_ids", unreachable)
    replaced = article("1", "Zorbland", "Zorbland is a republic.", 2, "b1", seed=9)
    with pytest.raises(BackendError, match="to delete replaced contexts after 3 attempts"):
        backend.add_articles([replaced])
    assert context_ids(config) == ["1:a1:0", "1:a1:1", "1:a1:2", "1:b1:0", "1:b1:1"]
    # The new version is visible but not settled, so a resumed ingest does it again instead of skipping.
    assert backend.fingerprints(["1"]) == {}
    monkeypatch.setattr(backend.dialect, "scan_ids", real_scan)
    backend.add_articles([replaced])
    assert context_ids(config) == ["1:b1:0", "1:b1:1"]
    assert backend.fingerprints(["1"]) == {"1": "b1"}


@pytest.mark.reliability
def test_overlapping_adds_leave_the_restore_record_to_the_last_one(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    def settings() -> tuple[str, str]:
        s = raw(config).indices.get_settings(index="bk-articles")["bk-articles"]["settings"]["index"]
        return s.get("refresh_interval"), s["number_of_replicas"]

    a = EngineBackend.create(config, META)
    raw(config).indices.put_settings(index="bk-articles", body={"index": {"number_of_replicas": 2}})
    a.add_articles(ARTICLES[:1])  # a enters bulk mode and records replicas 2
    b = EngineBackend.open(config)
    real_get_mapping = a.client.indices.get_mapping

    def b_enters_meanwhile(**kwargs: Any) -> Any:
        # a has put its settings back and is about to drop the record: b starts bulk loading now.
        b.add_articles(ARTICLES[1:2])
        return real_get_mapping(**kwargs)

    monkeypatch.setattr(a.client.indices, "get_mapping", b_enters_meanwhile)
    a.close()  # the record is b's now: a leaves it
    assert settings() == ("-1", "2")
    b.client.close()  # b dies in bulk mode
    later = EngineBackend.open(config)
    later.add_articles(ARTICLES[2:3])
    later.close()
    assert settings()[1] == "2" and settings()[0] != "-1"


# -- mocked client: kNN and faults ----------------------------------------------------------------
SECRET = "s3cret-pw"


@pytest.fixture
def mocked(monkeypatch: pytest.MonkeyPatch) -> EngineBackend:
    """A backend on a mocked client of a cluster that answered before in this process: connection
    errors are retried there (``test_engine_urls.py`` has a URL where nothing ever answered)."""
    monkeypatch.setattr(engine_client, "ANSWERED", {"https://search.example.org:9200"})
    config = Config(
        backend="opensearch",
        opensearch_url="https://search.example.org:9200",
        opensearch_user="admin",
        opensearch_password=SECRET,
        opensearch_prefix="bk",
    )
    client = mock.MagicMock()
    client.transport.serializer = JSONSerializer()  # streaming_bulk serialises through it
    return EngineBackend(client, config, META, OpenSearchDialect())


def mget_response(fingerprints: dict[str, str]) -> dict[str, Any]:
    return {
        "docs": [{"_id": a, "found": True, "_source": {"fingerprint": f}} for a, f in fingerprints.items()]
    }


def knn_hit(article_id: str, d2: float, sentence: int, start: int, token: int, gen: str) -> dict[str, Any]:
    source = {
        "article_id": article_id,
        "generation": gen,
        "token_id": token,
        "sentence_id": sentence,
        "start": start,
        "end": start + 2,
    }
    return {"_score": float(np.float32(1 / (1 + d2))), "_source": source}


def counted(hits: list[dict[str, Any]], counts: dict[str, int]) -> dict[str, Any]:
    """A kNN answer with the per-generation counts ``neighbors.knn_extras`` asks for."""
    buckets = [{"key": g, "doc_count": n} for g, n in counts.items()]
    return {"hits": {"hits": hits}, "aggregations": {neighbors.GENERATION_COUNTS: {"buckets": buckets}}}


def whole_doc(fingerprint: str, n: int, title: str = "T") -> dict[str, Any]:
    return {"title": title, "fingerprint": fingerprint, "encoded": f"1:{fingerprint}", "n_contexts": n}


def test_knn_filters_on_the_generations_of_the_article_docs(mocked: EngineBackend) -> None:
    mocked.client.mget.return_value = mget_response({"1": "a1", "3": "a3"})
    mocked.client.search.return_value = {
        "hits": {"hits": [knn_hit("3", 0.5, 0, 0, 7, "3:a3"), knn_hit("1", 2.0, 1, 4, 8, "1:a1")]}
    }
    query = np.arange(8, dtype=np.float32)
    got = mocked.knn(query, 2, ["3", "1", "404", "1"])
    # Articles no IR answer returned: their docs are read once, before the search.
    mocked.client.mget.assert_called_once_with(
        index="bk-articles", body={"ids": ["1", "3", "404"]}, _source_includes=STATE_FIELDS, realtime=False
    )
    gens = ["1:a1", "3:a3"]
    mocked.client.search.assert_called_once_with(
        index="bk-contexts",
        body=neighbors.knn_extras(mocked.dialect.knn_exact_body(query, 2, gens), gens, keys=False),
        allow_partial_search_results=False,  # every shard answers, or the search is refused and retried
    )
    assert got.article_ids == ["3", "1"]
    np.testing.assert_allclose(got.distances, [0.5, 2.0], rtol=1e-6)
    assert got.token_ids.tolist() == [7, 8]


def test_a_warm_question_reads_nothing_besides_its_two_searches(mocked: EngineBackend) -> None:
    found = {"_id": "1", "_score": 2.0, "_source": whole_doc("a1", 1, "Zorbland")}
    mocked.client.search.side_effect = [
        {"hits": {"hits": [found]}},
        counted([knn_hit("1", 0.5, 0, 0, 7, "1:a1")], {"1:a1": 1}),
    ]
    assert [h.id for h in mocked.search_articles("Zorbland", 3)] == ["1"]
    got = mocked.knn(np.zeros(8, dtype=np.float32), 2, ["1"])
    assert mocked.titles(["1"]) == {"1": "Zorbland"}
    mocked.client.mget.assert_not_called()  # generations, counts and titles came with the IR answer
    sent = mocked.client.search.call_args.kwargs["body"]
    assert sent["query"]["script_score"]["query"]["bool"]["filter"] == [{"terms": {"generation": ["1:a1"]}}]
    assert got.token_ids.tolist() == [7]
    # The sentences: read once for the generation, then kept.
    mocked.client.mget.return_value = {
        "docs": [{"_id": "1", "found": True, "_source": {"fingerprint": "a1", "sentences": ["Zorbland is."]}}]
    }
    assert mocked.sentences([("1", 0)]) == mocked.sentences([("1", 0), ("1", 3)])[:1] == ["Zorbland is."]
    assert mocked.client.mget.call_count == 1


@pytest.mark.reliability
def test_knn_searches_again_when_an_article_was_replaced_meanwhile(mocked: EngineBackend) -> None:
    # The IR answer named "1:a1" with 2 contexts; an add replaces it and deletes 1:a1 while the kNN
    # search runs: it counts 0 of them, reads the doc ("1:b1") and searches again.
    mocked._cache.record([("1", whole_doc("a1", 2))])
    mocked.client.mget.side_effect = [mget_response({"1": "b1"})]
    mocked.client.search.side_effect = [
        counted([], {}),
        counted([knn_hit("1", 0.5, 0, 0, 7, "1:b1")], {}),
    ]
    got = mocked.knn(np.zeros(8, dtype=np.float32), 2, ["1"])
    bodies_sent = [c.kwargs["body"] for c in mocked.client.search.call_args_list]
    assert [b["query"]["script_score"]["query"]["bool"]["filter"] for b in bodies_sent] == [
        [{"terms": {"generation": ["1:a1"]}}],
        [{"terms": {"generation": ["1:b1"]}}],
    ]
    assert got.token_ids.tolist() == [7]


def test_knn_with_a_generation_whole_needs_no_second_read(mocked: EngineBackend) -> None:
    mocked._cache.record([("1", whole_doc("a1", 2))])
    mocked.client.search.return_value = counted([knn_hit("1", 0.5, 0, 0, 7, "1:a1")], {"1:a1": 2})
    assert mocked.knn(np.zeros(8, dtype=np.float32), 2, ["1"]).token_ids.tolist() == [7]
    mocked.client.mget.assert_not_called()
    assert mocked.client.search.call_count == 1


def test_knn_replaced_on_every_try_keeps_what_it_searched(mocked: EngineBackend) -> None:
    docs = [{"docs": [{"_id": "1", "found": True, "_source": whole_doc(f"g{i}", 5)}]} for i in range(1, 7)]
    mocked.client.mget.side_effect = docs
    mocked.client.search.side_effect = [
        counted([knn_hit("1", 0.5, 0, 0, 7, f"1:g{i}")], {}) for i in range(3)
    ]
    mocked._cache.record([("1", whole_doc("g0", 5))])
    got = mocked.knn(np.zeros(8, dtype=np.float32), 2, ["1"])
    assert mocked.client.search.call_count == 3
    assert got.token_ids.tolist() == [7]  # the hits of the last search, under the generation it asked for


def test_knn_hits_carry_their_stored_keys(mocked: EngineBackend) -> None:
    mocked._has_key = True
    mocked._cache.record([("1", whole_doc("a1", 1))])
    key = np.linspace(-1, 1, 8).astype(np.float16)
    hit = knn_hit("1", 0.5, 0, 0, 7, "1:a1") | {
        "fields": {"key": [base64.b64encode(key.tobytes()).decode().rstrip("=")]}  # OpenSearch: no padding
    }
    mocked.client.search.return_value = counted([hit], {"1:a1": 1})
    got = mocked.knn(np.zeros(8, dtype=np.float32), 2, ["1"])
    assert mocked.client.search.call_args.kwargs["body"]["docvalue_fields"] == [*bodies.CONTEXT_FIELDS, "key"]
    assert got.vectors is not None
    np.testing.assert_array_equal(got.vectors, key.astype(np.float32)[None, :])


def test_knn_with_no_known_article_asks_nothing(mocked: EngineBackend) -> None:
    mocked.client.mget.return_value = {"docs": [{"_id": "404", "found": False}]}
    assert len(mocked.knn(np.zeros(8), 5, ["404"])) == 0
    mocked.client.search.assert_not_called()


def test_knn_without_ir_is_approximate_and_drops_stale_generations(mocked: EngineBackend) -> None:
    mocked._has_graph = True  # an index made for the no-IR search
    mocked.client.search.return_value = {
        "hits": {"hits": [knn_hit("1", 0.1, 0, 0, 5, "1:old"), knn_hit("1", 0.3, 0, 3, 6, "1:a1")]}
    }
    mocked.client.mget.return_value = mget_response({"1": "a1"})
    got = mocked.knn(np.zeros(8), 2)
    assert mocked.client.search.call_args.kwargs["body"]["query"] == {
        "knn": {"vector": {"vector": [0.0] * 8, "k": 2, "method_parameters": {"ef_search": 256}}}
    }
    assert got.token_ids.tolist() == [6]


def test_knn_without_ir_and_without_a_graph_is_exact_over_every_context(mocked: EngineBackend) -> None:
    mocked.client.search.return_value = {"hits": {"hits": [knn_hit("1", 0.3, 0, 3, 6, "1:a1")]}}
    mocked.client.mget.return_value = mget_response({"1": "a1"})
    assert mocked.knn(np.zeros(8), 2).token_ids.tolist() == [6]
    sent = mocked.client.search.call_args.kwargs["body"]["query"]["script_score"]
    assert sent["query"] == {"match_all": {}} and sent["script"]["source"] == "knn_score"


@pytest.mark.reliability
@pytest.mark.parametrize(
    "fault",
    [
        OSConnectionError("N/A", "refused", OSError("Connection refused")),
        TransportError(429, "too_many_requests", "slow down"),
        TransportError(500, "internal_server_error", "boom"),
        TransportError(503, "unavailable", "no cluster manager"),
    ],
)
def test_transient_faults_are_retried(mocked: EngineBackend, fault: Exception) -> None:
    ok = {"hits": {"hits": [{"_id": "2", "_score": 1.5, "_source": {"title": "Quimby"}}]}}
    mocked.client.search.side_effect = [fault, fault, ok]
    assert mocked.search_articles("Quimby harbour", 3) == [ArticleHit("2", "Quimby", 1.5)]
    assert mocked.client.search.call_count == 3
    assert mocked.client.search.call_args.kwargs["search_type"] == "dfs_query_then_fetch"


@pytest.mark.reliability
def test_an_answer_from_part_of_the_shards_is_retried_then_refused(mocked: EngineBackend) -> None:
    partial = {
        "_shards": {
            "total": 3,
            "successful": 2,
            "failed": 1,
            "failures": [{"reason": {"type": "node_lost"}}],
        },
        "hits": {"hits": []},
    }
    whole = {"_shards": {"total": 3, "successful": 3, "failed": 0}, "hits": {"hits": []}}
    mocked.client.search.side_effect = [partial, whole]
    assert mocked.search_articles("Quimby", 3) == []  # the second try had every shard
    mocked.client.search.side_effect = [partial] * 3
    with pytest.raises(BackendError) as info:
        mocked.search_articles("Quimby", 3)
    assert str(info.value) == (
        "OpenSearch at https://search.example.org:9200 could not search articles from every shard after 3"
        " attempts (1 of 3 shards of bk-articles failed (node_lost)); a node is down or recovering: check"
        " the cluster's health, then run the command again"
    )
    mocked.client.mget.return_value = {"docs": [{"_id": "1", "error": {"type": "no_shard_available"}}]}
    with pytest.raises(BackendError, match="1 documents of bk-articles could not be read"):
        mocked.titles(["1"])


@pytest.mark.reliability
def test_a_write_block_is_said_as_such_and_not_retried(mocked: EngineBackend) -> None:
    block = TransportError(
        429,
        "cluster_block_exception",
        {
            "error": {
                "type": "cluster_block_exception",
                "reason": "index [bk-articles] blocked by: [TOO_MANY_REQUESTS/12/disk usage exceeded"
                " flood-stage watermark, index has read-only-allow-delete block]",
            }
        },
    )
    mocked.client.indices.get_settings.return_value = {}
    mocked.client.indices.get_mapping.return_value = {}
    mocked.client.indices.put_mapping.side_effect = block
    with pytest.raises(BackendError) as info:
        mocked.add_articles([ARTICLES[0]])
    assert mocked.client.indices.put_mapping.call_count == 1  # a block is no overload: no retries
    line = str(info.value)
    assert "the engine's disk is full: index bk-articles refuses writes" in line, line
    assert "overloaded" not in line, line
    assert "free disk space first" in line, line
    assert (  # the request that lifts it, on the cluster's URL
        "curl -X PUT 'https://search.example.org:9200/bk-articles/_settings' -H 'Content-Type:"
        """ application/json' -d '{"index.blocks.read_only_allow_delete": null}'""" in line
    ), line


@pytest.mark.reliability
def test_a_create_index_block_is_said_as_such_and_not_retried(mocked: EngineBackend) -> None:
    """OpenSearch's create-index block (set after a flood-stage watermark) is a 403: it was said as a
    matter of OPENSEARCH_USER / OPENSEARCH_PASSWORD and retried before."""
    block = TransportError(
        403,
        "index_create_block_exception",
        {
            "error": {
                "type": "index_create_block_exception",
                "reason": "blocked by: [FORBIDDEN/10/cluster create-index blocked (api)];",
            }
        },
    )
    mocked.client.indices.put_mapping.side_effect = block
    with pytest.raises(BackendError) as info:
        mocked._call("create index bk-articles", lambda: mocked.client.indices.put_mapping())
    line = str(info.value)
    assert mocked.client.indices.put_mapping.call_count == 1
    assert "the cluster refuses to create indices (cluster.blocks.create_index" in line, line
    assert """'{"persistent": {"cluster.blocks.create_index": null}}'""" in line, line
    assert "PASSWORD" not in line, line


@pytest.mark.reliability
def test_giving_up_is_one_line_without_secrets(mocked: EngineBackend) -> None:
    mocked.client.search.side_effect = OSConnectionError("N/A", "refused", OSError("Connection refused"))
    with pytest.raises(BackendError) as info:
        mocked.search_articles("Quimby", 3)
    assert mocked.client.search.call_count == 3
    assert str(info.value) == (
        "cannot reach OpenSearch at https://search.example.org:9200 to search articles after 3 attempts"
        " (ConnectionError: Connection refused); check that the cluster is up and OPENSEARCH_URL is right"
    )
    assert SECRET not in str(info.value)


@pytest.mark.reliability
def test_bad_requests_are_not_retried(mocked: EngineBackend) -> None:
    mocked.client.search.side_effect = TransportError(
        400,
        "search_phase_execution_exception",
        {"error": {"type": "parsing_exception", "reason": "bad\nquery"}},
    )
    with pytest.raises(BackendError) as info:
        mocked.search_articles("Quimby", 3)
    assert mocked.client.search.call_count == 1
    assert str(info.value) == (
        "OpenSearch at https://search.example.org:9200 failed to search articles: HTTP 400 parsing_exception:"
        " bad query; the engine refused the request as it says; please report it with this line if it"
        " persists"
    )  # no "check the indices were made by this version": no mapping check failed
    mocked.client.search.side_effect = TransportError(
        400,
        "search_phase_execution_exception",
        {
            "error": {
                "type": "search_phase_execution_exception",
                "reason": "all shards failed",
                "root_cause": [{"type": "query_shard_exception", "reason": "No mapping found for [terms]"}],
            }
        },
    )
    with pytest.raises(BackendError) as info:
        mocked.search_articles("Quimby", 3)
    assert "all shards failed (query_shard_exception: No mapping found for [terms])" in str(info.value)
    mocked.client.search.side_effect = TransportError(
        400,
        "strict_dynamic_mapping_exception",
        {"error": {"type": "strict_dynamic_mapping_exception", "reason": "[n_parts] not allowed"}},
    )
    with pytest.raises(BackendError, match="check the indices were made by this version"):
        mocked.search_articles("Quimby", 3)


@pytest.mark.reliability
def test_bulk_500_then_success_is_retried(mocked: EngineBackend) -> None:
    mocked.client.indices.get_settings.return_value = {}
    mocked.client.search.return_value = {"hits": {"hits": []}}  # no stale contexts
    replies: list[Any] = [TransportError(500, "internal", "boom")]

    def bulk(body: str, **kwargs: Any) -> dict[str, Any]:
        if replies:
            raise replies.pop()
        lines = body.strip().split("\n")[::2]  # action lines; the documents are in between
        return {"errors": False, "items": [{"index": {"status": 201}} for _ in lines]}

    mocked.client.bulk.side_effect = bulk
    mocked.add_articles([ARTICLES[0]])
    sent = [call.kwargs["body"] for call in mocked.client.bulk.call_args_list]
    assert len(sent) == 4  # contexts (500), contexts again, the article, the article settled
    assert sent[0] == sent[1]
    assert '"_id":"1:a1:0"' in sent[1]
    assert sent[2].startswith('{"index":{"_id":"1","_index":"bk-articles"}}\n{"id":"1",')
    # The terms again: the doc is re-indexed from its _source, which does not keep them.
    action, doc = sent[3].strip().split("\n")
    assert action.startswith('{"update":{"_id":"1","_index":"bk-articles"')
    assert doc == '{"doc":{"settled":true,"terms":"zorbland zorbland is a country its capital is quimby"}}'
    scanned = mocked.client.search.call_args.kwargs
    assert scanned["index"] == "bk-contexts"
    assert scanned["body"]["query"] == bodies.stale_contexts_query([ARTICLES[0]])["query"]


def test_a_first_write_of_an_article_indexes_its_doc_once(mocked: EngineBackend) -> None:
    # No contexts of another generation: the doc is written settled, with no update re-indexing it.
    mocked.client.indices.get_settings.return_value = {}
    mocked.client.search.return_value = {"hits": {"hits": []}, "aggregations": {"stale": {"buckets": []}}}
    mocked.client.bulk.side_effect = lambda body, **kw: {
        "errors": False,
        "items": [{"index": {"status": 201}} for _ in body.strip().split("\n")[::2]],
    }
    mocked.add_articles([ARTICLES[0]])
    sent = [call.kwargs["body"] for call in mocked.client.bulk.call_args_list]
    assert len(sent) == 2  # the contexts, the article
    assert '"settled":true' in sent[1] and '"update"' not in "".join(sent)
    assert mocked.client.search.call_count == 1  # the count of replaced contexts; no scan to delete


@pytest.mark.reliability
def test_documents_without_an_active_shard_are_sent_again(mocked: EngineBackend) -> None:
    """Per-document 503s (a primary lost with its node, its replica not yet promoted) send the batch again,
    where they were "rejected ... fix the input" before; other per-document refusals are not retried."""
    mocked.client.indices.get_settings.return_value = {}
    mocked.client.search.return_value = {"hits": {"hits": []}}
    lost = {
        "status": 503,
        "error": {"type": "unavailable_shards_exception", "reason": "primary shard is not active"},
    }
    replies = ["lost"]

    def bulk(body: str, **kwargs: Any) -> dict[str, Any]:
        lines = body.strip().split("\n")[::2]
        if replies:
            replies.pop()
            return {"errors": True, "items": [{"index": {"_id": "x", **lost}} for _ in lines]}
        return {"errors": False, "items": [{"index": {"status": 201}} for _ in lines]}

    mocked.client.bulk.side_effect = bulk
    mocked.add_articles([ARTICLES[0]])
    sent = [call.kwargs["body"] for call in mocked.client.bulk.call_args_list]
    assert sent[0] == sent[1] and '"_id":"1:a1:0"' in sent[0]  # the contexts, twice
    refused = {"status": 400, "error": {"type": "document_parsing_exception", "reason": "bad"}}
    mocked.client.bulk.reset_mock()
    mocked.client.bulk.side_effect = lambda body, **kw: {
        "errors": True,
        "items": [{"index": {"_id": "x", **refused}} for _ in body.strip().split("\n")[::2]],
    }
    with pytest.raises(BackendError, match="rejected"):
        mocked.add_articles([ARTICLES[1]])
    assert mocked.client.bulk.call_count == 1
