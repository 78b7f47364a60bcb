"""The kNN value space: wordpiece ids, and whole words of several wordpieces (pure).

A context's value is what a question's [MASK] may stand for. Under the single-wordpiece policies it is
the masked wordpiece's id, so that p_kNN and p_BERT share BERT's vocabulary (the paper's choice). Under
the whole-word policies a word of several wordpieces is a value too, and it has two ids:

- stored, ``word_value``: a 31-bit hash of its wordpiece ids, negative so that it never meets a token
  id, in the int32 columns every store already has. Two words share it with probability 2^-31 a pair,
  so a corpus of millions of such words holds thousands of pairs that do; it only says "a word of
  several wordpieces" and is never compared with another word's.
- asked, ``word_key``: what every ranking, vote, gold answer and candidate list compares. The searcher
  reads each neighbour's word back from its sentence (its span, tokenised again) and keys it by its own
  wordpieces: a 64-bit hash kept below -2^31, so it is neither a token id nor a stored value. Two words
  that share one (2^-63 a pair) are refused (``WordCollisionError``), never merged: ``WordKeys``
  remembers the pieces of each key it handed out.

A question's distributions run over the vocabulary followed by the words of several wordpieces among
its own neighbours (``ValueSpace``): dense arrays as before, and ids past the vocabulary that stand for
those words.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bertknn_search.errors import WordCollisionError

HASH_SPAN = 1 << 31
# Keys of words of several wordpieces lie in [-2^63, -2^31 - 1]: below every stored value.
KEY_SPAN = (1 << 63) - HASH_SPAN
# Words asked about (gold answers, candidate lists, evidence) whose pieces are remembered: an
# evaluation's gold words fit many times over; beyond it the least recently asked is forgotten (and
# remembered again when next asked).
ASKED_WORDS = 1 << 18
# A "word" of more pieces is a code or a number string rather than an answer anyone asks for.
MAX_PIECES = 16


def word_value(piece_ids: Sequence[int]) -> int:
    """The value id of a word made of ``piece_ids``: the token id of one piece, else a negative hash."""
    if len(piece_ids) == 1:
        return int(piece_ids[0])
    digest = hashlib.blake2b(np.asarray(piece_ids, dtype="<i4").tobytes(), digest_size=4).digest()
    return -1 - (int.from_bytes(digest, "little") % HASH_SPAN)


def word_key(piece_ids: Sequence[int]) -> int:
    """The key a word made of ``piece_ids`` is compared by: the token id of one piece, else a negative
    64-bit hash below every stored value (``word_value``), so that a stored value is never taken for one."""
    if len(piece_ids) == 1:
        return int(piece_ids[0])
    digest = hashlib.blake2b(np.asarray(piece_ids, dtype="<i4").tobytes(), digest_size=8).digest()
    return -HASH_SPAN - 1 - (int.from_bytes(digest, "little") % KEY_SPAN)


class WordKeys:
    """Keys of words of several wordpieces, with the pieces each stands for: a shared key is refused.

    The words asked about are remembered (at most ``capacity``, the least recently asked forgotten
    first); a question's neighbour words are checked against them and against each other.
    """

    def __init__(self, capacity: int = ASKED_WORDS) -> None:
        self.capacity = capacity
        self._asked: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()  # the server asks from several threads

    def ask(self, piece_ids: Sequence[int]) -> int:
        """The key of an asked word (a gold answer, a listed candidate), remembered.

        Raises:
            WordCollisionError: another word remembered has the same key.
        """
        pieces = tuple(int(i) for i in piece_ids)
        key = word_key(pieces)
        if len(pieces) > 1:
            with self._lock:
                _same(key, pieces, self._asked.get(key, pieces))
                self._asked[key] = pieces
                self._asked.move_to_end(key)
                while len(self._asked) > self.capacity:
                    self._asked.popitem(last=False)
        return key

    def neighbours(self, words: Sequence[Sequence[int]]) -> list[int]:
        """The keys of one question's neighbour words (each its wordpiece ids), not remembered.

        Raises:
            WordCollisionError: two of them, or one and an asked word, have the same key.
        """
        seen: dict[int, tuple[int, ...]] = {}
        keys = []
        for piece_ids in words:
            pieces = tuple(int(i) for i in piece_ids)
            key = word_key(pieces)
            with self._lock:
                asked = self._asked.get(key, pieces)
            _same(key, pieces, seen.setdefault(key, pieces))
            _same(key, pieces, asked)
            keys.append(key)
        return keys


def _same(key: int, pieces: tuple[int, ...], other: tuple[int, ...]) -> None:
    if pieces != other:
        raise WordCollisionError(
            f"two different words (wordpiece ids {list(pieces)} and {list(other)}) share the key {key};"
            " they cannot be told apart: report it with the index and question"
        )


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
        words: (m,) int64 keys (``word_key``) of the words of several wordpieces among the neighbours,
            nearest first; empty under the single-wordpiece policies.
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
        words: the words of several wordpieces that may be listed, by key (``word_key``); None allows
            every one.
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
