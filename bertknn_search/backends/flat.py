"""FlatIndex: a FAISS index over every stored context, for the paper's kNN-without-IR mode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bertknn_search.records import Neighbors


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
    def build(cls, blocks: list[tuple[str, dict[str, np.ndarray]]], dim: int, generation: int) -> FlatIndex:
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
