"""Backend: the storage protocol both the embedded and the OpenSearch backends implement."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

import numpy as np

from bertknn_search.errors import IndexMismatchError
from bertknn_search.records import (
    Article,
    ArticleHit,
    Coverage,
    EncodedArticle,
    EncodePlan,
    IndexMeta,
    IndexStats,
    Neighbors,
    PendingArticle,
)


@runtime_checkable
class Backend(Protocol):
    """An index of articles (for IR) and their contexts (for kNN).

    Invariants every implementation keeps:
    - an article and its contexts become visible together, never half;
    - writing an article id that exists replaces it (no duplicates);
    - ``search_articles`` scores with the shared terms of ``bertknn_search.terms`` and Lucene's BM25,
      ties broken by article id, so both backends rank alike.
    """

    @property
    def location(self) -> str:
        """Where the index is, for messages (never with credentials)."""
        ...

    def meta(self) -> IndexMeta:
        """What the index was built with."""
        ...

    def add_articles(
        self, items: Sequence[EncodedArticle], ir_fields: Mapping[str, tuple[str, str]] | None = None
    ) -> None:
        """Write (or replace) articles with their contexts; each article is atomic.

        An item without contexts (a lazy index) stores the text; a replaced article loses its contexts.

        Args:
            ir_fields: article id -> its IR field texts (``article_index.field_texts``) where the caller
                made them already (ingest's worker processes); a backend that analyses text itself
                ignores them.
        """
        ...

    def bulk(self, write_articles: int, write_chars: int) -> AbstractContextManager[None]:
        """A run of ``add_articles`` calls by this process (an ingest), each still atomic on its own.

        The backend may hold its index for the run and finish work the writes leave (segment merges)
        beside the next writes and at the end; other writers may wait for the run to end.

        Args:
            write_articles, write_chars: the most articles, and characters of text, one write adds.
        """
        ...

    def delete_articles(self, article_ids: Sequence[str]) -> int:
        """Remove articles with their contexts, texts and IR entries; ids not stored are ignored.

        Returns:
            How many of ``article_ids`` were stored.
        """
        ...

    def ensure_contexts(self, article_ids: Sequence[str], plan: EncodePlan | None = None) -> int:
        """Make the contexts of ``article_ids`` searchable; returns how many contexts were encoded now.

        A store that holds every article's contexts returns 0; the lazy datastore encodes the missing:
        all of them, or with a ``plan`` with a budget, those most useful to the plan's questions first.
        """
        ...

    def coverage(self, article_ids: Sequence[str]) -> dict[str, Coverage]:
        """How many of each article's contexts are stored, of how many; {} where all of them are."""
        ...

    def encode_more(self, max_contexts: int, plan: EncodePlan | None = None) -> int:
        """Go on encoding partly encoded articles (idle time in a server); returns contexts encoded.

        0 means nothing is left to do (always, on a store that holds every context).
        """
        ...

    def fingerprints(self, article_ids: Sequence[str]) -> dict[str, str]:
        """The stored fingerprint of each of ``article_ids`` that is fully written (for resume)."""
        ...

    def find_titles(self, title: str, n: int) -> list[ArticleHit]:
        """Up to ``n`` articles whose title equals ``title`` (case-insensitive), lowest id first."""
        ...

    def list_titles(self, pattern: str, n: int) -> list[ArticleHit]:
        """Up to ``n`` articles whose title holds ``pattern`` (case-insensitive; "" lists every one),
        ordered by lowercased title, then id."""
        ...

    def search_articles(self, query: str, n: int) -> list[ArticleHit]:
        """The top ``n`` articles for ``query`` by BM25 over unigrams + bigrams."""
        ...

    def closest_titles(self, subject: str, n: int) -> list[ArticleHit]:
        """Up to ``n`` titles holding the first of ``title_patterns(subject)`` that any title holds
        (``list_titles``'s order), for a subject that is no title; one request on an engine."""
        ...

    def subject_articles(self, subject: str, query: str, n: int) -> list[ArticleHit]:
        """``find_titles(subject, n)`` when it finds any, else ``search_articles(query, n)`` ([] for "").

        One call, so that an engine can ask both in one request (a question with a subject).
        """
        ...

    def knn(self, vector: np.ndarray, k: int, article_ids: Sequence[str] | None = None) -> Neighbors:
        """Exact k nearest contexts (squared L2) to ``vector`` (dim,), restricted to ``article_ids``.

        ``article_ids=None`` searches every context (the paper's no-IR mode; may be approximate).
        """
        ...

    def sentences(self, refs: Sequence[tuple[str, int]]) -> list[str]:
        """The sentence text for each (article id, sentence index)."""
        ...

    def titles(self, article_ids: Sequence[str]) -> dict[str, str]:
        """The title of each article id."""
        ...

    def stats(self) -> IndexStats:
        """Counts and sizes."""
        ...

    def close(self) -> None:
        """Release files and connections."""
        ...


@runtime_checkable
class ContextStore(Protocol):
    """What the lazy datastore needs of a backend: article texts out, contexts in, old contexts out.

    Contexts are written per article and only while the article still has the text they were encoded
    from, so a concurrent replace is never undone and two writers of one article leave one copy.
    """

    @property
    def read_only(self) -> str:
        """Why contexts cannot be stored here ("" when they can): a lazy index then encodes in memory."""
        ...

    def unencoded(self, article_ids: Sequence[str]) -> list[PendingArticle]:
        """The articles among ``article_ids`` whose contexts are not all stored, with what is stored."""
        ...

    def coverage(self, article_ids: Sequence[str]) -> dict[str, Coverage]:
        """Stored of total contexts for each article with any stored; {} for an eager index."""
        ...

    def partial_articles(self, limit: int) -> list[str]:
        """Up to ``limit`` articles whose contexts are partly stored, most recently used first."""
        ...

    def touch(self, article_ids: Sequence[str]) -> None:
        """Record that ``article_ids`` were just searched, for the least-recently-used eviction."""
        ...

    def put_contexts(self, items: Sequence[EncodedArticle]) -> int:
        """Store contexts of articles whose stored fingerprint is still ``item.fingerprint``.

        A part (``item.rows``) adds the rows not stored yet; the part that stores the last row makes the
        article whole, stored as an eager index stores it.

        Returns:
            How many of ``items`` were stored (the others were replaced meanwhile).
        """
        ...

    def evict_contexts(self, budget: int, keep: Sequence[str]) -> int:
        """Drop least recently used contexts (never text) until they take at most ``budget`` bytes.

        ``keep`` (the articles a query is about to search) is never dropped. Returns articles evicted.
        """
        ...


@runtime_checkable
class Store(Backend, ContextStore, Protocol):
    """A backend that can also hand out texts and take contexts: what the lazy datastore wraps."""


def title_patterns(subject: str) -> list[str]:
    """What ``closest_titles`` looks for in titles, in turn: the subject, then its words of 3 or more
    characters, longest first (ties alphabetical), each once."""
    words = sorted({w for w in subject.split() if len(w) > 2}, key=lambda w: (-len(w), w))
    return list(dict.fromkeys([subject.strip().lower(), *(w.lower() for w in words)]))


def extrapolate(contexts: int, chars: float, encoded_chars: float, meta: IndexMeta) -> int:
    """Contexts an eager index would hold: the stored count, scaled by text when contexts are lazy."""
    if meta.contexts == "eager":
        return contexts
    return round(contexts * chars / encoded_chars) if encoded_chars else 0


def check_meta(found: IndexMeta, wanted: IndexMeta, where: str) -> None:
    """Raise IndexMismatchError when an index was built with other encoding settings."""
    names = ("model", "layer", "dim", "mask_policy", "store_dtype", "max_length", "contexts", "precision")
    for name in names:
        if getattr(found, name) != getattr(wanted, name):
            raise IndexMismatchError(
                f"index at {where} was built with {name}={getattr(found, name)!r}, not"
                f" {getattr(wanted, name)!r}; use the index's {name.replace('_', ' ')} or a new --index"
            )
    # A graph is made with the index and kept by every later write, asked for or not; one cannot be
    # added to an index made without it.
    if wanted.no_ir_graph and not found.no_ir_graph:
        raise IndexMismatchError(
            f"index at {where} was made without the no-IR graph, which only a new index gets: drop"
            " --no-ir-graph, or ingest into a new --index / --index-prefix with it"
        )


_INGEST_FINGERPRINT = re.compile(r"[0-9a-f]{20}")  # the form ``article_fingerprint`` gives


def text_fits_fingerprint(article: Article, fingerprint: str, meta: IndexMeta) -> bool:
    """Whether ``article`` (as read back from a store) gives ``fingerprint`` again with the index's
    settings; True for a fingerprint that ingest did not compute (another form), which cannot be checked."""
    if not _INGEST_FINGERPRINT.fullmatch(fingerprint):
        return True
    # Imported here: the ingest side (its readers import pyarrow) is needed only once a text is read.
    from bertknn_search.ingest.prepare import article_fingerprint, fingerprint_settings

    settings = fingerprint_settings(meta.model, meta.layer, meta.mask_policy, meta.max_length)
    return article_fingerprint(article, settings) == fingerprint
