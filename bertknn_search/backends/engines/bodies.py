"""Request bodies and response parsing shared by the OpenSearch and Elasticsearch backends: no I/O.

What differs between the two engines (the vector mapping, the kNN bodies) is in ``dialects``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from importlib.resources import files
from typing import Any

import numpy as np

from bertknn_search.backends import codec
from bertknn_search.backends.base import text_fits_fingerprint
from bertknn_search.backends.engines.reads import STATE_FIELDS, generation, sentence_spans
from bertknn_search.errors import IndexCorruptError
from bertknn_search.records import Article, ArticleHit, ContextBlock, EncodedArticle, IndexMeta
from bertknn_search.terms import document_text, query_terms, tokenize

# 2: accent-folded IR terms, max_length in the meta; 3: lazy contexts; 4: precision; 5: whole-word values
# (a word's hash, negative, beside token ids), which version 4 would count at the vocabulary's far end.
SCHEMA_VERSION = 5
READABLE_VERSIONS = (4, 5)  # a version-4 index holds token ids only: it reads as it always did
KINDS = ("articles", "contexts")
# Both backends break distance ties by (article id, sentence, start); sorting on the server as well keeps
# the k-th place deterministic when several contexts tie at the cut.
CONFLICT_RETRIES = 5  # re-applications of an update whose doc another writer changed meanwhile
TIE_ORDER = [{"_score": "desc"}, {"article_id": "asc"}, {"sentence_id": "asc"}, {"start": "asc"}]
CONTEXT_FIELDS = ["article_id", "generation", "token_id", "sentence_id", "start", "end"]


# A kNN hit's fields are read as doc values, and no stored field at all (not even ``_id``): reading one
# decompresses the hit's stored-field block, which holds each context's whole source with its vector
# until a merge drops it. The fetch phase of 128-160 hits was most of the engine's ``took`` (OpenSearch
# 7 -> 2 ms, Elasticsearch 10 -> 4 ms a question, 20 articles of MiniLM contexts, 9 segments).
def context_fetch() -> dict[str, Any]:
    """What a kNN body asks of its hits (above); new lists each time, as every body is its own."""
    return {"stored_fields": "_none_", "docvalue_fields": list(CONTEXT_FIELDS)}


def index_names(prefix: str) -> dict[str, str]:
    """The two index names under ``prefix``: ``{"articles": "<prefix>-articles", "contexts": ...}``."""
    return {kind: f"{prefix}-{kind}" for kind in KINDS}


def load_mapping(name: str) -> dict[str, Any]:
    """The create-index body shipped in ``mappings/<name>.json`` (settings + mappings), e.g.
    ``opensearch-articles``."""
    text = files("bertknn_search.mappings").joinpath(f"{name}.json").read_text(encoding="utf-8")
    return json.loads(text)


def meta_doc(meta: IndexMeta) -> dict[str, Any]:
    """The ``_meta`` object both indices carry: the IndexMeta fields and the schema version."""
    return {"schema_version": SCHEMA_VERSION, **asdict(meta)}


def meta_from_mappings(response: dict[str, Any], names: dict[str, str], where: str) -> IndexMeta:
    """The IndexMeta stored in a get-mapping response for both indices.

    Raises:
        IndexCorruptError: ``_meta`` is missing, unreadable, of another schema version, or differs
            between the two indices.
    """
    found = [response.get(names[kind], {}).get("mappings", {}).get("_meta") for kind in KINDS]
    if all(isinstance(m, dict) for m in found):
        found = [meta_with_restore(m, None) for m in found]  # a restore record is not metadata
    if not all(isinstance(m, dict) for m in found):
        raise IndexCorruptError(
            f"indices at {where} have no bertknn-search metadata (_meta); they were not made by"
            " bertknn-search: choose another --opensearch-prefix"
        )
    if found[0] != found[1]:
        raise IndexCorruptError(
            f"the articles and contexts indices at {where} disagree on their metadata;"
            " delete both and ingest again"
        )
    raw = found[0]
    if raw.get("schema_version") not in READABLE_VERSIONS:
        raise IndexCorruptError(
            f"indices at {where} have schema version {raw.get('schema_version')!r}, this version of"
            f" bertknn-search reads {' and '.join(map(str, READABLE_VERSIONS))};"
            " ingest again under another --opensearch-prefix"
        )
    try:
        return IndexMeta(
            model=str(raw["model"]),
            layer=int(raw["layer"]),
            dim=int(raw["dim"]),
            vocab_size=int(raw["vocab_size"]),
            mask_policy=str(raw["mask_policy"]),
            store_dtype=str(raw["store_dtype"]),
            max_length=int(raw["max_length"]),
            contexts=str(raw["contexts"]),
            precision=str(raw["precision"]),
            splitter=str(raw.get("splitter", "")),
            # Absent from indexes made before the option: theirs is what their vector mapping builds.
            no_ir_graph=bool(raw.get("no_ir_graph", has_graph(response, names))),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise IndexCorruptError(
            f"metadata of indices at {where} cannot be read ({exc!r}); ingest again"
        ) from exc


def has_graph(response: dict[str, Any], names: dict[str, str]) -> bool:
    """Whether the contexts' vector of a get-mapping response builds a graph (OpenSearch's ``method``;
    Elasticsearch's ``flat`` field has none)."""
    properties = response.get(names["contexts"], {}).get("mappings", {}).get("properties", {})
    return "method" in properties.get("vector", {})


def stored_article(article_id: str, source: dict[str, Any], meta: IndexMeta, where: str) -> Article:
    """The article an articles doc holds, checked before its text is encoded: title and text are strings
    and, where its fingerprint is one ingest computed, give that fingerprint again with the index's
    settings. A doc edited by hand (a number for a text, another article's text) is an IndexCorruptError
    naming the article, never contexts encoded from the wrong text.
    """
    title, text, popularity = source.get("title"), source.get("text"), source.get("popularity")
    fingerprint = source.get("fingerprint")

    def damaged(why: str) -> IndexCorruptError:
        return IndexCorruptError(
            f"indices at {where}: the stored article {article_id!r} is damaged ({why}); add that article"
            " again or rebuild the index with ingest"
        )

    for name, value in (("title", title), ("text", text), ("fingerprint", fingerprint)):
        if not isinstance(value, str):
            raise damaged(f"its {name} is {type(value).__name__}, not text")
    if popularity is not None and (isinstance(popularity, bool) or not isinstance(popularity, (int, float))):
        raise damaged(f"its popularity is {type(popularity).__name__}, not a number")
    article = Article(article_id, title, text, None if popularity is None else float(popularity))
    if not text_fits_fingerprint(article, fingerprint, meta):
        raise damaged("its text is not the text its fingerprint was made from")
    return article


def stored_vectors(vectors: np.ndarray, store_dtype: str) -> np.ndarray:
    """(n, dim) float32: the values the embedded backend decodes from its store, so both compute alike."""
    n, dim = vectors.shape
    return codec.decode(codec.encode(vectors, store_dtype), n, dim, store_dtype)


def article_action(
    item: EncodedArticle,
    index: str,
    extra: Callable[[list[str]], dict[str, Any]] | None = None,
    spans: bool = False,
    settled: bool = False,
) -> dict[str, Any]:
    """The bulk action writing an article doc (``_id`` = article id, so a re-write replaces it).

    Args:
        extra: the dialect's own fields of the doc, from its IR terms (``Dialect.article_fields``).
        spans: the index stores sentences as offsets into the text (``spans``, made since the field
            exists); else as a list of their own (older indices: eager ones kept no text).
        settled: no contexts of another generation of the article are stored (see ``settle_action``).
    """
    art, block = item.article, item.contexts
    source = {
        "id": art.id,
        "title": art.title,
        "fingerprint": item.fingerprint,
        # False until the article's replaced contexts are deleted; resume redoes unsettled articles.
        "settled": settled,
        "n_chars": len(art.text),
        **ir_fields(art, extra),
    }
    if art.popularity is not None:
        source["popularity"] = art.popularity
    if block is None:  # a lazy index: the text waits for the first query that needs its contexts
        source.update(n_sentences=0, n_contexts=0, text=art.text)
        if not spans:
            source["sentences"] = []
    else:
        source.update(encoded_fields(art.id, item.fingerprint, block, art.text if spans else None))
        if spans:
            source["text"] = art.text
    return {"_op_type": "index", "_index": index, "_id": art.id, "_source": source}


def ir_fields(article: Article, extra: Callable[[list[str]], dict[str, Any]] | None) -> dict[str, Any]:
    """The fields the engine indexes for BM25: the shared terms, pre-tokenised (the index only splits on
    whitespace), and the dialect's own. Indexed, not kept in ``_source`` (new indices): every partial
    update of an article doc must send them again, or the engine re-indexes the doc without them."""
    terms = tokenize(document_text(article.title, article.text))
    return {"terms": " ".join(terms), **(extra(terms) if extra else {})}


def encoded_fields(
    article_id: str, fingerprint: str, block: ContextBlock, text: str | None = None
) -> dict[str, Any]:
    """Article-doc fields that describe its stored contexts; ``encoded`` names their generation.

    A generation, not a flag: fields written for a text that was replaced meanwhile name a generation
    the article no longer has, so the article still counts as not encoded.

    Args:
        text: the article's text where the index stores sentences as offsets into it (see
            ``sentence_fields``); None: as a list.
    """
    return {
        "encoded": generation(article_id, fingerprint),
        "n_sentences": len(block.sentences),
        "n_contexts": len(block),
        **sentence_fields(block.sentences, text),
    }


def sentence_fields(sentences: Sequence[str], text: str | None) -> dict[str, Any]:
    """An article's sentences as its doc stores them: offsets into ``text`` (``spans``), or the list
    itself where there is no text to point into or a sentence is not found in it in order."""
    packed = None if text is None else sentence_spans(text, sentences)
    if packed is None:
        return {"sentences": list(sentences)} | ({} if text is None else {"spans": None})
    return {"spans": packed, "sentences": None}


# Article-doc fields of a partly encoded article: the generation its parts belong to, which rows are
# stored (packed bits, base64), how many rows the article has and how many are stored.
PART_FIELDS = ("partial", "done", "n_rows", "n_done")


def part_fields(
    article_id: str, fingerprint: str, done: np.ndarray, sentences: list[str], text: str | None = None
) -> dict[str, Any]:
    """Article-doc fields naming the rows of a partly encoded article that are stored (``done``: bool).

    Args:
        text: the article's text where the index stores sentences as offsets into it.
    """
    return {
        "partial": generation(article_id, fingerprint),
        "done": base64.b64encode(np.packbits(done).tobytes()).decode("ascii"),
        "n_rows": int(done.size),
        "n_done": int(done.sum()),
        **sentence_fields(sentences, text),
    }


def done_rows(source: dict[str, Any], article_id: str, fingerprint: str) -> np.ndarray:
    """The stored rows (bool mask) an article doc names for its current text; all False if none."""
    total = int(source.get("n_rows") or 0)
    if source.get("partial") != generation(article_id, fingerprint) or not source.get("done"):
        return np.zeros(total, bool)
    packed = np.frombuffer(base64.b64decode(source["done"]), np.uint8)
    return np.unpackbits(packed, count=total).astype(bool)


def context_actions(
    item: EncodedArticle, index: str, store_dtype: str, keys: bool = False
) -> Iterator[dict[str, Any]]:
    """Bulk actions writing an article's contexts, one doc per row.

    ``_id`` = ``<article id>:<fingerprint>:<row>``, the row numbered over the whole article (a part
    names its rows): re-sending the same article or part overwrites, never duplicates. Vectors go
    out as the float32 values of the stored encoding (float16 or int8).

    Args:
        keys: the index has the ``key`` field: each context's stored encoding again, as binary doc
            values that a kNN search returns with its hits (see ``neighbors.knn_extras``), so that evidence
            measures the neighbours' redundancy without encoding their sentences again.
    """
    art, block = item.article, item.contexts
    if block is None:
        return
    gen = generation(art.id, item.fingerprint)
    vectors = stored_vectors(block.vectors, store_dtype)
    stored = [
        base64.b64encode(codec.encode(block.vectors[i : i + 1], store_dtype)).decode("ascii")
        for i in range(len(block) if keys else 0)
    ]
    columns = zip(
        block.token_ids.tolist(),
        block.sentence_ids.tolist(),
        block.starts.tolist(),
        block.ends.tolist(),
        vectors.tolist(),
    )
    rows = range(len(block)) if item.rows is None else item.rows.tolist()
    for i, (row, (token_id, sentence_id, start, end, vector)) in enumerate(zip(rows, columns)):
        source = {
            "article_id": art.id,
            "generation": gen,
            "token_id": token_id,
            "sentence_id": sentence_id,
            "start": start,
            "end": end,
            "vector": vector,
        }
        if keys:
            source["key"] = stored[i]
        yield {"_op_type": "index", "_index": index, "_id": f"{gen}:{row}", "_source": source}


def settle_action(
    item: EncodedArticle, index: str, extra: Callable[[list[str]], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The bulk action marking an article settled: no contexts of an older generation are left."""
    return update_action(item.article, index, {"settled": True}, extra)


def update_action(
    article: Article,
    index: str,
    doc: dict[str, Any],
    extra: Callable[[list[str]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A bulk partial update of an article doc: ``doc``'s fields, with the IR fields sent again (the
    engine re-indexes an updated doc from its ``_source``, which keeps no terms: see ``ir_fields``)."""
    fields = doc | ir_fields(article, extra)
    # Two writers of one article doc at once (two ingests or adds, a question and the idle completion):
    # the engine reads the doc again and applies the fields to it, where it answered 409 before.
    return {
        "_op_type": "update",
        "_index": index,
        "_id": article.id,
        "doc": fields,
        "retry_on_conflict": CONFLICT_RETRIES,
    }


def stale_contexts_query(items: Sequence[EncodedArticle]) -> dict[str, Any]:
    """delete-by-query body: contexts of ``items``' articles whose generation is not the new one."""
    return {
        "query": {
            "bool": {
                "filter": [{"terms": {"article_id": sorted({i.article.id for i in items})}}],
                "must_not": [
                    {
                        "terms": {
                            "generation": sorted({generation(i.article.id, i.fingerprint) for i in items})
                        }
                    }
                ],
            }
        }
    }


def search_body(query: str, n: int, bigram_field: str = "terms.bigrams") -> dict[str, Any] | None:
    """BM25 over unigrams + bigrams of the shared terms; ties by id. None when the query has no terms.

    Args:
        bigram_field: where the engine's articles hold their bigrams (``Dialect.bigram_field``).
    """
    unigrams, bigrams = query_terms(query)
    should = []
    if unigrams:
        should.append({"match": {"terms": " ".join(unigrams)}})
    if bigrams:
        should.append({"match": {bigram_field: " ".join(bigrams)}})
    if not should:
        return None
    return {
        "size": n,
        "query": {"bool": {"should": should}},
        "sort": [{"_score": "desc"}, {"id": "asc"}],
        "_source": STATE_FIELDS,  # what the question needs of its articles next (``reads``)
    }


TITLE_ORDER = [{"title.key": "asc"}, {"id": "asc"}]  # titles listed: lowercased title, then id


def title_body(title: str, n: int = 1) -> dict[str, Any]:
    """Exact, case-insensitive title lookup: up to ``n`` articles of that title, lowest id first."""
    return {
        "size": n,
        "query": {"term": {"title.key": title.strip().lower()}},
        "sort": [{"id": "asc"}],
        "_source": STATE_FIELDS,
    }


def titles_body(pattern: str, n: int) -> dict[str, Any]:
    """Articles whose lowercased title holds ``pattern`` (every article for ""), by title then id."""
    return {"size": n, "query": holding(pattern), "sort": [*TITLE_ORDER], "_source": ["title"]}


def closest_body(patterns: list[str], n: int) -> dict[str, Any]:
    """``titles_body`` of the first of ``patterns`` that any title holds, in one search.

    Pattern i scores len(patterns) - i and ``dis_max`` keeps a title's best, so the titles of the top
    score hold that pattern, in ``titles_body``'s order after it; ``closest_hits`` keeps only them.
    """
    ranked = [
        {"constant_score": {"filter": holding(p), "boost": float(len(patterns) - i)}}
        for i, p in enumerate(patterns)
    ]
    order = [{"_score": "desc"}, *TITLE_ORDER]
    return {"size": n, "query": {"dis_max": {"queries": ranked}}, "sort": order, "_source": ["title"]}


def parse_titles(hits: Sequence[dict[str, Any]]) -> list[ArticleHit]:
    """The articles of ``titles_body``'s or ``closest_body``'s hits (a listing: no score)."""
    return [ArticleHit(h["_id"], h["_source"]["title"], 0.0) for h in hits]


def holding(pattern: str) -> dict[str, Any]:
    """The articles whose lowercased title holds ``pattern`` (every article for "")."""
    key = pattern.strip().lower()
    escaped = "".join("\\" + c if c in "*?\\" else c for c in key)
    return {"wildcard": {"title.key": {"value": f"*{escaped}*"}}} if key else {"match_all": {}}


def stats_body(parts: bool = False) -> dict[str, Any]:
    """Article count and the summed sentence and context counts of the article docs.

    Args:
        parts: the mapping has the part fields: count partly encoded articles and their contexts too.
    """
    aggs: dict[str, Any] = {
        "sentences": {"sum": {"field": "n_sentences"}},
        "contexts": {"sum": {"field": "n_contexts"}},
        "encoded": {"value_count": {"field": "encoded"}},
        "chars": {"sum": {"field": "n_chars"}},
        "encoded_chars": {
            "filter": {"range": {"n_contexts": {"gt": 0}}},
            "aggs": {"chars": {"sum": {"field": "n_chars"}}},
        },
    }
    if parts:
        aggs |= {
            "partial": {"value_count": {"field": "partial"}},
            "partial_contexts": {"sum": {"field": "n_done"}},
        }
    return {"size": 0, "track_total_hits": True, "aggs": aggs}


# The key of the articles index's ``_meta`` that holds both indices' own settings while a bulk load has
# changed them. It is written before the change and removed after the restore, so an add that dies in
# between leaves the original values behind for the next one, instead of the bulk values (no refresh).
# One record in one index: the contexts index's mapping is never updated after it is made (OpenSearch's
# k-NN 2.19.1 fails a graph-less shard on a mapping update). Older versions kept one record per index,
# ``{"owner", "settings"}`` in each index's own ``_meta``: those are still read, and moved.
RESTORE_KEY = "bulk_restore"


def settings_to_restore(state: dict[str, Any], names: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The values to put back after bulk loading (None: the default), per index name.

    Args:
        state: a get-index response for both indices (their settings and mappings).
        names: the index names by kind (``index_names``); the record in the articles index's ``_meta``
            wins, then an older version's record in an index's own ``_meta``, then its current settings.
    """
    record = meta_of(state, names["articles"]).get(RESTORE_KEY)
    saved = record.get("indices") if isinstance(record, dict) else None
    restore = {}
    for name in names.values():
        if isinstance(saved, dict) and isinstance(saved.get(name), dict):
            restore[name] = saved[name]
            continue
        own = meta_of(state, name).get(RESTORE_KEY)
        if isinstance(own, dict) and isinstance(own.get("settings"), dict):
            restore[name] = own["settings"]
            continue
        current = state.get(name, {}).get("settings", {}).get("index", {})
        if current.get("refresh_interval") == "-1":
            # Bulk values with no record of what they replaced: the defaults are the safe guess
            # (keeping "0" replicas would leave a serving index without copies for good).
            restore[name] = {"refresh_interval": None, "number_of_replicas": None}
        else:
            restore[name] = {
                "refresh_interval": current.get("refresh_interval"),
                "number_of_replicas": current.get("number_of_replicas"),
            }
    return restore


def meta_of(state: dict[str, Any], name: str) -> dict[str, Any]:
    """Index ``name``'s ``_meta`` in a get-index or get-mapping response ({} if none)."""
    meta = state.get(name, {}).get("mappings", {}).get("_meta", {})
    return meta if isinstance(meta, dict) else {}


def restore_owner(meta: dict[str, Any]) -> str | None:
    """The writer that holds the restore record in ``meta`` (an articles index's ``_meta``), if any."""
    saved = meta.get(RESTORE_KEY)
    return saved.get("owner") if isinstance(saved, dict) else None


def meta_with_restore(
    meta: dict[str, Any], restore: dict[str, dict[str, Any]] | None, owner: str | None = None
) -> dict[str, Any]:
    """``meta`` with the bulk-load restore record (every index's settings by name, and the writer
    holding it), or without any record (None)."""
    out = {k: v for k, v in meta.items() if k != RESTORE_KEY}
    return out if restore is None else {**out, RESTORE_KEY: {"owner": owner, "indices": restore}}


def parse_articles(response: dict[str, Any]) -> list[ArticleHit]:
    """ArticleHits of a search response, in its order."""
    return [ArticleHit(h["_id"], h["_source"]["title"], hit_score(h)) for h in response["hits"]["hits"]]


def floats(vector: np.ndarray) -> list[float]:
    # float32 values as Python floats: JSON carries them exactly, and the server parses them back to the
    # same float32 numbers the embedded backend computes with.
    return np.asarray(vector, dtype=np.float32).reshape(-1).tolist()


def hit_score(hit: dict[str, Any]) -> float:
    # With a sort, some servers leave _score out of the hit; the first sort value is the score then.
    score = hit.get("_score")
    return float(hit["sort"][0] if score is None else score)
