"""The kind of an answer (year, number, month, punctuation, word) and what the neighbours say about it.

Relations differ by the kind of their answers: "X (born [MASK])." wants a year, "X was born in [MASK]."
a word. The question's neighbours show which kind the question wants: the values they hold, weighted by
their kNN probability, mostly share one kind. An answer of another kind ('lebanon' to a question whose
neighbours hold years, '1960' or ',' to one whose neighbours hold places) is almost never right (issue
49: 35% of MiniLM's answers to place questions were numbers, months or punctuation, none right), so the
confidence reads these signals and the ranking can keep to the neighbours' kind (``--same-kind``).

A value of several wordpieces (the whole-word policies) is taken as a word: its text is not at hand
here, and numbers and years are single wordpieces in BERT's vocabularies.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bertknn_search.query.knn import knn_logits

KINDS = ("word", "year", "number", "month", "punctuation")
WORD, YEAR, NUMBER, MONTH, PUNCTUATION = range(len(KINDS))
MONTHS = frozenset(
    "january february march april may june july august september october november december".split()
)
_YEAR = re.compile(r"1[0-9]{3}|20[0-9]{2}")
_NUMBER = re.compile(r"[0-9][0-9.,]*|[0-9.,]*[0-9](st|nd|rd|th)?")


def kind_of(token: str) -> str:
    """The kind of one token or word ("word" for anything that is not a year, number, month or
    punctuation; a continuation piece's ``##`` is ignored)."""
    return KINDS[_code(token)]


def _code(token: str) -> int:
    text = token[2:] if token.startswith("##") and len(token) > 2 else token
    low = text.lower()
    if _YEAR.fullmatch(low):
        return YEAR
    if _NUMBER.fullmatch(low):
        return NUMBER
    if low in MONTHS:
        return MONTH
    if text and not any(c.isalnum() for c in text) and not (text.startswith("[") and text.endswith("]")):
        return PUNCTUATION
    return WORD


@dataclass(frozen=True)
class KindSignals:
    """What an answer's kind says about it.

    Attributes:
        kind: the top answer's kind.
        majority: the kind that holds most of the neighbours' kNN probability.
        share: the share of the kNN probability on answers of ``kind`` (0 without neighbours).
        bert_share: BERT's probability mass on tokens of ``kind``; None without an MLM head.
        bert_p: BERT's probability of the answer itself; None without an MLM head or for a word of
            several wordpieces (BERT gives one wordpiece a probability).
        zipf: how common the answer word is in English (``word_frequency.zipf``); None where not known.
    """

    kind: str = "word"
    majority: str = "word"
    share: float = 1.0
    bert_share: float | None = None
    bert_p: float | None = None
    zipf: float | None = None

    @property
    def agree(self) -> bool:
        return self.kind == self.majority


class KindTable:
    """Each wordpiece id's kind, read once from a vocabulary."""

    def __init__(self, vocab: Sequence[str]) -> None:
        self.codes = np.fromiter((_code(t) for t in vocab), dtype=np.int8, count=len(vocab))

    @property
    def size(self) -> int:
        return int(self.codes.shape[0])

    def of(self, values: np.ndarray) -> np.ndarray:
        """Kind codes of values: wordpiece ids by the table, anything else (a word's key) a word."""
        v = np.asarray(values, dtype=np.int64)
        inside = (v >= 0) & (v < self.size)
        out = np.full(v.shape, WORD, dtype=np.int8)
        out[inside] = self.codes[v[inside]]
        return out

    def signals(
        self, top: int | None, values: np.ndarray, weights: np.ndarray, p_bert: np.ndarray | None = None
    ) -> KindSignals:
        """The kind signals of the answer ``top`` given the neighbours' ``values`` and their kNN
        ``weights`` (any non-negative numbers; they are normalised here)."""
        if top is None:
            return KindSignals()
        code = int(self.of(np.array([top]))[0])
        bert_share = bert_p = None
        if p_bert is not None and p_bert.shape[0] == self.size:
            bert_share = float(p_bert[self.codes == code].sum())
            bert_p = float(p_bert[top]) if 0 <= top < self.size else None
        w = np.asarray(weights, dtype=np.float64)
        if not len(values) or not np.isfinite(w).all() or w.sum() <= 0:
            return KindSignals(KINDS[code], KINDS[code], 0.0, bert_share, bert_p)
        mass = np.bincount(self.of(values), weights=w, minlength=len(KINDS)) / w.sum()
        # Ties go to the answer's own kind: a split vote is no disagreement.
        best = code if mass[code] >= mass.max() else int(mass.argmax())
        return KindSignals(KINDS[code], KINDS[best], float(mass[code]), bert_share, bert_p)

    def majority(self, values: np.ndarray, weights: np.ndarray) -> str | None:
        """The kind that holds most of the neighbours' kNN probability; None without neighbours."""
        w = np.asarray(weights, dtype=np.float64)
        if not len(values) or not np.isfinite(w).all() or w.sum() <= 0:
            return None
        return KINDS[int(np.bincount(self.of(values), weights=w, minlength=len(KINDS)).argmax())]

    def same_kind(self, p: np.ndarray, majority: str | None) -> np.ndarray:
        """``p`` (over the vocabulary, then words of several wordpieces) with every answer of another kind
        than ``majority`` set to 0 (``--same-kind``); unchanged without a majority."""
        if majority is None:
            return p
        codes = np.full(p.shape[0], WORD, dtype=np.int8)
        n = min(self.size, p.shape[0])
        codes[:n] = self.codes[:n]
        return np.where(codes == KINDS.index(majority), p, 0.0)


def neighbour_weights(distances: np.ndarray, temperature: float, squared: bool = True) -> np.ndarray:
    """Each neighbour's unnormalised kNN weight exp(-(d - d_min)/l), as ``knn.knn_probs`` sums them."""
    return np.exp(knn_logits(np.asarray(distances), temperature, squared))
