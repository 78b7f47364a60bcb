"""EngineBackend: articles (BM25) and their contexts (vectors) in two indices of OpenSearch or Elasticsearch.

Visibility: an article's contexts are written under a new generation (``<id>:<fingerprint>``) first, then
its article doc naming that generation, then older generations are deleted. Readers look the generation
up in the article doc and filter on it, so an article is never half-visible and a replaced article never
mixes old and new contexts. Shared request bodies live in ``engine_bodies``, retries and messages in
``engine_client``; what the two engines do differently (their client, vector mapping and kNN bodies) is
the dialects' (``dialect.py``, ``opensearch.py``, ``elasticsearch.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar

import numpy as np

from bertknn_search.backends.base import check_meta, extrapolate
from bertknn_search.backends.engines import bodies, dialect_for, neighbors, subject_search
from bertknn_search.backends.engines.articles import EngineArticleSide
from bertknn_search.backends.engines.bulk_mode import EngineBulkMode
from bertknn_search.backends.engines.client import (
    RetryPolicy,
    bulk_error_message,
    call,
    connect,
    refusals,
    unavailable_shards,
)
from bertknn_search.backends.engines.contexts import EngineContextSide
from bertknn_search.backends.engines.dialect import Dialect, PartialAnswer, public_url, whole_answer
from bertknn_search.backends.engines.heal import retry_failed_shards
from bertknn_search.backends.engines.reads import (
    SENTENCE_FIELDS,
    STATE_FIELDS,
    ArticleCache,
    ArticleState,
    stored_sentences,
)
from bertknn_search.config import Config
from bertknn_search.errors import BackendError, IndexMismatchError, IndexNotFoundError
from bertknn_search.records import (
    EncodedArticle,
    IndexMeta,
    IndexStats,
    Neighbors,
)

T = TypeVar("T")
# A _bulk request ends at whichever comes first: 2,000 docs or 8 MiB of JSON (about 800 contexts at dim
# 768 with their keys, or 400 lazy articles of Wikipedia's mean length), far under the 100 MB an engine
# takes by default (http.max_content_length); fewer, larger requests cost less per doc than 500 each.
BULK_CHUNK = 2000
BULK_BYTES = 8 * 1024 * 1024
# The article docs of one add go out as up to 2 bulk requests at once (each of at least 200 docs): the
# engine indexes each request on one thread, and a node of 2 cores or more then indexes on two.
ARTICLE_WRITERS = 2
WRITER_MIN_DOCS = 200
MGET_CHUNK = 1000
GENERATION_RETRIES = 3  # searches of one kNN query while the articles it searches are being replaced


class EngineBackend(EngineArticleSide, EngineContextSide, EngineBulkMode):
    """The OpenSearch or Elasticsearch backend: ``<prefix>-articles`` and ``<prefix>-contexts``."""

    retry: ClassVar[RetryPolicy] = RetryPolicy()

    def __init__(self, client: Any, config: Config, meta: IndexMeta, engine: Dialect) -> None:
        self.client = client
        self.dialect = engine
        self.url = public_url(engine.connection(config).url or "")
        self.prefix = config.opensearch_prefix
        self.names = bodies.index_names(self.prefix)
        self._meta = meta
        self._restore: dict[str, dict[str, Any]] | None = None  # settings to put back after bulk loading
        self._token = uuid.uuid4().hex  # names this writer in the restore record it holds
        self._in_run, self._unrefreshed, self._run_docs = False, False, 0  # a run of writes (``bulk``)
        self._has_popularity = False  # in the articles mapping (read at open; older indexes lack it)
        self._has_parts = False  # the part fields likewise
        # What the last searches said of their articles (generation, title, coverage) and the sentences
        # read: a warm question asks the engine for its IR answer and its kNN search, nothing else.
        self._cache = ArticleCache()
        self._waiting = subject_search.Waiting()  # closest titles the next kNN search asks (articles.py)
        self._healed = False  # failed shards were allocated again once (``_call``)
        self._has_key = False  # the contexts carry their stored key as doc values (older indexes: no)
        self._has_spans = False  # the articles keep sentences as offsets into their text (likewise)
        self._has_graph = False  # an HNSW graph for the no-IR search (OpenSearch, made with --no-ir-graph)
        self._neighbour_articles: list[str] = []  # of the last kNN answer: their sentences come next

    @property
    def name(self) -> str:
        return self.dialect.name

    # -- opening ----------------------------------------------------------------------------------
    @classmethod
    def create(cls, config: Config, meta: IndexMeta) -> EngineBackend:
        """Create both indices with ``meta`` (those that exist are kept) and open them.

        Raises:
            IndexMismatchError: the indices exist and were built with other encoding settings.
            IndexCorruptError, BackendError, ConfigError: see ``open``.
        """
        engine = dialect_for(config.backend)
        client = connect(engine, config, cls.retry)  # checks what answers, once a process
        url = public_url(engine.connection(config).url or "")
        names = bodies.index_names(config.opensearch_prefix)
        made = engine.create_bodies(bodies.meta_doc(meta), meta.dim)
        # Both at once: each waits for its shards to start, which the engine does in parallel.
        with ThreadPoolExecutor(max_workers=len(made), thread_name_prefix="create") as pool:
            done = [
                pool.submit(
                    call,
                    f"create index {names[k]}",
                    url,
                    _create_index(engine, client, names[k], body),
                    cls.retry,
                    engine,
                )
                for k, body in made.items()
            ]
        for future in done:
            future.result()
        backend = cls._open(client, config, engine)
        try:
            check_meta(backend.meta(), meta, backend.location)
        except IndexMismatchError:
            client.close()
            raise
        return backend

    @classmethod
    def open(cls, config: Config) -> EngineBackend:
        """Open existing indices; the caller compares the model and layer with its config.

        Raises:
            IndexNotFoundError: either index is missing.
            IndexCorruptError: ``_meta`` is missing, of another schema version, or inconsistent.
            BackendError: the cluster cannot be reached or refuses.
            ConfigError: no usable URL or CA file.
        """
        engine = dialect_for(config.backend)
        client = connect(engine, config, cls.retry)  # checks what answers, once a process
        try:
            return cls._open(client, config, engine)
        except BaseException:
            client.close()
            raise

    @classmethod
    def _open(cls, client: Any, config: Config, engine: Dialect) -> EngineBackend:
        url = public_url(engine.connection(config).url or "")
        names = bodies.index_names(config.opensearch_prefix)
        where = f"{url} ({names['articles']}, {names['contexts']})"

        def get_mappings() -> dict[str, Any] | None:
            try:
                return client.indices.get_mapping(index=",".join(names.values()))
            except engine.not_found:
                return None

        response = call("read the index mappings", url, get_mappings, cls.retry, engine)
        if response is None or not all(name in response for name in names.values()):
            raise IndexNotFoundError(
                f"no bertknn-search index at {where}; build one with"
                f" 'bertknn-search ingest wiki --backend {engine.name}' or check --index-prefix"
            )
        backend = cls(client, config, bodies.meta_from_mappings(dict(response), names, where), engine)
        articles = response[names["articles"]].get("mappings", {}).get("properties", {})
        backend._has_popularity = "popularity" in articles
        backend._has_spans = "spans" in articles
        contexts = response[names["contexts"]].get("mappings", {}).get("properties", {})
        backend._has_key = "key" in contexts
        backend._has_graph = "method" in contexts.get("vector", {})
        backend._has_parts = "partial" in articles
        return backend

    @property
    def location(self) -> str:
        """Where the indices are, for messages: the URL (no credentials) and the index pattern."""
        return f"{self.url}/{self.prefix}-*"

    def meta(self) -> IndexMeta:
        return self._meta

    # -- writing ----------------------------------------------------------------------------------
    def add_articles(
        self, items: Sequence[EncodedArticle], ir_fields: Mapping[str, tuple[str, str]] | None = None
    ) -> None:
        """Write or replace ``items``; each article becomes visible whole, and is when this returns
        (inside a run of writes, ``bulk``, text-only articles that replace no contexts: when it ends).

        ``ir_fields`` is not used: the engine is sent the shared terms and indexes them itself.

        Raises:
            IndexMismatchError: an article's vectors do not have the index dimension.
            BackendError: the cluster rejected documents or stayed unreachable after retries.
        """
        latest = list({item.article.id: item for item in items}.values())  # the last copy of an id wins
        if not latest:
            return
        for item in latest:
            self._check_dim(item)
        if any(item.article.popularity is not None for item in latest):
            self._ensure_popularity_field()
        self._enter_bulk_mode()
        contexts, articles = self.names["contexts"], self.names["articles"]
        dtype = self._meta.store_dtype
        keys, spans = self._has_key, self._has_spans
        self._cache.forget(i.article.id for i in latest)
        encoded = any(i.contexts is not None and len(i.contexts) for i in latest)  # a lazy ingest: none
        if encoded:
            self._bulk(
                "write contexts",
                lambda: (a for i in latest for a in bodies.context_actions(i, contexts, dtype, keys)),
            )
            self._call("refresh the contexts index", lambda: self.client.indices.refresh(index=contexts))
        # Articles with contexts of another generation still stored (replaced ones) are written unsettled
        # and settled once those are deleted; the others (a first ingest: all) are settled at once, so
        # their docs are indexed once, not again by an update.
        stale = self._articles_with_stale_contexts(latest)
        # Only now do article docs point readers at the new generation, whose contexts are all searchable.
        extra = self.dialect.article_fields

        def docs(part: Sequence[EncodedArticle]) -> Callable[[], Iterator[dict[str, Any]]]:
            return lambda: (
                bodies.article_action(i, articles, extra, spans, settled=i.article.id not in stale)
                for i in part
            )

        self._bulk("write articles", *(docs(part) for part in _parts(latest)))
        if self._in_run and not encoded and not stale:
            # Nothing a reader sees changes but the new docs' arrival, each whole: one refresh at the
            # run's end makes them all searchable, where each write of a lazy ingest refreshed before.
            self._unrefreshed = True
            self._run_docs += len(latest)
            return
        self._call("refresh the articles index", lambda: self.client.indices.refresh(index=articles))
        if not stale:
            return
        # A failure here leaves the new articles visible and settled False: the next run of the add
        # redoes them and removes the leftovers.
        replaced = [i for i in latest if i.article.id in stale]
        self._delete_where("delete replaced contexts", contexts, bodies.stale_contexts_query(replaced))
        # Settled: a resumed ingest may skip these articles now (it redoes unsettled ones).
        self._bulk(
            "mark articles settled", lambda: (bodies.settle_action(i, articles, extra) for i in replaced)
        )

    def _articles_with_stale_contexts(self, items: Sequence[EncodedArticle]) -> set[str]:
        """The articles of ``items`` that have contexts of another generation than the one written now."""
        body = {
            **bodies.stale_contexts_query(items),
            "size": 0,
            "track_total_hits": False,
            "aggs": {"stale": {"terms": {"field": "article_id", "size": len(items)}}},
        }
        response = self._search("find replaced contexts", "contexts", body)
        found = response.get("aggregations", {}).get("stale")
        if found is None:  # an answer without the count: every article settled after the delete
            return {i.article.id for i in items}
        return {b["key"] for b in found["buckets"]}

    def delete_articles(self, article_ids: Sequence[str]) -> int:
        """Delete the article docs, then their contexts by query.

        A query takes the generations it searches from the article docs, so once they are gone no query
        reaches the contexts; a delete of the contexts that failed leaves contexts nothing names, and running
        the delete again removes them.

        Raises:
            BackendError: the cluster rejected the deletes or stayed unreachable after retries.
        """
        ids = sorted(set(article_ids))
        self._cache.forget(ids)
        stored = sorted(self._mget(ids, ["fingerprint"], realtime=True)) if ids else []
        articles, contexts = self.names["articles"], self.names["contexts"]
        if stored:
            self._bulk(
                "delete articles",
                lambda: ({"_op_type": "delete", "_index": articles, "_id": aid} for aid in stored),
            )
            self._call("refresh the articles index", lambda: self.client.indices.refresh(index=articles))
        if not ids:
            return 0
        query = {"query": {"terms": {"article_id": ids}}}
        self._delete_where("delete the contexts of deleted articles", contexts, query)
        return len(stored)

    def _delete_where(self, what: str, index: str, query: dict[str, Any]) -> None:
        """Delete every doc of ``index`` that ``query`` matches: its ids by a search, then bulk deletes.

        Not delete-by-query: that lives in a module (reindex) an engine may lack, and this way a
        failure is retried and reported like every other bulk write. Running it again finishes it.
        """
        ids = self._call(what, lambda: self.dialect.scan_ids(self.client, index, query))
        if ids:
            self._bulk(what, lambda: ({"_op_type": "delete", "_index": index, "_id": i} for i in ids))
            self._call(f"refresh {index}", lambda: self.client.indices.refresh(index=index))

    def _check_dim(self, item: EncodedArticle) -> None:
        shape = None if item.contexts is None else item.contexts.vectors.shape
        if shape is not None and shape[1:] != (self._meta.dim,):
            raise IndexMismatchError(
                f"article {item.article.id!r} has vectors of shape {shape};"
                f" the index dimension is {self._meta.dim}"
            )

    def _bulk(self, what: str, *parts: Callable[[], Iterable[dict[str, Any]]]) -> None:
        """Send the actions of ``parts`` with streaming_bulk, re-sending them all after a network error.

        Ids are deterministic, so a re-sent batch overwrites what the first try stored, never duplicates.
        Several parts are sent at once, each by a thread of its own (``_parts``); each part's actions are
        made as its requests fill, so this process prepares the next request while the engine indexes.
        """

        def stream(part: Callable[[], Iterable[dict[str, Any]]]) -> tuple[int, list[dict[str, Any]]]:
            total, failures = 0, []
            for ok, item in self.dialect.streaming_bulk(
                self.client,
                part(),
                chunk_size=BULK_CHUNK,
                max_chunk_bytes=BULK_BYTES,
                raise_on_error=False,
                # No per-document 429 retries inside streaming_bulk: they waited 7.5 s on a full disk's
                # block too. A 429 that is no block sends the batch again (``refusals``, ``_call``).
                max_retries=0,
            ):
                total += 1
                if not ok:
                    failures.append(item)
            return total, failures

        def send() -> tuple[int, list[dict[str, Any]]]:
            if len(parts) == 1:
                total, failures = stream(parts[0])
            else:
                with ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="bulk") as pool:
                    sent = list(pool.map(stream, parts))
                total, failures = sum(n for n, _ in sent), [f for _, part in sent for f in part]
            lost = unavailable_shards(failures, total)
            if lost:  # a primary lost with its node, its replica not yet promoted: the batch again
                raise PartialAnswer(lost)
            return total, refusals(failures, total)

        total, failures = self._call(what, send, retry_429=False)
        if failures:
            raise BackendError(bulk_error_message(self.dialect.title, what, self.url, failures, total))

    def _ensure_popularity_field(self) -> None:
        """Add ``popularity`` to an articles index made before it existed.

        The mapping is strict, so such an index would refuse the field; adding a field to a mapping is
        allowed and leaves every stored document as it is.
        """
        if self._has_popularity:
            return
        name, body = self.names["articles"], {"properties": {"popularity": {"type": "double"}}}
        put = self.client.indices.put_mapping
        self._call("add the popularity field", lambda: put(index=name, body=body))
        self._has_popularity = True

    # -- reading ----------------------------------------------------------------------------------
    def fingerprints(self, article_ids: Sequence[str]) -> dict[str, str]:
        """Fingerprints of settled articles only: one whose old contexts may remain is done again."""
        docs = self._mget(article_ids, ["fingerprint", "settled"], realtime=True)
        return {aid: src["fingerprint"] for aid, src in docs.items() if src.get("settled", False)}

    def knn(self, vector: np.ndarray, k: int, article_ids: Sequence[str] | None = None) -> Neighbors:
        """Exact k nearest contexts (squared L2) inside ``article_ids``, with their stored keys.

        The generations to filter on are those the last IR answer named (read from the article docs
        only for articles it did not return). The search counts each generation's contexts too: one
        with fewer than its doc said was being replaced while searched, and the docs are read again and
        the search repeated (``neighbors.knn_extras``).

        ``article_ids=None`` (no-IR mode) searches every context: approximately through an HNSW graph
        where the index has one, else exactly by brute force; hits from a generation no article doc
        names (an add that died half-way) are dropped, so fewer than ``k`` may come back until that
        article is added again.
        """
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if article_ids is None:
            body = self.dialect.knn_approx_body(query, k, self._has_graph)
            response = self._search_contexts(neighbors.with_keys(body, self._has_key))
            found = sorted({neighbors.context_of(h)["article_id"] for h in response["hits"]["hits"]})
            current = {s.generation for s in self._read_states(found).values()}
            return self._neighbors(response, k, current)
        ids = sorted(set(article_ids))
        known = {aid: self._cache.state(aid) for aid in ids}
        states = {a: s for a, s in known.items() if s is not None}
        if len(states) < len(ids):
            states = self._read_states(ids)
        for _ in range(GENERATION_RETRIES):
            if not states:
                return Neighbors.empty()
            searched = {s.generation for s in states.values()}
            body = self.dialect.knn_exact_body(query, k, sorted(searched))
            response = self._search_contexts(neighbors.knn_extras(body, sorted(searched), self._has_key))
            counts = neighbors.generation_counts(response) or {}
            expected = [(s.generation, s.contexts()) for s in states.values()]
            if all(n is not None and counts.get(g, 0) >= n for g, n in expected):
                break  # every generation searched was there whole
            # An add replaces an article doc first and deletes the old contexts after: if no article
            # changed while we searched, the generations we filtered on were all there, whole.
            states = self._read_states(ids)
            if {s.generation for s in states.values()} == searched:
                break
        # Out of retries (an article replaced on every try): the last search's own generations.
        return self._neighbors(response, k, searched)

    def _neighbors(self, response: dict[str, Any], k: int, current: set[str]) -> Neighbors:
        found = neighbors.parse_neighbors(response, k, current, self._meta)
        self._neighbour_articles = list(dict.fromkeys(found.article_ids))
        return found

    def _search(self, what: str, kind: str, body: dict[str, Any], **params: Any) -> dict[str, Any]:
        """A search of index ``kind`` that answers from every shard or not at all.

        A shard without a live copy (a node lost) would otherwise leave its hits out of a 200 answer: a
        question answered from part of its neighbours, or a delete that misses contexts. Refused, it is
        retried like any transient fault until the shard is back.
        """
        index = self.names[kind]

        def search() -> dict[str, Any]:
            response = self.client.search(
                index=index, body=body, allow_partial_search_results=False, **params
            )
            whole_answer(getattr(response, "body", response), index)
            return response

        return self._call(what, search)

    def _read_states(self, article_ids: Sequence[str]) -> dict[str, ArticleState]:
        """The article docs' states, read (and kept), for articles the last IR answer did not return.

        realtime=False reads the refreshed view, the same one the context search sees.
        """
        docs = self._mget(article_ids, STATE_FIELDS, realtime=False)
        self._cache.record(docs.items())
        return {aid: state for aid in docs if (state := self._cache.state(aid)) is not None}

    def sentences(self, refs: Sequence[tuple[str, int]]) -> list[str]:
        """The sentences ``refs`` name, each article's read once per generation and kept.

        An article's generation is the one its last search or read named (the one its neighbours came
        from); the sentences of every article of the last kNN answer are read with the first miss.
        """
        texts: dict[str, list[str]] = {}
        wanted = list(dict.fromkeys(aid for aid, _ in refs))
        missing = []
        for aid in dict.fromkeys([*wanted, *self._neighbour_articles]):
            state = self._cache.state(aid)
            found = None if state is None else self._cache.sentences(aid, state.generation)
            if found is not None:
                texts[aid] = found
            elif aid in wanted or missing:
                missing.append(aid)
        if any(aid not in texts for aid in wanted):
            for aid, src in self._mget(missing, SENTENCE_FIELDS, realtime=False).items():
                texts[aid] = stored_sentences(src)
                if texts[aid]:  # none before the article is encoded: read again once it is
                    self._cache.keep_sentences(aid, bodies.generation(aid, src["fingerprint"]), texts[aid])
        return [texts[aid][i] if aid in texts and 0 <= i < len(texts[aid]) else "" for aid, i in refs]

    def titles(self, article_ids: Sequence[str]) -> dict[str, str]:
        """Titles as the last search or read of each article gave them; the others read."""
        ids = list(dict.fromkeys(article_ids))
        out = {aid: state.title for aid in ids if (state := self._cache.state(aid)) is not None}
        unknown = [aid for aid in ids if aid not in out]
        if unknown:
            out |= {aid: src["title"] for aid, src in self._mget(unknown, ["title"], realtime=False).items()}
        return out

    def _mget(self, ids: Sequence[str], source: list[str], realtime: bool) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for start in range(0, len(ids), MGET_CHUNK):
            chunk = list(ids[start : start + MGET_CHUNK])

            def read(chunk: list[str] = chunk) -> dict[str, Any]:
                response = self.dialect.mget(self.client, self.names["articles"], chunk, source, realtime)
                whole_answer(getattr(response, "body", response), self.names["articles"])
                return response

            response = self._call("read articles", read)
            out.update({d["_id"]: d["_source"] for d in response["docs"] if d.get("found")})
        return out

    def stats(self) -> IndexStats:
        body = bodies.stats_body(self._has_parts)
        counts = self._search("count articles", "articles", body)
        store = self._call(
            "read index sizes",
            lambda: self.client.indices.stats(index=",".join(self.names.values()), metric="store"),
        )
        aggs = counts["aggregations"]
        held = store["indices"].get(self.names["contexts"], {}).get("total", {}).get("store", {})
        contexts = int(aggs["contexts"]["value"] or 0)
        partial_contexts = int(aggs.get("partial_contexts", {}).get("value") or 0)
        chars, encoded_chars = aggs["chars"]["value"] or 0, aggs["encoded_chars"]["chars"]["value"] or 0
        estimate = extrapolate(contexts, chars, encoded_chars, self._meta)
        return IndexStats(
            backend=self.name,
            location=self.location,
            articles=int(counts["hits"]["total"]["value"]),
            sentences=int(aggs["sentences"]["value"] or 0),
            contexts=contexts + partial_contexts,
            bytes_on_disk=int(store["_all"]["total"]["store"]["size_in_bytes"]),
            meta=self._meta,
            encoded_articles=int(aggs["encoded"]["value"] or 0),
            context_bytes=int(held.get("size_in_bytes", 0)),
            estimated_contexts=max(estimate, contexts + partial_contexts),
            partial_articles=int(aggs.get("partial", {}).get("value") or 0),
            partial_contexts=partial_contexts,
            no_ir_graph=self._has_graph,
        )

    def close(self) -> None:
        """Put back the settings bulk loading changed, then close the connections."""
        try:
            self._leave_bulk_mode()
        finally:
            self.client.close()

    def _call(self, what: str, fn: Callable[[], T], retry_429: bool = True) -> T:
        try:
            return call(what, self.url, fn, self.retry, self.dialect, retry_429)
        except BackendError as exc:
            # Shards missing after the retries: if they failed for a full disk since freed, allocate them
            # again (once a process) and try once more, instead of failing every run until someone does.
            if self._healed or not isinstance(exc.__cause__, PartialAnswer):
                raise
            self._healed = True
            if not retry_failed_shards(self.client, f"{self.prefix}-*"):
                raise
            return call(what, self.url, fn, self.retry, self.dialect, retry_429)


def _create_index(engine: Dialect, client: Any, name: str, body: dict[str, Any]) -> Callable[[], None]:
    def create() -> None:
        try:
            client.indices.create(index=name, body=body)
        except engine.errors as exc:
            # Made by us before, or by a racing add: the caller then checks its metadata.
            if engine.error_type(exc) != "resource_already_exists_exception":
                raise

    return create


def _parts(items: Sequence[EncodedArticle]) -> list[Sequence[EncodedArticle]]:
    """``items`` in up to ``ARTICLE_WRITERS`` contiguous parts of at least ``WRITER_MIN_DOCS`` each."""
    n = max(1, min(ARTICLE_WRITERS, len(items) // WRITER_MIN_DOCS))
    size = -(-len(items) // n)
    return [items[i : i + size] for i in range(0, len(items), size)]
