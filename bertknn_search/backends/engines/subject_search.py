"""A question's subject: its own articles by title, else the BM25 top n, asked of an engine in one request.

The embedded index looks the title up and searches only where that misses: two local reads. On an
engine each would be a round trip, and a subject without an article of its title (most KB subjects of a
small index) made a warm question three requests. One ``_msearch`` carries both searches (the title
lookup and the BM25 search, each with its own ``search_type``), and the title's hits win where there are
any: the same articles, in the same order, as ``find_titles`` then ``search_articles`` (both tested
against the embedded index). The engine runs the BM25 search for nothing when the title matches; that
costs it far less than a round trip costs the question.

A subject that is no title also names the titles closest to it (``Backend.closest_titles``): the titles
holding the subject, else its longest word, and so on; each pattern is a search of its own, all of them
in one ``_msearch`` too.
"""

from __future__ import annotations

from collections.abc import Callable
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


def lines(subject: str, query: str, n: int, bigram_field: str) -> list[dict[str, Any]] | None:
    """The ``_msearch`` body: the title lookup, then the BM25 search; None where ``query`` has no terms."""
    search = bodies.search_body(query, n, bigram_field) if query else None
    if search is None:
        return None
    # Every shard or none, as ``EngineBackend._search`` asks of a single search.
    whole = {"allow_partial_search_results": False}
    return [whole, bodies.title_body(subject, n), {**whole, "search_type": "dfs_query_then_fetch"}, search]


def closest_lines(subject: str, n: int) -> list[dict[str, Any]]:
    """The ``_msearch`` body of ``closest_titles``: one titles search per pattern, in turn."""
    whole = {"allow_partial_search_results": False}
    return [line for p in title_patterns(subject) for line in (whole, bodies.titles_body(p, n))]


def first_titles(answers: list[dict[str, Any]]) -> list[ArticleHit] | None:
    """The titles of the first pattern any title holds ([] for none); None where a search was refused
    before that one answered (the caller asks the patterns one by one)."""
    for answer in answers:
        if "error" in answer:
            return None
        if hits := answer["hits"]["hits"]:
            return [ArticleHit(h["_id"], h["_source"]["title"], 0.0) for h in hits]
    return []


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
