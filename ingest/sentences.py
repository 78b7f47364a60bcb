"""Sentence splitting: article text -> sentences, paragraph by paragraph, with sentencex."""

from __future__ import annotations

from importlib.metadata import version

import sentencex

from bertknn_search.errors import IndexMismatchError

# Part of what an article's stored sentences mean: another splitter, or another release of it, may cut
# other sentences and so give other sentence ids. An index records it (``IndexMeta.splitter``), so a lazy
# index encodes its later articles with the splitting its first ones got.
SPLITTER = f"sentencex {version('sentencex')} en"


def check_splitter(recorded: str, where: str) -> None:
    """Raise unless sentences split here are split as the index at ``where`` split its own.

    Args:
        recorded: the index's ``IndexMeta.splitter``; "" for an index made before splitters were
            recorded, which is split with whatever is installed, as it was then.

    Raises:
        IndexMismatchError: the index was built with another splitter or release of it.
    """
    if recorded and recorded != SPLITTER:
        name, _, rest = recorded.partition(" ")
        wanted = rest.partition(" ")[0]
        raise IndexMismatchError(
            f"index at {where} splits sentences with {recorded!r} and this installation with {SPLITTER!r};"
            f" install that release (pip install '{name}=={wanted}') or ingest into a new --index"
        )


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
