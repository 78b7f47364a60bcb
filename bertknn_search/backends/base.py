"""Backend: the storage protocol both the embedded and the OpenSearch backends implement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from bertknn_search.errors import IndexMismatchError
from bertknn_search.records import ArticleHit, EncodedArticle, IndexMeta, IndexStats, Neighbors


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

    def add_articles(self, items: Sequence[EncodedArticle]) -> None:
        """Write (or replace) articles with their contexts; each article is atomic."""
        ...

    def fingerprints(self, article_ids: Sequence[str]) -> dict[str, str]:
        """The stored fingerprint of each of ``article_ids`` that is fully written (for resume)."""
        ...

    def find_titles(self, title: str, n: int) -> list[ArticleHit]:
        """Up to ``n`` articles whose title equals ``title`` (case-insensitive), lowest id first."""
        ...

    def search_articles(self, query: str, n: int) -> list[ArticleHit]:
        """The top ``n`` articles for ``query`` by BM25 over unigrams + bigrams."""
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


def check_meta(found: IndexMeta, wanted: IndexMeta, where: str) -> None:
    """Raise IndexMismatchError when an index was built with other encoding settings."""
    for name in ("model", "layer", "dim", "mask_policy", "store_dtype", "max_length"):
        if getattr(found, name) != getattr(wanted, name):
            raise IndexMismatchError(
                f"index at {where} was built with {name}={getattr(found, name)!r}, not"
                f" {getattr(wanted, name)!r}; use the index's {name.replace('_', ' ')} or a new --index"
            )
