"""MemoryParts: contexts of a read-only lazy index, encoded into this process's memory.

A lazy index on a read-only volume (a mounted image, a shared snapshot) still answers cold questions:
the contexts are encoded as on a writable index and kept here, over what the index stores, never written.
What a question sees is what it would see on a writable copy of the index.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from bertknn_search.backends.blocks import Block, exact_knn, merge_neighbors
from bertknn_search.records import Coverage, EncodedArticle, IndexStats, Neighbors, PendingArticle

if TYPE_CHECKING:
    from bertknn_search.backends.base import Store

# Contexts held at most (vectors as float32): beyond it the least recently encoded articles are dropped
# and encoded again when next needed.
MAX_BYTES = 1 << 30


@dataclass
class _Held:
    fingerprint: str
    total: int
    sentences: list[str]
    rows: list[np.ndarray] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)

    @property
    def done(self) -> np.ndarray:
        return np.concatenate(self.rows) if self.rows else np.zeros(0, np.int64)

    @property
    def nbytes(self) -> int:
        return sum(b["vectors"].nbytes for b in self.blocks)


class MemoryParts:
    """The context side of a read-only store, with contexts encoded here added in memory."""

    read_only = ""  # memory takes what the store cannot

    def __init__(self, store: Store) -> None:
        self.store = store
        self._held: OrderedDict[str, _Held] = OrderedDict()

    def unencoded(self, article_ids: Sequence[str]) -> list[PendingArticle]:
        out = []
        for p in self.store.unencoded(article_ids):
            held = self._held.get(p.article.id)
            if held is None or held.fingerprint != p.fingerprint:
                out.append(p)
                continue
            done = np.union1d(p.done, held.done)
            if done.size < held.total:
                out.append(PendingArticle(p.article, p.fingerprint, done, held.sentences))
        return out

    def put_contexts(self, items: Sequence[EncodedArticle]) -> int:
        for item in items:
            block = item.contexts
            if block is None:
                continue
            rows = np.arange(len(block)) if item.rows is None else np.asarray(item.rows)
            held = self._held.get(item.article.id)
            if held is None or held.fingerprint != item.fingerprint:
                held = _Held(item.fingerprint, item.total or len(block), list(block.sentences))
                self._held[item.article.id] = held
            held.rows.append(rows)
            held.blocks.append(
                {
                    "vectors": block.vectors.astype(np.float32),
                    "token_ids": block.token_ids,
                    "sentence_ids": block.sentence_ids,
                    "starts": block.starts,
                    "ends": block.ends,
                }
            )
            self._held.move_to_end(item.article.id)
        while len(self._held) > 1 and sum(h.nbytes for h in self._held.values()) > MAX_BYTES:
            self._held.popitem(last=False)
        return len(items)

    def coverage(self, article_ids: Sequence[str]) -> dict[str, Coverage]:
        out = self.store.coverage(article_ids)
        for aid in article_ids:
            held = self._held.get(aid)
            if held is not None:
                stored = out.get(aid, Coverage(0, held.total)).encoded
                out[aid] = Coverage(min(stored + held.done.size, held.total), held.total)
        return out

    def partial_articles(self, limit: int) -> list[str]:
        mine = [aid for aid, h in reversed(self._held.items()) if h.done.size < h.total]
        return [*mine, *self.store.partial_articles(limit)][:limit]

    def touch(self, article_ids: Sequence[str]) -> None:
        """Nothing: a read-only index records no usage."""

    def knn(self, vector: np.ndarray, k: int, article_ids: Sequence[str] | None = None) -> Neighbors:
        ids = sorted(set(article_ids or ()))
        stored = self.store.knn(vector, k, ids)
        mine = [(aid, b) for aid in ids if aid in self._held for b in self._held[aid].blocks]
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        return merge_neighbors([stored, exact_knn(query, k, mine)], k)

    def sentences(self, refs: Sequence[tuple[str, int]]) -> list[str]:
        found = self.store.sentences(refs)
        for i, (aid, s) in enumerate(refs):
            held = self._held.get(aid)
            if not found[i] and held is not None and 0 <= s < len(held.sentences):
                found[i] = held.sentences[s]
        return found

    def stats(self) -> IndexStats:
        return self.store.stats()
