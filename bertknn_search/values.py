"""The kNN value space: wordpiece ids, and whole words of several wordpieces (pure).

A context's value is what a question's [MASK] may stand for. Under the single-wordpiece policies it is
the masked wordpiece's id, so that p_kNN and p_BERT share BERT's vocabulary (the paper's choice). Under
the whole-word policies a word of several wordpieces is a value too: its id is a hash of its wordpiece
ids, stored negative so that it never meets a token id, and it fits the int32 columns every store
already has. Two different words share an id with probability 2^-31 per pair: among one question's
128 neighbours that is about 4e-6, and a shared id only merges their votes.

A question's distributions run over the vocabulary followed by the words of several wordpieces among
its own neighbours (``ValueSpace``): dense arrays as before, and ids past the vocabulary that stand for
those words.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

HASH_SPAN = 1 << 31
# A "word" of more pieces is a code or a number string rather than an answer anyone asks for.
MAX_PIECES = 16


def word_value(piece_ids: Sequence[int]) -> int:
    """The value id of a word made of ``piece_ids``: the token id of one piece, else a negative hash."""
    if len(piece_ids) == 1:
        return int(piece_ids[0])
    digest = hashlib.blake2b(np.asarray(piece_ids, dtype="<i4").tobytes(), digest_size=4).digest()
    return -1 - (int.from_bytes(digest, "little") % HASH_SPAN)


def whole_words(policy: str) -> bool:
    """Whether mask ``policy`` stores words of several wordpieces (one [MASK] in place of all of them)."""
    return policy.startswith("whole-word")


def is_word(value: int) -> bool:
    """Whether ``value`` stands for a word of several wordpieces (not a token id)."""
    return value < 0


@dataclass(frozen=True)
class ValueSpace:
    """One question's answer space: the vocabulary's ids, then ``words`` at ids ``vocab_size + i``.

    Attributes:
        vocab_size: V, the model's vocabulary.
        words: (m,) int64 value ids of the words of several wordpieces among the neighbours, nearest
            first; empty under the single-wordpiece policies.
    """

    vocab_size: int
    words: np.ndarray

    @classmethod
    def of(cls, values: np.ndarray, vocab_size: int) -> ValueSpace:
        """The space of a question whose neighbours have ``values`` (nearest first)."""
        values = np.asarray(values, dtype=np.int64)
        negative = values[values < 0]
        if negative.size == 0:
            return cls(vocab_size, np.zeros(0, np.int64))
        unique, first = np.unique(negative, return_index=True)
        return cls(vocab_size, unique[np.argsort(first)])

    @property
    def size(self) -> int:
        return self.vocab_size + int(self.words.shape[0])

    def index(self, values: np.ndarray) -> np.ndarray:
        """Each value's position in the space (a token id stays itself)."""
        values = np.asarray(values, dtype=np.int64)
        out = values.copy()
        negative = values < 0
        if negative.any():
            order = np.argsort(self.words)
            found = order[np.searchsorted(self.words, values[negative], sorter=order)]
            out[negative] = self.vocab_size + found
        return out

    def value(self, position: int) -> int:
        """The value id at ``position`` of the space."""
        if position < self.vocab_size:
            return int(position)
        return int(self.words[position - self.vocab_size])

    def pad(self, p: np.ndarray, fill: float | bool = 0) -> np.ndarray:
        """``p`` over the vocabulary, extended over the words with ``fill``."""
        if not self.words.size:
            return p
        return np.concatenate([p, np.full(self.words.shape[0], fill, dtype=p.dtype)])

    def position(self, value: int) -> int | None:
        """Where ``value`` sits in this space; None for a word not among the neighbours."""
        if value >= 0:
            return value if value < self.vocab_size else None
        hits = np.flatnonzero(self.words == value)
        return self.vocab_size + int(hits[0]) if hits.size else None


@dataclass(frozen=True)
class Candidates:
    """The values a ranking may list (e.g. LAMA's common vocabulary, special tokens left out).

    Attributes:
        mask: (V,) bool over wordpiece ids.
        words: the words of several wordpieces that may be listed, by value; None allows every one.
    """

    mask: np.ndarray
    words: frozenset[int] | None = None

    def over(self, space: ValueSpace) -> np.ndarray:
        """(space.size,) bool: the mask over a question's space."""
        if not space.words.size:
            return self.mask
        if self.words is None:
            return space.pad(self.mask, True)
        return np.concatenate([self.mask, np.isin(space.words, list(self.words))])

    def __contains__(self, value: int) -> bool:
        if is_word(value):
            return self.words is None or value in self.words
        return bool(self.mask[value])

    def __and__(self, other: Candidates) -> Candidates:
        if self.words is None:
            words = other.words
        else:
            words = self.words if other.words is None else self.words & other.words
        return Candidates(self.mask & other.mask, words)
