"""Neighbours' words of several wordpieces, read back from their sentences and keyed by their pieces."""

from __future__ import annotations

from typing import Any

import numpy as np

from bertknn_search.backends.base import Backend
from bertknn_search.records import Neighbors
from bertknn_search.values import WordKeys, word_value


def resolve_words(nb: Neighbors, backend: Backend, tokenizer: Any, keys: WordKeys) -> Neighbors:
    """``nb`` with each word of several wordpieces keyed by its own wordpieces (``values.word_key``).

    The store holds a 31-bit hash that two words may share; each such neighbour's word is read back
    from its sentence (its span, tokenised again), so two words that share a hash get two keys, two
    votes and their own evidence. A neighbour whose sentence no longer holds the word its hash says (its
    article was replaced since the search) is left out: its vote cannot be given to a word.

    Args:
        nb: neighbours as the store returns them (token_ids as stored).
        backend: reads their sentences.
        tokenizer: the index's tokenizer (a Hugging Face tokenizer).
        keys: checks the keys against each other and the words asked about.

    Returns:
        ``nb`` itself when it holds no word of several wordpieces; else a copy with int64 token_ids.

    Raises:
        WordCollisionError: two different words have the same 64-bit key (refused, never merged).
    """
    rows = np.flatnonzero(nb.token_ids < 0)
    if not rows.size:
        return nb
    texts = backend.sentences([(nb.article_ids[r], int(nb.sentence_ids[r])) for r in rows])
    spans = [text[int(nb.starts[r]) : int(nb.ends[r])] for r, text in zip(rows, texts)]
    found: list[list[int]] = tokenizer(spans, add_special_tokens=False)["input_ids"]
    same = np.array([len(p) > 1 and word_value(p) == int(nb.token_ids[r]) for r, p in zip(rows, found)])
    token_ids = np.asarray(nb.token_ids, dtype=np.int64).copy()
    token_ids[rows[same]] = keys.neighbours([p for p, ok in zip(found, same) if ok])
    keep = np.setdiff1d(np.arange(len(nb)), rows[~same])
    return Neighbors(
        nb.distances[keep],
        token_ids[keep],
        [nb.article_ids[r] for r in keep.tolist()],
        nb.sentence_ids[keep],
        nb.starts[keep],
        nb.ends[keep],
        None if nb.vectors is None else nb.vectors[keep],
    )
