"""Which contexts of a cold article a question needs first, so that a budget of them answers it.

A question searches the k contexts nearest its own [MASK], and those are the contexts whose sentences
read most like it: sentences that share its rarer words ("born", the subject's name), at a word that
stands where its [MASK] stands (after "in", before "."). Ranking an article's rows by that, lexically and
before any encoding, lets the first few hundred of thousands of contexts give the exact answer most of
the time (``benchmarks/bench_anytime.py`` measures how often, and chose these weights).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from bertknn_search.encoder import MASK
from bertknn_search.stopwords import STOPWORDS

STRATEGIES = ("lexical", "sentence", "lead")
# A row whose neighbouring word matches the [MASK]'s counts like a sentence sharing one rare word more.
NEIGHBOUR_WEIGHT = 1.0
_TOKEN = re.compile(r"\w+|[^\w\s]")
_WORD = re.compile(r"\w+")


def order_rows(
    question: str,
    subject: str | None,
    sentences: Sequence[str],
    spans: np.ndarray | Sequence[tuple[int, int, int]],
    candidates: np.ndarray,
    strategy: str = "lexical",
) -> np.ndarray:
    """``candidates`` (row numbers) best first for ``question``.

    Args:
        question: the question, with its [MASK].
        subject: its subject, whose words count as the question's.
        sentences: the article's sentences.
        spans: for every row of the article, (sentence, start, end) of its masked word.
        candidates: the row numbers to order.
        strategy: "lexical" (shared rare words, then the mask's neighbours), "sentence" (shared rare
            words only) or "lead" (the article's order).

    Returns:
        The candidates, best first; ties keep the article's order.
    """
    candidates = np.asarray(candidates, dtype=np.int64)
    if strategy == "lead" or candidates.size == 0:
        return np.sort(candidates)
    words = [set(_WORD.findall(s.lower())) for s in sentences]
    asked = _content_words(question.replace(MASK, " ")) | _content_words(subject or "")
    df = {w: sum(w in ws for ws in words) for w in asked}
    idf = {w: math.log(1 + len(sentences) / (1 + n)) for w, n in df.items() if n}
    sentence_score = np.array([sum(idf.get(w, 0.0) for w in ws & idf.keys()) for ws in words])
    rows = np.asarray(spans, dtype=np.int64).reshape(-1, 3)[candidates]
    score = sentence_score[rows[:, 0]]
    if strategy == "lexical":
        left, right = _neighbours(question)
        for i, (s, start, end) in enumerate(rows):
            text = sentences[s]
            before, after = _TOKEN.findall(text[:start].lower()), _TOKEN.findall(text[end:].lower())
            hits = (bool(before) and before[-1] == left) + (bool(after) and after[0] == right)
            score[i] += NEIGHBOUR_WEIGHT * hits
    order = np.lexsort((candidates, -score))
    return candidates[order]


def _content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in STOPWORDS}


def _neighbours(question: str) -> tuple[str | None, str | None]:
    """The tokens just before and after the question's [MASK] (lowercased)."""
    before, _, after = question.partition(MASK)
    left, right = _TOKEN.findall(before.lower()), _TOKEN.findall(after.lower())
    return (left[-1] if left else None), (right[0] if right else None)
