"""What a question needs of its articles, kept in the process between requests (no I/O here).

A warm question on an engine makes two requests: the IR search, whose hits carry each article's state
(title, generation, how much of it is encoded), and the kNN search. Everything else it reads (which
articles need encoding, their coverage, the generations to filter on, titles, and the sentences of the
neighbours) comes from here:

- ``ArticleState``: an article doc's small fields, as the last search that returned the article saw them.
  They are trusted for deciding that an article needs no encoding only while ``FRESH_S`` young (the
  question's own IR answer); the kNN search checks the generations it filtered on itself, by counting
  their contexts in the same request (``knn_counts``).
- the sentences of an article's generation, read once and kept (bounded by characters): a new generation
  is another key, so a replaced article is never answered with its old sentences.
"""

from __future__ import annotations

import base64
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertknn_search.records import Coverage

# The fields of an article doc a question reads: asked of every IR and title search.
STATE_FIELDS = ["title", "fingerprint", "popularity", "encoded", "n_contexts", "partial", "n_rows", "n_done"]
# An article's sentences as stored: the text and the sentences' offsets into it (new indices), or the
# sentence list itself (older ones, and a text whose sentences are not found in it in order).
SENTENCE_FIELDS = ["fingerprint", "text", "spans", "sentences"]
FRESH_S = 10.0  # an IR answer this young says for sure that an article needs no encoding
STATES_MAX = 100_000  # article states kept (a few hundred bytes each)
SENTENCE_CHARS_MAX = 50_000_000  # characters of sentences kept (about 100 MB of str)
SPAN_DTYPE = np.dtype("<u4")  # (start, end) character offsets, little-endian on every machine


def generation(article_id: str, fingerprint: str) -> str:
    """The generation tag of an article's contexts: readers only see the one its article doc names."""
    return f"{article_id}:{fingerprint}"


@dataclass(frozen=True)
class ArticleState:
    """An article doc's small fields as a search answered them, and when (``time.monotonic``)."""

    id: str
    source: Mapping[str, Any]
    at: float

    @property
    def generation(self) -> str:
        return generation(self.id, str(self.source.get("fingerprint")))

    @property
    def title(self) -> str:
        return str(self.source.get("title", ""))

    @property
    def whole(self) -> bool:
        """Every context of its current text is stored."""
        return self.source.get("encoded") == self.generation

    def coverage(self) -> Coverage | None:
        """As ``Backend.coverage`` says it: None for an article with no context stored."""
        if self.whole:
            n = int(self.source.get("n_contexts") or 0)
            return Coverage(n, n)
        if self.source.get("partial") == self.generation:
            return Coverage(int(self.source.get("n_done") or 0), int(self.source.get("n_rows") or 0))
        return None

    def contexts(self) -> int | None:
        """How many contexts of its generation the doc says are stored (0: none); None where it does not
        say how many (a doc edited by hand)."""
        if self.whole:
            n = self.source.get("n_contexts")
        elif self.source.get("partial") == self.generation:
            n = self.source.get("n_done")
        else:
            return 0
        return None if n is None else int(n)


class ArticleCache:
    """Article states by id and sentence lists by (id, generation), each bounded, oldest out first.

    A server answers questions on several threads over one backend: every method holds the lock.
    """

    def __init__(self, states_max: int = STATES_MAX, chars_max: int = SENTENCE_CHARS_MAX) -> None:
        self._lock = threading.Lock()
        self._states: OrderedDict[str, ArticleState] = OrderedDict()
        self._sentences: OrderedDict[tuple[str, str], list[str]] = OrderedDict()
        self._chars = 0
        self.states_max, self.chars_max = states_max, chars_max

    # -- states -------------------------------------------------------------------------------------
    def record(self, docs: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
        """Keep the state of each (id, _source) a search or read answered (those with a fingerprint)."""
        now = time.monotonic()
        with self._lock:
            self._record(docs, now)

    def _record(self, docs: Iterable[tuple[str, Mapping[str, Any]]], now: float) -> None:
        for aid, source in docs:
            if source.get("fingerprint") is None:
                continue
            self._states[aid] = ArticleState(aid, dict(source), now)
            self._states.move_to_end(aid)
        while len(self._states) > self.states_max:
            self._states.popitem(last=False)

    def state(self, article_id: str) -> ArticleState | None:
        with self._lock:
            return self._states.get(article_id)

    def fresh(self, article_id: str) -> ArticleState | None:
        """The state if a search answered it less than ``FRESH_S`` ago."""
        state = self.state(article_id)
        return state if state is not None and time.monotonic() - state.at < FRESH_S else None

    def forget(self, article_ids: Iterable[str]) -> None:
        """Drop the states of articles this process just wrote: the next read asks the engine."""
        with self._lock:
            for aid in article_ids:
                self._states.pop(aid, None)

    # -- sentences ----------------------------------------------------------------------------------
    def sentences(self, article_id: str, gen: str) -> list[str] | None:
        with self._lock:
            found = self._sentences.get((article_id, gen))
            if found is not None:
                self._sentences.move_to_end((article_id, gen))
            return found

    def keep_sentences(self, article_id: str, gen: str, sentences: list[str]) -> None:
        key = (article_id, gen)
        with self._lock:
            old = self._sentences.pop(key, None)
            if old is not None:
                self._chars -= _chars(old)
            self._sentences[key] = sentences
            self._chars += _chars(sentences)
            while self._chars > self.chars_max and len(self._sentences) > 1:
                _, dropped = self._sentences.popitem(last=False)
                self._chars -= _chars(dropped)


def _chars(sentences: Sequence[str]) -> int:
    return sum(len(s) for s in sentences) + len(sentences)


def sentence_spans(text: str, sentences: Sequence[str]) -> str | None:
    """The sentences' (start, end) offsets in ``text``, packed (base64 of uint32 pairs); None where a
    sentence is not found in it after the one before (then the list itself is stored)."""
    spans = np.zeros((len(sentences), 2), dtype=SPAN_DTYPE)
    at = 0
    for i, sentence in enumerate(sentences):
        start = text.find(sentence, at)
        if start < 0:
            return None
        at = start + len(sentence)
        spans[i] = (start, at)
    return base64.b64encode(spans.tobytes()).decode("ascii")


def stored_sentences(source: Mapping[str, Any]) -> list[str]:
    """An article doc's sentences: cut from its text by its spans, else its sentence list ([] if none)."""
    text, spans = source.get("text"), source.get("spans")
    if isinstance(text, str) and isinstance(spans, str):
        pairs = np.frombuffer(base64.b64decode(spans), dtype=SPAN_DTYPE).reshape(-1, 2).tolist()
        return [text[a:b] for a, b in pairs]
    listed = source.get("sentences")
    return list(listed) if isinstance(listed, list) else []


def unpadded_b64(value: str) -> bytes:
    """Base64 as either engine returns a binary doc value (OpenSearch leaves the padding out)."""
    return base64.b64decode(value + "=" * (-len(value) % 4))
