"""LazyDatastore: a Backend whose contexts are encoded the first time a query's IR step picks an article.

A query only ever searches the top-N articles, so encoding an article when it is first needed gives
exactly the answers an eager index of the same corpus gives, while ingest becomes a text-and-IR pass and
the store holds only what has been asked about. The stored contexts are those ingest would have written:
the same splitter, rows, encoder and fingerprint.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import numpy as np

from bertknn_search.backends.base import Backend, ContextStore
from bertknn_search.config import Config
from bertknn_search.encoder import Encoder, check_precision
from bertknn_search.errors import LazyIndexError
from bertknn_search.records import ArticleHit, EncodedArticle, IndexMeta, IndexStats, Neighbors

TOUCH_EVERY_S = 60.0


class Store(Backend, ContextStore, Protocol):
    """A backend that can also hand out texts and take contexts: what the lazy datastore wraps."""


class LazyDatastore:
    """Wraps a store: ``ensure_contexts`` and ``knn`` encode what is missing, everything else delegates.

    Attributes:
        encoded_contexts: contexts this object has encoded since it was opened (for reports).
    """

    def __init__(self, store: Store, encoder: Encoder, config: Config) -> None:
        self.store = store
        self.encoder = encoder
        self.config = config
        self.encoded_contexts = 0
        self.encoded_articles = 0
        self._touched: dict[str, float] = {}  # article id -> when this process last recorded a use

    @property
    def name(self) -> str:
        return str(getattr(self.store, "name", "backend"))

    @property
    def location(self) -> str:
        return self.store.location

    def meta(self) -> IndexMeta:
        return self.store.meta()

    def ensure_contexts(self, article_ids: Sequence[str]) -> int:
        """Encode and store the contexts of those of ``article_ids`` that have none, in one batched pass.

        Returns:
            How many contexts were encoded now (0 when all were stored).
        """
        from bertknn_search.ingest.contexts import build_blocks, encode_rows, make_rows
        from bertknn_search.ingest.sentences import check_splitter, split_sentences

        ids = sorted(set(article_ids))
        todo = self.store.unencoded(ids)
        if todo:
            meta = self.store.meta()
            check_precision(meta.precision, self.encoder.precision, self.location)
            check_splitter(meta.splitter, self.location)
            articles = [article for article, _ in todo]
            sentences = [split_sentences(a.text) for a in articles]
            rows = make_rows(sentences, self.encoder, meta.mask_policy, meta.max_length)
            batch = self.config.batch_for(self.encoder.placement.device.type)
            vectors = encode_rows(rows, self.encoder, batch)
            blocks = build_blocks(articles, sentences, rows, vectors, self.config)
            # The stored fingerprint, not one recomputed here: put_contexts stores an article only while
            # it still holds the text that was encoded, which is what this fingerprint names.
            items = [dataclasses.replace(b, fingerprint=fp) for b, (_, fp) in zip(blocks, todo)]
            self.store.put_contexts(items)
            self.encoded_contexts += len(rows)
            self.encoded_articles += len(items)
        self._touch(ids)
        if self.config.cache_size is not None:
            self.store.evict_contexts(self.config.cache_size, ids)
        return len(rows) if todo else 0

    def _touch(self, ids: Sequence[str]) -> None:
        # Usage needs only minute resolution to order evictions, and a write per question would cost
        # more than the warm query itself: each article is recorded at most once a minute per process.
        now = time.monotonic()
        due = [i for i in ids if now - self._touched.get(i, -TOUCH_EVERY_S) >= TOUCH_EVERY_S]
        if due:
            self.store.touch(due)
            self._touched.update(dict.fromkeys(due, now))

    def knn(self, vector: np.ndarray, k: int, article_ids: Sequence[str] | None = None) -> Neighbors:
        """As the store's ``knn``, after the contexts of ``article_ids`` are made searchable.

        Raises:
            LazyIndexError: ``article_ids`` is None (no-IR mode needs every context of the corpus).
        """
        if article_ids is None:
            raise LazyIndexError(
                f"index at {self.location} encodes contexts on demand, so it cannot search every context"
                " (--no-ir); build an eager index for that ablation: ingest wiki --contexts eager"
            )
        self.ensure_contexts(article_ids)
        return self.store.knn(vector, k, article_ids)

    # -- the rest is the store's ------------------------------------------------------------------
    def add_articles(
        self, items: Sequence[EncodedArticle], ir_fields: Mapping[str, tuple[str, str]] | None = None
    ) -> None:
        self.store.add_articles(items, ir_fields)

    def bulk(self, write_articles: int, write_chars: int) -> AbstractContextManager[None]:
        return self.store.bulk(write_articles, write_chars)

    def delete_articles(self, article_ids: Sequence[str]) -> int:
        for aid in article_ids:
            self._touched.pop(aid, None)
        return self.store.delete_articles(article_ids)

    def fingerprints(self, article_ids: Sequence[str]) -> dict[str, str]:
        return self.store.fingerprints(article_ids)

    def find_titles(self, title: str, n: int) -> list[ArticleHit]:
        return self.store.find_titles(title, n)

    def search_articles(self, query: str, n: int) -> list[ArticleHit]:
        return self.store.search_articles(query, n)

    def sentences(self, refs: Sequence[tuple[str, int]]) -> list[str]:
        return self.store.sentences(refs)

    def titles(self, article_ids: Sequence[str]) -> dict[str, str]:
        return self.store.titles(article_ids)

    def stats(self) -> IndexStats:
        return self.store.stats()

    def close(self) -> None:
        self.store.close()
