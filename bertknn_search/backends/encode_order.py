"""In which order a cold article's contexts are encoded, so that a budget of them answers a question.

A question searches the k contexts nearest its own [MASK]. Cheap guesses at where those are, made
before anything is encoded:

- **lead**: the article's own order. Its first sentences say what it is about, and the words a question
  about its subject is answered with (its name, its kind, its place) are there;
- **lexical**: sentences that share the question's and the subject's rarer words (idf within the
  article), and in them the words that stand where the [MASK] stands (the same word before, after);
- **sentence**: the shared rare words alone;
- **mixed**: lead and lexical in turn, half the budget each.

``benchmarks/bench_anytime.py`` measured how often each gives the exact answer's top-1 (real MiniLM
weights, 400 LAMA-template questions over the enwiki fragment's 10 longest articles): at the budgets a
CPU can afford (up to about 1,000 contexts) **lead** wins (30% at 64 contexts, 52% at 256; lexical 12% and
35%, no better than a random order); lexical and sentence win only from 2,048 contexts on. So lead is
the default (``lazy.ORDER``). What a trained masked LM would prefer cannot be measured here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bertknn_search.encoding.encoder import MASK
from bertknn_search.stopwords import STOPWORDS

STRATEGIES = ("mixed", "lexical", "sentence", "lead")
# A row whose neighbouring word matches the [MASK]'s counts like a sentence sharing one rare word more.
NEIGHBOUR_WEIGHT = 1.0
_TOKEN = re.compile(r"\w+|[^\w\s]")
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Lexicon:
    """What ranking needs of an article, computed once per article and reused by every question.

    Attributes:
        words: per sentence, its lowercased words.
        sentence: per row, its sentence.
        before, after: per row, the token just before and after its word (lowercased; "" at an edge).
    """

    words: list[frozenset[str]]
    sentence: np.ndarray
    before: np.ndarray
    after: np.ndarray

    @property
    def lexicon(self) -> Lexicon:
        return self

    @classmethod
    def of(cls, sentences: Sequence[str], spans: np.ndarray) -> Lexicon:
        """The lexicon of an article from its sentences and its rows' (sentence, start, end)."""
        spans = np.asarray(spans, dtype=np.int64).reshape(-1, 3)
        before, after = [], []
        for s, start, end in spans.tolist():
            text = sentences[s]
            left = _TOKEN.findall(text[max(start - 40, 0) : start].lower())
            right = _TOKEN.findall(text[end : end + 40].lower())
            before.append(left[-1] if left else "")
            after.append(right[0] if right else "")
        return cls(
            words=[frozenset(_WORD.findall(s.lower())) for s in sentences],
            sentence=spans[:, 0],
            before=np.array(before, dtype=object),
            after=np.array(after, dtype=object),
        )


class HasLexicon(Protocol):
    """An article whose lexicon is made when first asked for (the lead order never asks)."""

    @property
    def lexicon(self) -> Lexicon: ...


def order_rows(
    question: str, subject: str | None, article: HasLexicon, candidates: np.ndarray, strategy: str = "lead"
) -> np.ndarray:
    """``candidates`` (row numbers) best first for ``question``.

    Args:
        question: the question, with its [MASK].
        subject: its subject, whose words count as the question's.
        article: gives the article's lexicon (``Lexicon.of``), when a strategy needs it.
        candidates: the row numbers to order.
        strategy: one of ``STRATEGIES``.

    Returns:
        The candidates, best first; ties keep the article's order.
    """
    candidates = np.sort(np.asarray(candidates, dtype=np.int64))
    if strategy == "lead" or candidates.size == 0:
        return candidates
    if strategy == "mixed":
        return _alternate(candidates, order_rows(question, subject, article, candidates, "lexical"))
    lexicon = article.lexicon
    asked = _content_words(question.replace(MASK, " ")) | _content_words(subject or "")
    df = {w: sum(w in ws for ws in lexicon.words) for w in asked}
    idf = {w: math.log(1 + len(lexicon.words) / (1 + n)) for w, n in df.items() if n}
    sentence_score = np.array([sum(idf.get(w, 0.0) for w in ws & idf.keys()) for ws in lexicon.words])
    score = sentence_score[lexicon.sentence[candidates]] if len(lexicon.words) else np.zeros(len(candidates))
    if strategy == "lexical":
        left, right = _neighbours(question)
        score = score + NEIGHBOUR_WEIGHT * (
            (lexicon.before[candidates] == left).astype(float) + (lexicon.after[candidates] == right)
        )
    return candidates[np.lexsort((candidates, -score))]


def _alternate(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Both orders taken in turn, each row once: a budget spends half on each order's best."""
    out: list[int] = []
    seen: set[int] = set()
    for pair in zip(first.tolist(), second.tolist()):
        for row in pair:
            if row not in seen:
                seen.add(row)
                out.append(row)
    return np.array(out, dtype=np.int64)


def _content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in STOPWORDS}


def _neighbours(question: str) -> tuple[str, str]:
    """The tokens just before and after the question's [MASK] (lowercased; "" at an edge)."""
    before, _, after = question.partition(MASK)
    left, right = _TOKEN.findall(before.lower()), _TOKEN.findall(after.lower())
    return (left[-1] if left else ""), (right[0] if right else "")


# -- a budget over several articles and questions -------------------------------------------------
def merged(picks: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Several questions' rows per article as one ranking per article: best first, each row once."""
    parts: dict[str, list[np.ndarray]] = {}
    for pick in picks:
        for aid, rows in pick.items():
            parts.setdefault(aid, []).append(rows)
    out = {aid: first_seen(np.concatenate(rows)) for aid, rows in parts.items()}
    return {aid: rows for aid, rows in out.items() if rows.size}


def by_article(chosen: Mapping[str, np.ndarray]) -> list[tuple[str, int]]:
    """(article, row) pairs, one article's rows after another's, each article's best first."""
    return [(aid, int(r)) for aid, rows in chosen.items() for r in rows]


def first_seen(rows: np.ndarray) -> np.ndarray:
    """``rows`` without repeats, each where it first comes."""
    _, first = np.unique(rows, return_index=True)
    return rows[np.sort(first)]


def in_turn(chosen: Mapping[str, np.ndarray]) -> list[tuple[str, int]]:
    """(article, row) pairs taking each article's rows in turn: every article's first, then second, ..."""
    lists = [(aid, rows.tolist()) for aid, rows in chosen.items()]
    depth = max((len(rows) for _, rows in lists), default=0)
    return [(aid, int(rows[d])) for d in range(depth) for aid, rows in lists if d < len(rows)]


def best_in_turn(ranked: Sequence[tuple[str, np.ndarray]], budget: int) -> dict[str, np.ndarray]:
    """The first ``budget`` rows of several articles' rankings, taken in turn (one article's best, the
    next's best, ...), so that each article a question searches gets its best rows encoded.

    Every article gets one row at least, even past the budget: an article with none stored would be
    searched as never encoded, which means encoding it whole.
    """
    taken: dict[str, list[int]] = {aid: [] for aid, _ in ranked}
    depth = 0
    left = max(budget, sum(len(rows) > 0 for _, rows in ranked))
    while left > 0 and any(depth < len(rows) for _, rows in ranked):
        for aid, rows in ranked:
            if depth < len(rows) and left > 0:
                taken[aid].append(int(rows[depth]))
                left -= 1
        depth += 1
    return {aid: np.array(rows, dtype=np.int64) for aid, rows in taken.items()}
