"""Sentence splitting: article text -> sentences, paragraph by paragraph, with sentencex."""

from __future__ import annotations

import sentencex

# Part of what an article's stored sentences mean: a different splitter gives other sentence ids.
SPLITTER = "sentencex-en"


def split_sentences(text: str) -> list[str]:
    """Split an article into sentences, never across a line break (one paragraph per line).

    sentencex (Wikimedia's rule-based segmenter, written in Rust) returns slices of its input, so the
    sentences hold exactly the non-whitespace characters of ``text``, in order.

    Args:
        text: plain text, paragraphs separated by newlines.

    Returns:
        The sentences in order, each stripped and non-empty; [] for blank text.
    """
    sentences: list[str] = []
    for paragraph in text.splitlines():
        if paragraph.strip():
            pieces = (piece.strip() for piece in sentencex.segment("en", paragraph))
            sentences.extend(piece for piece in pieces if piece)
    return sentences
