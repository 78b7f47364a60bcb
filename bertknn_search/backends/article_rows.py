"""A long article's sentences and rows, made a slice at a time with a front end's ``between`` between
slices: a server answers the questions that wait there, instead of after the whole article's split and
tokenization (seconds for a long one). The slices give what one call on the whole article gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from bertknn_search.encoding.encoder import Encoder
from bertknn_search.ingest.contexts import RowTable
from bertknn_search.records import IndexMeta

# Characters of paragraphs split at a time, and sentences whose rows are made at a time.
PREPARE_CHARS = 50_000
PREPARE_SENTENCES = 512


def split_in_slices(text: str, between: Callable[[], None] | None) -> list[str]:
    """``split_sentences(text)``, a slice of paragraphs at a time with ``between`` between slices (a
    sentence never spans a line break, so the slices split as the whole text does)."""
    from bertknn_search.ingest.sentences import split_sentences

    if between is None or len(text) <= PREPARE_CHARS:
        return split_sentences(text)
    sentences: list[str] = []
    lines = text.splitlines()
    lo = 0
    while lo < len(lines):
        hi, size = lo, 0
        while hi < len(lines) and (hi == lo or size + len(lines[hi]) <= PREPARE_CHARS):
            size += len(lines[hi]) + 1
            hi += 1
        if lo:
            between()
        sentences.extend(split_sentences("\n".join(lines[lo:hi])))
        lo = hi
    return sentences


def rows_in_slices(
    sentences: Sequence[str], encoder: Encoder, meta: IndexMeta, between: Callable[[], None] | None
) -> RowTable:
    """``make_row_table([sentences])``, PREPARE_SENTENCES at a time with ``between`` between slices:
    rows never span sentences, so the slices' tables joined are the whole article's."""
    from bertknn_search.ingest.contexts import make_row_table

    def table(part: Sequence[str]) -> RowTable:
        return make_row_table([part], encoder, meta.mask_policy, meta.max_length)

    if between is None or len(sentences) <= PREPARE_SENTENCES:
        return table(sentences)
    parts = []
    for lo in range(0, len(sentences), PREPARE_SENTENCES):
        if lo:
            between()
        parts.append((lo, table(sentences[lo : lo + PREPARE_SENTENCES])))
    return join_tables(parts)


def join_tables(parts: Sequence[tuple[int, RowTable]]) -> RowTable:
    """Row tables of consecutive slices of one article's sentences (each with its first sentence's
    number) as one table of the article."""
    first = parts[0][1]
    offsets = np.cumsum([0] + [len(t.tokens) for _, t in parts[:-1]])

    def column(name: str, shift: Sequence[int] | None = None) -> np.ndarray:
        shifts = shift if shift is not None else [0] * len(parts)
        return np.concatenate([getattr(t, name) + np.int32(by) for (_, t), by in zip(parts, shifts)])

    return dataclasses.replace(
        first,
        tokens=[ids for _, t in parts for ids in t.tokens],
        sentence_index=column("sentence_index", [int(o) for o in offsets]),
        article=column("article"),
        sentence=column("sentence", [lo for lo, _ in parts]),
        position=column("position"),
        length=column("length"),
        token_id=column("token_id"),
        start=column("start"),
        end=column("end"),
    )
