"""MemoryParts: contexts of a read-only lazy index, encoded into this process's memory.

A lazy index on a read-only volume (a mounted image, a shared snapshot) still answers cold questions:
the contexts are encoded as on a writable index and kept here, over what the index stores, never written.
What a question sees is what it would see on a writable copy of the index.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from bertknn_search.backends.blocks import Block, exact_knn, merge_neighbors
from bertknn_search.records import Coverage, EncodedArticle, IndexStats, Neighbors, PendingArticle

if TYPE_CHECKING:
    from bertknn_search.backends.base import Store

# Bytes held at most, everything counted (vectors as float32, the other columns, row numbers, the
# sentences and ids as Python strings, each object's header): beyond it the least recently encoded
# articles are dropped and encoded again when next needed.
MAX_BYTES = 1 << 30
# What an article costs besides its arrays and strings: its _Held, its lists, its OrderedDict entry.
ARTICLE_OVERHEAD = 512


def _array_bytes(array: np.ndarray) -> int:
    """What an array that owns its data takes: its data and its header."""
    return sys.getsizeof(array) if array.base is None else array.nbytes + sys.getsizeof(np.empty(0))


@dataclass
class _Held:
    fingerprint: str
    total: int
    sentences: list[str]
    rows: list[np.ndarray] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    nbytes: int = 0  # every byte this article holds here (``MAX_BYTES``), kept as parts are added

    @classmethod
    def of(cls, article_id: str, fingerprint: str, total: int, sentences: list[str]) -> _Held:
        held = cls(fingerprint, total, sentences)
        texts = [article_id, fingerprint, *sentences]
        held.nbytes = ARTICLE_OVERHEAD + sys.getsizeof(sentences) + sum(sys.getsizeof(t) for t in texts)
        return held

    def add(self, rows: np.ndarray, block: Block) -> None:
        self.rows.append(rows)
        self.blocks.append(block)
        arrays = [rows, *block.values()]
        self.nbytes += sys.getsizeof(block) + 2 * 8 + sum(_array_bytes(a) for a in arrays)  # + list slots

    @property
    def done(self) -> np.ndarray:
        return np.concatenate(self.rows) if self.rows else np.zeros(0, np.int64)


class MemoryParts:
    """The context side of a read-only store, with contexts encoded here added in memory."""

    read_only = ""  # memory takes what the store cannot

    def __init__(self, store: Store) -> None:
        self.store = store
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self._bytes = 0  # the sum of the held articles' nbytes

    @property
    def nbytes(self) -> int:
        """Bytes the contexts encoded here hold, all counted (at most ``MAX_BYTES`` but for one article)."""
        return self._bytes

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
            # Copies: a view would keep the whole batch it was cut from alive, uncounted.
            rows = np.arange(len(block)) if item.rows is None else np.array(item.rows)
            aid = item.article.id
            held = self._held.get(aid)
            if held is None or held.fingerprint != item.fingerprint:
                self._drop(aid)
                held = _Held.of(aid, item.fingerprint, item.total or len(block), list(block.sentences))
                self._held[aid] = held
                self._bytes += held.nbytes
            before = held.nbytes
            held.add(
                rows,
                {
                    "vectors": block.vectors.astype(np.float32),
                    "token_ids": np.array(block.token_ids),
                    "sentence_ids": np.array(block.sentence_ids),
                    "starts": np.array(block.starts),
                    "ends": np.array(block.ends),
                },
            )
            self._bytes += held.nbytes - before
            self._held.move_to_end(aid)
        while len(self._held) > 1 and self._bytes > MAX_BYTES:
            self._drop(next(iter(self._held)))
        return len(items)

    def _drop(self, article_id: str) -> None:
        held = self._held.pop(article_id, None)
        if held is not None:
            self._bytes -= held.nbytes

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
