"""A question's subject: its own articles by title, else the BM25 top n, asked of an engine in one request.

The embedded index looks the title up and searches only where that misses: two local reads. On an
engine each would be a round trip, and a subject without an article of its title (most KB subjects of a
small index) made a warm question three requests. One ``_msearch`` carries both searches (the title
lookup and the BM25 search, each with its own ``search_type``), and the title's hits win where there are
any: the same articles, in the same order, as ``find_titles`` then ``search_articles`` (both tested
against the embedded index). The engine runs the BM25 search for nothing when the title matches; that
costs it far less than a round trip costs the question.

A subject that is no title also names the titles closest to it (``Backend.closest_titles``): the titles
holding the subject, else its longest word, and so on, in one search (``bodies.closest_body``). Only a title
miss needs them, and only the IR answer tells a miss, so they are not in the IR request (a title subject
paid 1.7-1.8x for them there: docs/engines.md). A miss leaves them ``Waiting``, and the question's next
request, its kNN search, becomes an ``_msearch`` that carries them (``closest_lines`` after the kNN
search); ``SubjectArticles.closest`` reads its answer. Read before any kNN search took them (BM25
found no article, so no kNN search follows), they are asked alone then: still the question's second
request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bertknn_search.backends.base import title_patterns
from bertknn_search.backends.engines import bodies
from bertknn_search.backends.engines.dialect import whole_answer
from bertknn_search.records import ArticleHit


def title_hits(response: dict[str, Any]) -> list[ArticleHit]:
    """The articles of a title lookup (``bodies.title_body``): an own article scores infinity."""
    return [
        ArticleHit(h["_id"], h["_source"]["title"], float("inf"), h["_source"].get("popularity"))
        for h in response["hits"]["hits"]
    ]


def lines(subject: str, query: str, n: int, bigram_field: str) -> list[dict[str, Any]]:
    """The ``_msearch`` body: the title lookup, then the BM25 search where ``query`` has terms."""
    # Every shard or none, as ``EngineBackend._search`` asks of a single search.
    whole = {"allow_partial_search_results": False}
    search = bodies.search_body(query, n, bigram_field) if query else None
    if search is None:
        return [whole, bodies.title_body(subject, n)]
    return [whole, bodies.title_body(subject, n), {**whole, "search_type": "dfs_query_then_fetch"}, search]


def closest_lines(subject: str, n: int, index: str) -> list[dict[str, Any]]:
    """The ``_msearch`` lines of ``closest_titles``' search, of the articles ``index``."""
    return [{"allow_partial_search_results": False, "index": index}, closest_body(subject, n)]


def closest_body(subject: str, n: int) -> dict[str, Any]:
    """``closest_titles``' search: the titles holding the first of the subject's patterns any title holds."""
    return bodies.closest_body(title_patterns(subject), n)


def closest_hits(response: dict[str, Any]) -> list[ArticleHit]:
    """The titles of ``closest_body``'s top score: those holding the first pattern any title holds."""
    hits = response["hits"]["hits"]
    best = hits[0]["sort"][0] if hits else None
    return bodies.parse_titles([h for h in hits if h["sort"][0] == best])


@dataclass(eq=False)
class Ask:
    """One subject's closest-title search, and its answer once a request carried it."""

    subject: str
    n: int
    answer: dict[str, Any] | None = None


class Waiting:
    """The closest-title searches of subjects that missed, until a kNN request carries them.

    Threads share it (the IR of a batch runs beside the encoder; the server's tasks take turns), hence
    the lock. An ask nobody reads rides the next kNN request once; only the newest ``LIMIT`` wait.
    """

    LIMIT = 64

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asks: list[Ask] = []

    def add(self, ask: Ask) -> None:
        with self._lock:
            self._asks = [*self._asks[-(self.LIMIT - 1) :], ask]

    def take(self) -> list[Ask]:
        """Every waiting ask, for the request about to be sent."""
        with self._lock:
            asks, self._asks = self._asks, []
        return asks

    def withdraw(self, ask: Ask) -> None:
        """``ask`` no longer waits (it is read now: asked alone where no request carried it)."""
        with self._lock:
            self._asks = [a for a in self._asks if a is not ask]


def carried(asks: list[Ask], index: str) -> list[dict[str, Any]]:
    """The ``_msearch`` lines of ``asks``, of the articles ``index``, to follow another request's."""
    return [line for ask in asks for line in closest_lines(ask.subject, ask.n, index)]


def share(asks: list[Ask], answers: list[dict[str, Any]]) -> None:
    """Give each ask its answer, from the responses to ``carried(asks, ...)``'s lines, in order."""
    for ask, answer in zip(asks, answers, strict=True):
        ask.answer = answer


def msearch(client: Any, index: str, body: list[dict[str, Any]]) -> Callable[[], list[dict[str, Any]]]:
    """The request, for ``EngineBackend._call``: each search's response, or its ``error``.

    A search that answered from part of the shards raises ``PartialAnswer`` (retried, like a single
    search's); one the engine refused comes back as its error, and the caller asks that search alone,
    through the retries and one-line errors a single search has.
    """

    def send() -> list[dict[str, Any]]:
        response = client.msearch(index=index, body=body)
        answers: list[dict[str, Any]] = list(getattr(response, "body", response)["responses"])
        for answer in answers:
            if "error" not in answer:
                whole_answer(answer, index)
        return answers

    return send
