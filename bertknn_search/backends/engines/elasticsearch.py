"""Elasticsearch 8: its client, dense_vector mapping and kNN bodies."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from bertknn_search.backends.engines.bodies import TIE_ORDER, context_fetch, floats
from bertknn_search.backends.engines.dialect import (
    KNN_SPARE,
    MAX_CANDIDATES,
    SCAN_PAGE,
    TIMEOUT_S,
    Connection,
    Dialect,
)
from bertknn_search.terms import BIGRAM_JOIN


class ElasticsearchDialect(Dialect):
    """Elasticsearch 8: ``dense_vector`` fields searched with the top-level ``knn``.

    The contexts' vectors are mapped ``flat`` (float32, brute force): a filtered ``knn`` over them
    scores every context of the top articles with the true l2 distance, so it is exact, and needs no
    script language (a node from Maven jars has no painless). The no-IR search over every context is
    then exact too, at brute-force cost. Bigrams are sent as their own field (no shingle filter needed).
    An index made for the no-IR search (``--no-ir-graph``) gets no graph here: an ``hnsw`` field would
    make the filtered IR-first search approximate too (another top 5 in 6 of 30 checks), and a second,
    graph-only copy of every vector would double their bytes.
    """

    name = "elasticsearch"
    title = "Elasticsearch"
    env = "ELASTICSEARCH"
    bigram_field = "bigrams"
    default_port = 9201  # beside OpenSearch's 9200, as the README and docker-compose.yml set them up

    def __init__(self) -> None:
        from elastic_transport import ConnectionError as ESConnectionError
        from elastic_transport import TlsError, TransportError
        from elasticsearch import ApiError, NotFoundError
        from elasticsearch.helpers import ScanError

        self.errors = (ApiError, TransportError)
        self.not_found = (NotFoundError,)
        self.scan_errors = (ScanError,)
        self._api_error, self._connection_error, self._ssl_error = ApiError, ESConnectionError, TlsError

    def _make_client(self, conn: Connection, user: str | None, password: str) -> Any:
        from elasticsearch import Elasticsearch

        options: dict[str, Any] = {
            "hosts": conn.hosts,
            # A node that does not answer: the next one of the list, at once; statuses are retried
            # by ``client.call``, with backoff.
            "max_retries": len(conn.hosts) - 1,
            "retry_on_status": (),
            "retry_on_timeout": False,
            "request_timeout": TIMEOUT_S,
            "http_compress": conn.remote,
            "verify_certs": conn.verify,
        }
        if user:
            options["basic_auth"] = (user, password)
        if conn.ca is not None:
            options["ca_certs"] = str(conn.ca)
        if not conn.verify:
            options["ssl_show_warn"] = False
        return Elasticsearch(**options)

    def _set_dim(self, vector: dict[str, Any], dim: int) -> None:
        vector["dims"] = dim

    def article_fields(self, terms: list[str]) -> dict[str, Any]:
        return {"bigrams": " ".join(f"{a}{BIGRAM_JOIN}{b}" for a, b in itertools.pairwise(terms))}

    def knn_exact_body(self, vector: np.ndarray, k: int, generations: Sequence[str]) -> dict[str, Any]:
        return self._knn(vector, k, {"terms": {"generation": list(generations)}})

    def knn_approx_body(self, vector: np.ndarray, k: int, graph: bool = True) -> dict[str, Any]:
        return self._knn(vector, k, None)  # a flat field: brute force, exact, graph or not

    def _knn(self, vector: np.ndarray, k: int, where: dict[str, Any] | None) -> dict[str, Any]:
        wanted = min(k + KNN_SPARE, MAX_CANDIDATES)
        knn: dict[str, Any] = {
            "field": "vector",
            "query_vector": floats(vector),
            "k": wanted,
            "num_candidates": wanted,
        }
        if where is not None:
            knn["filter"] = where
        # The spare candidates are sorted with the others by TIE_ORDER here, so the first k hits are
        # those the embedded backend keeps: only they are sent (keys and all), as OpenSearch sends k.
        # Unfiltered (no IR), hits of a generation being replaced are dropped after the search, so the
        # spares come too, to fill their places.
        return {
            "size": k if where is not None else wanted,
            "track_total_hits": False,
            "knn": knn,
            "sort": TIE_ORDER,
            **context_fetch(),
        }

    def mget(self, client: Any, index: str, ids: list[str], source: list[str], realtime: bool) -> Any:
        return client.mget(index=index, ids=ids, source_includes=source, realtime=realtime)

    def streaming_bulk(self, client: Any, actions: Iterable[dict[str, Any]], **options: Any) -> Iterator[Any]:
        from elasticsearch.helpers import streaming_bulk

        return streaming_bulk(client, actions, **options)

    def _scan(self, client: Any, index: str, query: dict[str, Any]) -> Iterator[dict[str, Any]]:
        from elasticsearch.helpers import scan

        return scan(client, index=index, query=query, size=SCAN_PAGE)

    def status(self, exc: BaseException) -> int | None:
        if isinstance(exc, self._api_error):
            return int(exc.meta.status)
        return None

    def is_connection_error(self, exc: BaseException) -> bool:
        return isinstance(exc, self._connection_error) or (
            not isinstance(exc, self._api_error) and isinstance(exc, self.errors)
        )

    def is_ssl_error(self, exc: BaseException) -> bool:
        return isinstance(exc, self._ssl_error)

    def _body(self, exc: BaseException) -> object:
        return getattr(exc, "body", None)
