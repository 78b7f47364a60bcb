"""The IR side of the engine layer: a subject's own articles by title, the BM25 top n, and the titles
closest to a subject that is no title, over the articles index."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bertknn_search.backends.engines import bodies, subject_search
from bertknn_search.backends.engines.dialect import Dialect
from bertknn_search.backends.engines.reads import ArticleCache
from bertknn_search.records import ArticleHit, SubjectArticles


class EngineArticleSide:
    """The article-search methods of ``EngineBackend``, over the client and helpers it provides."""

    # Provided by EngineBackend.
    client: Any
    dialect: Dialect
    names: dict[str, str]
    _cache: ArticleCache
    _search: Callable[..., dict[str, Any]]
    _call: Callable[..., Any]

    def find_titles(self, title: str, n: int) -> list[ArticleHit]:
        response = self._search("look up a title", "articles", bodies.title_body(title, n))
        self._remember(response)
        return subject_search.title_hits(response)

    def subject_articles(self, subject: str, query: str, n: int, closest: int = 0) -> SubjectArticles:
        """The title lookup, BM25 search and closest titles' searches in one ``_msearch`` (subject_search)."""
        body = subject_search.lines(subject, query, n, self.dialect.bigram_field)
        near_lines = subject_search.closest_lines(subject, closest) if closest > 0 else []
        send = subject_search.msearch(self.client, self.names["articles"], body + near_lines)
        titled, *rest = self._call("look up a title and search articles", send)
        searched, near = (rest[0], rest[1:]) if len(body) > 2 else (None, rest)  # BM25: the query has terms
        if "error" in titled:  # asked alone: its retries, or its one-line error
            if own := self.find_titles(subject, n):
                return SubjectArticles(own)
            found = self.search_articles(query, n)
        elif titled["hits"]["hits"]:
            self._remember(titled)
            return SubjectArticles(subject_search.title_hits(titled))
        elif searched is None or "error" in searched:  # no terms ([], no request), or asked alone
            found = self.search_articles(query, n)
        else:
            self._remember(searched)
            found = bodies.parse_articles(searched)
        if closest <= 0:
            return SubjectArticles(found)
        return SubjectArticles(found, subject_search.closest(near, subject, closest, self.list_titles))

    def closest_titles(self, subject: str, n: int) -> list[ArticleHit]:
        body = subject_search.closest_lines(subject, n)
        answers = self._call("list titles", subject_search.msearch(self.client, self.names["articles"], body))
        return subject_search.closest(answers, subject, n, self.list_titles)

    def list_titles(self, pattern: str, n: int) -> list[ArticleHit]:
        body = bodies.titles_body(pattern, n)
        response = self._search("list titles", "articles", body)
        return [ArticleHit(h["_id"], h["_source"]["title"], 0.0) for h in response["hits"]["hits"]]

    def search_articles(self, query: str, n: int) -> list[ArticleHit]:
        """Top ``n`` articles by BM25 over unigrams + bigrams; ties by id."""
        body = bodies.search_body(query, n, self.dialect.bigram_field)
        if body is None:
            return []
        response = self._search("search articles", "articles", body, search_type="dfs_query_then_fetch")
        self._remember(response)
        return bodies.parse_articles(response)

    def _remember(self, response: dict[str, Any]) -> None:
        self._cache.record((hit["_id"], hit["_source"]) for hit in response["hits"]["hits"])
