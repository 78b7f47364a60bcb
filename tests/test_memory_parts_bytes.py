"""MemoryParts' cap (a read-only lazy index's contexts kept in memory) counts every byte it holds."""

from __future__ import annotations

import tracemalloc
from collections.abc import Sequence

import numpy as np
import pytest

from bertknn_search.backends import memory_parts
from bertknn_search.backends.memory_parts import MemoryParts
from bertknn_search.records import Article, ContextBlock, Coverage, EncodedArticle


class ReadOnlyStore:
    """The little of a read-only store that holding contexts asks: nothing is stored there."""

    read_only = "a read-only volume"

    def coverage(self, article_ids: Sequence[str]) -> dict[str, Coverage]:
        return {}


def encoded(article_id: str, sentences: list[str], contexts: int = 2, dim: int = 4) -> EncodedArticle:
    ints = np.zeros(contexts, np.int32)
    block = ContextBlock(sentences, np.ones((contexts, dim), np.float16), ints, ints, ints, ints + 1)
    return EncodedArticle(Article(article_id, article_id, " ".join(sentences)), block, f"fp-{article_id}")


def held(parts: MemoryParts, article_ids: Sequence[str]) -> list[str]:
    return sorted(parts.coverage(article_ids))


def test_the_cap_counts_the_sentences_not_only_the_vectors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two articles of a few bytes of vectors but 1 MB of text each, under a 1.5 MB cap: one is dropped."""
    monkeypatch.setattr(memory_parts, "MAX_BYTES", 1_500_000)
    parts = MemoryParts(ReadOnlyStore())  # type: ignore[arg-type]
    long_text = ["x" * 1000] * 1000
    parts.put_contexts([encoded("a", long_text)])
    assert held(parts, ["a", "b"]) == ["a"]
    parts.put_contexts([encoded("b", long_text)])
    assert held(parts, ["a", "b"]) == ["b"]  # the least recently encoded goes


def test_the_count_matches_what_the_held_contexts_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """The count is within 10% of the memory tracemalloc sees the held articles take, and it falls
    back to zero as they are dropped."""
    parts = MemoryParts(ReadOnlyStore())  # type: ignore[arg-type]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        items = [
            encoded(str(i), [f"sentence {i} {j} " + "y" * (20 * j) for j in range(50)], contexts=300, dim=32)
            for i in range(20)
        ]
        parts.put_contexts(items)
        del items
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert parts.nbytes == pytest.approx(taken, rel=0.1)
    monkeypatch.setattr(memory_parts, "MAX_BYTES", 0)
    parts.put_contexts([encoded("last", ["z"])])  # everything but the newest goes
    assert held(parts, [str(i) for i in range(20)] + ["last"]) == ["last"]
    assert 0 < parts.nbytes < 2000
