"""Sentence splitting: article text -> sentences, paragraph by paragraph, with pysbd."""

from __future__ import annotations

from functools import lru_cache

import pysbd


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
            sentences.extend(_split_paragraph(paragraph))
    return sentences


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
