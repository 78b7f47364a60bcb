"""The IR vocabulary shared by both backends: normalised unigrams and word bigrams of a text.

Both backends index exactly these strings (OpenSearch receives them pre-tokenised and splits on
whitespace), so the article ranking cannot drift apart through two different analyzers.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from functools import lru_cache
from itertools import pairwise

from bertknn_search.stopwords import STOPWORDS

_TOKEN = re.compile(r"[^\W_]+")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
BIGRAM_JOIN = "_"


def tokenize(text: str) -> list[str]:
    """Lowercased runs of Unicode letters/digits, accents folded ("Zürich" -> "zurich").

    NFD splits an accented letter into the letter and a combining mark; the marks are dropped so that a
    word stays one term (DrQA keeps them inside the token with ``\\p{M}``; folding also lets "Zurich"
    find "Zürich", which is what a search user expects). Spacing vowel signs of Indic scripts are not
    accents and still split a word; index and query split alike, so such words still match.
    """
    return _TOKEN.findall(fold_accents(text).lower())


def fold_accents(text: str) -> str:
    """``text`` in NFD without combining marks.

    Only runs of non-ASCII characters are decomposed: NFD works character by character (and then only
    reorders combining marks, which all go), so this equals folding the whole text, at the cost of the
    few non-ASCII runs of English text instead of every character.
    """
    if text.isascii():
        return text
    marks = _combining_marks()
    return _NON_ASCII.sub(lambda run: unicodedata.normalize("NFD", run[0]).translate(marks), text)


@lru_cache(maxsize=1)
def _combining_marks() -> dict[int, None]:
    """A ``str.translate`` table deleting every character with a nonzero canonical combining class."""
    return {cp: None for cp in range(sys.maxunicode + 1) if unicodedata.combining(chr(cp))}


def query_terms(text: str) -> tuple[list[str], list[str]]:
    """The unigrams and bigrams a query searches for: no stopword n-grams, each term once, in order.

    Returns:
        (unigrams, bigrams) with duplicates and any n-gram containing a stopword removed.
    """
    tokens = tokenize(text)
    unigrams = [t for t in tokens if t not in STOPWORDS]
    pairs = [f"{a}{BIGRAM_JOIN}{b}" for a, b in pairwise(tokens) if a not in STOPWORDS and b not in STOPWORDS]
    return list(dict.fromkeys(unigrams)), list(dict.fromkeys(pairs))


def document_text(title: str, text: str) -> str:
    """The text an article is indexed under: its title line, then its body."""
    return f"{title}\n{text}"
