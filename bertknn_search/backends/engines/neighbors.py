"""The kNN search's extras and its answer: what a kNN body also asks for, and its hits as ``Neighbors``.

Shared by the OpenSearch and Elasticsearch backends, no I/O; the kNN bodies themselves differ by engine
(``opensearch``, ``elasticsearch``), what they ask beside the hits and how the hits are read do not.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np

from bertknn_search.backends import codec
from bertknn_search.backends.engines.bodies import CONTEXT_FIELDS, hit_score
from bertknn_search.backends.engines.reads import unpadded_b64
from bertknn_search.records import IndexMeta, Neighbors


def squared_distances(scores: np.ndarray) -> np.ndarray:
    """Squared L2 distances from l2 kNN scores, which are 1 / (1 + d²) on both engines."""
    return (1.0 / np.asarray(scores, dtype=np.float64) - 1.0).clip(min=0.0).astype(np.float32)


def knn_extras(body: dict[str, Any], generations: Sequence[str], keys: bool) -> dict[str, Any]:
    """A kNN body that also returns its hits' stored keys and counts the contexts of each generation.

    The counts let the search check itself: an add replaces an article doc first and deletes the old
    contexts after, so a generation with fewer contexts than the IR answer's doc said was being
    deleted while it was searched. Counted over every context the generations' filter matches: a
    top-level ``knn`` (Elasticsearch) aggregates over its own top hits only, so the filter is also
    given as the ``query``, whose matches score 0 and are dropped by ``parse_neighbors``.
    """
    out = dict(body)
    where = {"terms": {"generation": list(generations)}}
    out.setdefault("query", {"bool": {"filter": [where]}})
    out["aggs"] = {GENERATION_COUNTS: {"terms": {"field": "generation", "size": max(len(generations), 1)}}}
    return with_keys(out, keys)


def with_keys(body: dict[str, Any], keys: bool) -> dict[str, Any]:
    """``body`` whose hits also carry their stored keys (``key``, binary doc values) where ``keys``."""
    if not keys:
        return body
    return {**body, "docvalue_fields": [*body.get("docvalue_fields", ()), "key"]}


GENERATION_COUNTS = "per_generation"


def generation_counts(response: dict[str, Any]) -> dict[str, int] | None:
    """Contexts per generation that a ``knn_extras`` search counted; None where it did not count."""
    found = response.get("aggregations", {}).get(GENERATION_COUNTS)
    if found is None:
        return None
    return {b["key"]: int(b["doc_count"]) for b in found.get("buckets", ())}


def parse_neighbors(
    response: dict[str, Any], k: int, current: set[str] | None = None, meta: IndexMeta | None = None
) -> Neighbors:
    """Neighbors of a kNN response, nearest first, ties by (article id, sentence, start).

    Args:
        response: a search response from ``knn_exact_body`` or ``knn_approx_body``.
        k: how many to keep.
        current: if given, drop hits whose generation is not in it (contexts of replaced articles).
        meta: the index's settings: where every hit carries its stored key (``knn_extras``), the
            neighbours' vectors are decoded with its dimension and store dtype.
    """
    every = response["hits"]["hits"]
    found = [(h, context_of(h)) for h in every]
    kept = [
        (h, c) for h, c in found if (current is None or c["generation"] in current) and hit_score(h) > 0.0
    ]
    if not kept:
        return Neighbors.empty()
    hits, src = [h for h, _ in kept], [c for _, c in kept]
    dist = squared_distances(np.array([hit_score(h) for h in hits]))
    article_ids = [s["article_id"] for s in src]
    sentence_ids = np.array([s["sentence_id"] for s in src], dtype=np.int32)
    starts = np.array([s["start"] for s in src], dtype=np.int32)
    # lexsort needs numbers: rank the article ids (np.unique sorts them as strings).
    article_rank = np.unique(article_ids, return_inverse=True)[1]
    order = np.lexsort((starts, sentence_ids, article_rank, dist))[:k]
    return Neighbors(
        distances=dist[order],
        token_ids=np.array([src[i]["token_id"] for i in order], dtype=np.int64),
        article_ids=[article_ids[i] for i in order],
        sentence_ids=sentence_ids[order],
        starts=starts[order],
        ends=np.array([src[i]["end"] for i in order], dtype=np.int32),
        vectors=None if meta is None else _keys([hits[i] for i in order], meta),
    )


def context_of(hit: dict[str, Any]) -> dict[str, Any]:
    """A kNN hit's ``CONTEXT_FIELDS``: from its doc values (``context_fetch``), else its ``_source``."""
    if "_source" in hit:
        return hit["_source"]
    fields = hit["fields"]
    return {name: fields[name][0] for name in CONTEXT_FIELDS}


def _keys(hits: Sequence[dict[str, Any]], meta: IndexMeta) -> np.ndarray | None:
    """(n, dim) float32 stored keys of the hits, or None unless every hit has one."""
    values = [h.get("fields", {}).get("key") for h in hits]
    if not all(values):
        return None
    texts = [v[0] for v in values]
    if meta.store_dtype == "float16" and codec.bytes_per_vector(meta.dim, meta.store_dtype) % 3 == 0:
        # float16 rows laid end to end are the block of all of them, and base64 of a multiple of 3 bytes
        # has no padding, so the texts join: one decode of the whole, where one a hit was 0.7 ms of a
        # question's 160 keys (dim 384).
        return codec.decode(base64.b64decode("".join(texts)), len(texts), meta.dim, meta.store_dtype)
    blob = [unpadded_b64(t) for t in texts]
    return np.concatenate([codec.decode(b, 1, meta.dim, meta.store_dtype) for b in blob])
