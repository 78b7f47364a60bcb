"""The lazy datastore's side of the engine layer (``ContextStore``): which articles still need contexts,
how far each is encoded, and contexts written under an article's generation."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from bertknn_search.backends.engines import bodies
from bertknn_search.backends.engines.dialect import Dialect
from bertknn_search.backends.engines.reads import ArticleCache, stored_sentences
from bertknn_search.errors import ConfigError
from bertknn_search.records import Coverage, EncodedArticle, EncodePlan, IndexMeta, PendingArticle


class EngineContextSide:
    """The ``ContextStore`` methods of ``EngineBackend``, over the client and helpers it provides."""

    # Provided by EngineBackend.
    client: Any
    dialect: Dialect
    names: dict[str, str]
    location: str
    name: str
    _meta: IndexMeta
    _has_parts: bool
    _has_key: bool
    _has_spans: bool
    _cache: ArticleCache
    _mget: Callable[..., dict[str, dict[str, Any]]]
    _search: Callable[..., dict[str, Any]]
    _bulk: Callable[[str, Callable[[], Iterable[dict[str, Any]]]], None]
    _call: Callable[..., Any]
    _check_dim: Callable[[EncodedArticle], None]
    _delete_where: Callable[[str, str, dict[str, Any]], None]

    def ensure_contexts(self, article_ids: Sequence[str], plan: EncodePlan | None = None) -> int:
        """Nothing to do here: a lazy index is searched through ``LazyDatastore``, which encodes."""
        return 0

    def encode_more(self, max_contexts: int, plan: EncodePlan | None = None) -> int:
        return 0

    @property
    def read_only(self) -> str:
        return ""

    def unencoded(self, article_ids: Sequence[str]) -> list[PendingArticle]:
        """Articles of ``article_ids`` not whole, with their texts; none is read that the question's own
        IR answer (``FRESH_S`` young) says is whole: a warm question reads nothing here."""
        ids = sorted({a for a in article_ids if (s := self._cache.fresh(a)) is None or not s.whole})
        fields = [
            "title", "text", "fingerprint", "popularity", "encoded", "n_contexts", *bodies.PART_FIELDS,
            "spans", "sentences",
        ]  # fmt: skip
        docs = self._mget(ids, fields, realtime=True) if ids else {}
        self._cache.record(docs.items())
        out = []
        for aid, src in sorted(docs.items()):
            gen = bodies.generation(aid, src["fingerprint"])
            if "text" not in src or src.get("encoded") == gen:
                continue
            article = bodies.stored_article(aid, src, self._meta, self.location)
            done = np.flatnonzero(bodies.done_rows(src, aid, src["fingerprint"]))
            sentences = stored_sentences(src) if src.get("partial") == gen else None
            out.append(PendingArticle(article, src["fingerprint"], done, sentences))
        return out

    def coverage(self, article_ids: Sequence[str]) -> dict[str, Coverage]:
        if self._meta.contexts != "lazy":
            return {}
        ids = sorted(set(article_ids))
        states = {aid: self._cache.fresh(aid) for aid in ids}
        if any(state is None for state in states.values()):
            fields = ["title", "fingerprint", "encoded", "n_contexts", "partial", "n_rows", "n_done"]
            self._cache.record(self._mget(ids, fields, realtime=True).items())
            states = {aid: self._cache.state(aid) for aid in ids}
        covered = {aid: state.coverage() for aid, state in states.items() if state is not None}
        return {aid: cover for aid, cover in covered.items() if cover is not None}

    def partial_articles(self, limit: int) -> list[str]:
        if not self._has_parts:
            return []
        body = {
            "size": limit,
            "query": {"exists": {"field": "partial"}},
            "sort": [{"id": "asc"}],
            "_source": False,
        }
        response = self._search("find partly encoded articles", "articles", body)
        return [hit["_id"] for hit in response["hits"]["hits"]]

    def touch(self, article_ids: Sequence[str]) -> None:
        """Nothing: this backend keeps every context it encodes (see ``evict_contexts``)."""

    def put_contexts(self, items: Sequence[EncodedArticle]) -> int:
        """Bulk-write contexts under each article's generation, then name it in the article doc.

        Context ids are deterministic, so two processes encoding one article converge on one copy. An
        article replaced meanwhile keeps its new doc: its ``encoded`` names the generation it has only
        once contexts of that generation are written, and the contexts written here for the old text
        are deleted again.
        """
        latest = [i for i in {i.article.id: i for i in items}.values() if i.contexts is not None]
        if not latest:
            return 0
        for item in latest:
            self._check_dim(item)
        contexts, articles = self.names["contexts"], self.names["articles"]
        dtype = self._meta.store_dtype
        keys = self._has_key
        self._cache.forget(i.article.id for i in latest)
        self._bulk(
            "write contexts",
            lambda: (a for i in latest for a in bodies.context_actions(i, contexts, dtype, keys)),
        )
        self._call("refresh the contexts index", lambda: self.client.indices.refresh(index=contexts))
        fields = ["fingerprint", "partial", "done", "n_rows", "encoded"]
        current = self._mget([i.article.id for i in latest], fields, realtime=True)
        fresh = [i for i in latest if current.get(i.article.id, {}).get("fingerprint") == i.fingerprint]
        # A part of an article that is whole by now (a question stored the rest meanwhile) adds nothing:
        # its part fields would bring back a partial record beside the whole one.
        writes = [i for i in fresh if i.rows is None or not _whole(current[i.article.id], i)]
        if any(i.rows is not None for i in fresh):
            self._ensure_part_fields()
        extra = self.dialect.article_fields
        self._bulk(
            "mark articles encoded",
            lambda: (
                bodies.update_action(i.article, articles, self._encoded_doc(i, current[i.article.id]), extra)
                for i in writes
            ),
        )
        self._call("refresh the articles index", lambda: self.client.indices.refresh(index=articles))
        self._drop_parts_of_whole([i for i in writes if i.rows is not None])
        stale = [i for i in latest if i not in fresh]
        if stale:
            gens = sorted(bodies.generation(i.article.id, i.fingerprint) for i in stale)
            self._delete_where(
                "delete contexts of replaced texts", contexts, {"query": {"terms": {"generation": gens}}}
            )
        return len(fresh)

    def _drop_parts_of_whole(self, parts: Sequence[EncodedArticle]) -> None:
        """Clear the partial record of each article of ``parts`` that another writer stored whole
        between this one's read and its write (its part fields then landed on the whole article).

        Whichever write lands last, the record ends right: a whole write clears the part fields, and
        a part write is followed by this check.
        """
        if not parts:
            return
        docs = self._mget([i.article.id for i in parts], ["fingerprint", "encoded", "partial"], realtime=True)
        stale = {aid for aid, src in docs.items() if src.get("partial") is not None}
        whole = [i for i in parts if i.article.id in stale and _whole(docs[i.article.id], i)]
        if not whole:
            return
        articles, extra = self.names["articles"], self.dialect.article_fields
        cleared = {name: None for name in bodies.PART_FIELDS}
        self._bulk(
            "clear partial records of whole articles",
            lambda: (bodies.update_action(i.article, articles, cleared, extra) for i in whole),
        )
        self._call("refresh the articles index", lambda: self.client.indices.refresh(index=articles))

    def _encoded_doc(self, item: EncodedArticle, source: dict[str, Any]) -> dict[str, Any]:
        """The article-doc fields after ``item`` is stored: whole once every row of it is.

        Two processes storing parts of one article at once may each miss the other's rows here; those
        rows are then encoded again later, and their deterministic ids keep one copy of each.
        """
        aid, block = item.article.id, item.contexts
        assert block is not None
        text = item.article.text if self._has_spans else None
        if item.rows is None:
            whole = bodies.encoded_fields(aid, item.fingerprint, block, text)
            return whole | ({name: None for name in bodies.PART_FIELDS} if self._has_parts else {})
        total = item.total or len(block)
        done = bodies.done_rows({**source, "n_rows": total}, aid, item.fingerprint)
        done[item.rows] = True
        if done.all():
            counts = {"encoded": bodies.generation(aid, item.fingerprint), "n_contexts": total}
            return (
                counts
                | {"n_sentences": len(block.sentences), **bodies.sentence_fields(block.sentences, text)}
                | {name: None for name in bodies.PART_FIELDS}
            )
        return bodies.part_fields(aid, item.fingerprint, done, block.sentences, text)

    def _ensure_part_fields(self) -> None:
        """Add the part fields to an articles index made before them (see ``_ensure_popularity_field``)."""
        if self._has_parts:
            return
        properties = bodies.load_mapping(f"{self.name}-articles")["mappings"]["properties"]
        body = {"properties": {name: properties[name] for name in bodies.PART_FIELDS}}
        name, put = self.names["articles"], self.client.indices.put_mapping
        self._call("add the part fields", lambda: put(index=name, body=body))
        self._has_parts = True

    def evict_contexts(self, budget: int, keep: Sequence[str]) -> int:
        """Not offered: a cluster grows by nodes, and usage times would cost a write per query.

        Raises:
            ConfigError: always.
        """
        raise ConfigError(
            f"--cache-size is for the embedded backend; the {self.dialect.title} index at {self.location}"
            " keeps every context it encodes (drop --cache-size)"
        )


def _whole(source: dict[str, Any], item: EncodedArticle) -> bool:
    """The article doc ``source`` says ``item``'s text is stored whole."""
    return source.get("encoded") == bodies.generation(item.article.id, item.fingerprint)
