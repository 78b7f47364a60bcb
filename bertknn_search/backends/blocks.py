"""Context blocks in memory: exact kNN over a few articles' blocks, and a FAISS index over all of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertknn_search.records import Neighbors

# One article's context arrays: vectors (n, dim) float32 (decoded from the store); token_ids, sentence_ids,
# starts, ends (n,) int32.
Block = dict[str, np.ndarray]


@dataclass
class FlatIndex:
    """Exact (IndexFlatL2, squared distances) search over all contexts, tagged with the store generation.

    The paper's no-IR ablation used IVF-PQ over 900M keys; at the sizes an embedded store holds, the
    exact flat index is affordable and keeps the ablation free of approximation error.
    """

    index: Any
    generation: int
    article_ids: list[str]
    owner: np.ndarray
    token_ids: np.ndarray
    sentence_ids: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def build(cls, blocks: list[tuple[str, Block]], dim: int, generation: int) -> FlatIndex:
        import faiss

        index = faiss.IndexFlatL2(dim)
        for _, block in blocks:
            if len(block["token_ids"]):
                index.add(np.ascontiguousarray(block["vectors"], dtype=np.float32))

        def column(name: str) -> np.ndarray:
            arrays = [b[name] for _, b in blocks]
            return np.concatenate(arrays) if arrays else np.zeros(0, np.int32)

        owner = [np.full(len(b["token_ids"]), i, dtype=np.int64) for i, (_, b) in enumerate(blocks)]
        return cls(
            index=index,
            generation=generation,
            article_ids=[aid for aid, _ in blocks],
            owner=np.concatenate(owner) if owner else np.zeros(0, np.int64),
            token_ids=column("token_ids"),
            sentence_ids=column("sentence_ids"),
            starts=column("starts"),
            ends=column("ends"),
        )

    def search(self, query: np.ndarray, k: int) -> Neighbors:
        if self.index.ntotal == 0:
            return Neighbors.empty()
        distances, rows = self.index.search(
            query.reshape(1, -1).astype(np.float32), min(k, self.index.ntotal)
        )
        rows = rows[0][rows[0] >= 0]
        return Neighbors(
            distances=distances[0][: len(rows)].astype(np.float32),
            token_ids=self.token_ids[rows].astype(np.int64),
            article_ids=[self.article_ids[i] for i in self.owner[rows]],
            sentence_ids=self.sentence_ids[rows],
            starts=self.starts[rows],
            ends=self.ends[rows],
        )


def exact_knn(query: np.ndarray, k: int, blocks: list[tuple[str, Block]]) -> Neighbors:
    """Exact k nearest rows of ``blocks`` to ``query`` by squared L2.

    Ties are broken by (article id, sentence, start), the order both backends use.
    """
    blocks = [(aid, b) for aid, b in blocks if len(b["token_ids"])]
    if not blocks:
        return Neighbors.empty()
    keys = np.concatenate([b["vectors"] for _, b in blocks]).astype(np.float32, copy=False)
    # An article may come as several blocks (the parts of a lazy index): ties go by article, not block.
    rank = {aid: i for i, aid in enumerate(sorted({aid for aid, _ in blocks}))}
    owner = np.concatenate([np.full(len(b["token_ids"]), rank[aid]) for aid, b in blocks])
    names = sorted(rank, key=rank.__getitem__)
    cols = {
        name: np.concatenate([b[name] for _, b in blocks])
        for name in ("token_ids", "sentence_ids", "starts", "ends")
    }
    diff = keys - query[None, :]
    dist = np.einsum("ij,ij->i", diff, diff)
    if k < len(dist):
        cut = np.partition(dist, k - 1)[k - 1]
        pool = np.flatnonzero(dist <= cut)
    else:
        pool = np.arange(len(dist))
    order = pool[np.lexsort((cols["starts"][pool], cols["sentence_ids"][pool], owner[pool], dist[pool]))][:k]
    return Neighbors(
        distances=dist[order].astype(np.float32),
        token_ids=cols["token_ids"][order].astype(np.int64),
        article_ids=[names[i] for i in owner[order]],
        sentence_ids=cols["sentence_ids"][order],
        starts=cols["starts"][order],
        ends=cols["ends"][order],
        vectors=keys[order],
    )


def merge_neighbors(found: Sequence[Neighbors], k: int) -> Neighbors:
    """The k nearest of several searches over disjoint articles, ordered as one ``exact_knn`` orders."""
    found = [n for n in found if len(n)]
    if len(found) <= 1:
        return found[0] if found else Neighbors.empty()
    ids = [aid for n in found for aid in n.article_ids]
    rank = {aid: i for i, aid in enumerate(sorted(set(ids)))}
    cols = {
        name: np.concatenate([getattr(n, name) for n in found])
        for name in ("distances", "token_ids", "sentence_ids", "starts", "ends")
    }
    owner = np.array([rank[a] for a in ids])
    order = np.lexsort((cols["starts"], cols["sentence_ids"], owner, cols["distances"]))[:k]
    vectors = None if any(n.vectors is None for n in found) else np.concatenate([n.vectors for n in found])
    return Neighbors(
        distances=cols["distances"][order],
        token_ids=cols["token_ids"][order],
        article_ids=[ids[i] for i in order],
        sentence_ids=cols["sentence_ids"][order],
        starts=cols["starts"][order],
        ends=cols["ends"][order],
        vectors=None if vectors is None else vectors[order],
    )
