"""Sentence splitting: article text -> sentences, paragraph by paragraph, with pysbd."""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

import pysbd

PIECE_CHARS = 10_000  # longest text given to pysbd at once
_ENDS = (". ", "! ", "? ")


def split_sentences(text: str) -> list[str]:
    """Split an article into sentences, never across a line break (one paragraph per line).

    No text is lost: the sentences hold exactly the non-whitespace characters of ``text``, in order.
    Where pysbd would drop or alter characters of a paragraph, that paragraph is kept whole as one
    sentence instead.

    Args:
        text: plain text, paragraphs separated by newlines.

    Returns:
        The sentences in order, each stripped and non-empty; [] for blank text.
    """
    sentences: list[str] = []
    for paragraph in text.splitlines():
        if paragraph.strip():
            for piece in _pieces(paragraph):
                sentences.extend(_split_paragraph(piece))
    return sentences


def _pieces(paragraph: str) -> Iterator[str]:
    """The paragraph cut after a sentence end (else a space) about every ``PIECE_CHARS`` characters.

    pysbd's time grows with the square of the text it is given (a 200,000-character paragraph takes
    half a minute, a 50 MB one would take days), so it is given bounded pieces. Prose paragraphs are far
    shorter than a piece and are never cut.
    """
    start = 0
    while len(paragraph) - start > PIECE_CHARS:
        lo, hi = start + PIECE_CHARS // 2, start + PIECE_CHARS
        window = paragraph[lo:hi]
        ends = [window.rfind(mark) for mark in _ENDS]
        cut = max(ends) + 1 if max(ends) >= 0 else window.rfind(" ")
        end = lo + cut if cut > 0 else hi
        yield paragraph[start:end]
        start = end
    yield paragraph[start:]


def _split_paragraph(paragraph: str) -> list[str]:
    pieces = [piece.strip() for piece in _segmenter().segment(paragraph)]
    pieces = [piece for piece in pieces if piece]
    if _visible("".join(pieces)) != _visible(paragraph):
        return [paragraph.strip()]
    return pieces


def _visible(text: str) -> str:
    return "".join(text.split())


@lru_cache(maxsize=1)
def _segmenter() -> pysbd.Segmenter:
    # clean=False: pysbd must not rewrite the text, or the sentences would no longer match the article.
    return pysbd.Segmenter(language="en", clean=False)
