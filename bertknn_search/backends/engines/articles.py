"""The IR side of the engine layer: a subject's own articles by title, the BM25 top n, and the titles
closest to a subject that is no title, over the articles index (those asked with the kNN search:
``subject_search``)."""

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
    _waiting: subject_search.Waiting
    _search: Callable[..., dict[str, Any]]
    _call: Callable[..., Any]

    def find_titles(self, title: str, n: int) -> list[ArticleHit]:
        response = self._search("look up a title", "articles", bodies.title_body(title, n))
        self._remember(response)
        return subject_search.title_hits(response)

    def subject_articles(self, subject: str, query: str, n: int, closest: int = 0) -> SubjectArticles:
        """The title lookup and BM25 search in one ``_msearch``; a miss's closest titles are asked with
        the next kNN search (``subject_search``)."""
        body = subject_search.lines(subject, query, n, self.dialect.bigram_field)
        send = subject_search.msearch(self.client, self.names["articles"], body)
        titled, *rest = self._call("look up a title and search articles", send)
        searched = rest[0] if rest else None  # BM25: the query has terms
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
        return SubjectArticles(found, self._closest_later(subject, closest) if closest > 0 else None)

    def _closest_later(self, subject: str, n: int) -> Callable[[], list[ArticleHit]]:
        """``closest_titles(subject, n)`` when read: from the answers of the kNN request that carried
        its searches, else asked then."""
        ask = subject_search.Ask(subject, n)
        self._waiting.add(ask)

        def read() -> list[ArticleHit]:
            self._waiting.withdraw(ask)
            if ask.answer is None or "error" in ask.answer:  # not carried (or refused): asked alone
                return self.closest_titles(subject, n)
            return subject_search.closest_hits(ask.answer)

        return read

    def _search_contexts(self, body: dict[str, Any]) -> dict[str, Any]:
        """A kNN search, in one ``_msearch`` with the closest-title searches waiting where there are any."""
        asks = self._waiting.take()
        if not asks:
            return self._search("search contexts", "contexts", body)
        whole = {"allow_partial_search_results": False}
        lines = [whole, body, *subject_search.carried(asks, self.names["articles"])]
        send = subject_search.msearch(self.client, self.names["contexts"], lines)
        answer, *rest = self._call("search contexts and list titles", send)
        subject_search.share(asks, rest)
        if "error" in answer:  # asked alone: its retries, or its one-line error
            return self._search("search contexts", "contexts", body)
        return answer

    def closest_titles(self, subject: str, n: int) -> list[ArticleHit]:
        response = self._search("list titles", "articles", subject_search.closest_body(subject, n))
        return subject_search.closest_hits(response)

    def list_titles(self, pattern: str, n: int) -> list[ArticleHit]:
        body = bodies.titles_body(pattern, n)
        response = self._search("list titles", "articles", body)
        return bodies.parse_titles(response["hits"]["hits"])

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
