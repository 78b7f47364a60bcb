"""OpenSearch with the k-NN plugin: its client, vector mapping and kNN bodies."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from bertknn_search.backends.engines.bodies import TIE_ORDER, context_fetch, floats
from bertknn_search.backends.engines.dialect import (
    SCAN_PAGE,
    TIMEOUT_S,
    Connection,
    Dialect,
)

# The no-IR graph: HNSW with Lucene's m (16) and a wider beam at build than its 100; and at search.
EF_SEARCH = 256
GRAPH_METHOD: dict[str, Any] = {
    "name": "hnsw",
    "space_type": "l2",
    "engine": "lucene",
    "parameters": {"m": 16, "ef_construction": 128},
}


class OpenSearchDialect(Dialect):
    """OpenSearch with the k-NN plugin: ``knn_vector`` fields, the ``knn_score`` script, the ``knn`` query."""

    name = "opensearch"
    title = "OpenSearch"
    env = "OPENSEARCH"
    bigram_field = "terms.bigrams"  # a shingle sub-field: the cluster makes the bigrams itself

    def __init__(self) -> None:
        from opensearchpy.exceptions import ConnectionError as OSConnectionError
        from opensearchpy.exceptions import NotFoundError, OpenSearchException, SSLError
        from opensearchpy.helpers import ScanError

        self.errors = (OpenSearchException,)
        self.not_found = (NotFoundError,)
        self.scan_errors = (ScanError,)
        self._connection_error, self._ssl_error = OSConnectionError, SSLError

    def _make_client(self, conn: Connection, user: str | None, password: str) -> Any:
        from opensearchpy import OpenSearch

        options: dict[str, Any] = {
            "hosts": conn.hosts,
            # A node that does not answer: the next one of the list, at once; statuses are retried
            # by ``client.call``, with backoff.
            "max_retries": len(conn.hosts) - 1,
            "retry_on_status": (),
            "timeout": TIMEOUT_S,
            # Connections kept per node (urllib3's pool, 1 by default): parallel bulk requests and a
            # server's threads each hold one; beyond the pool each request would open its own.
            "maxsize": 8,
            "http_compress": conn.remote,  # JSON vectors compress about 3x: worth it off this machine
            "verify_certs": conn.verify,
        }
        if user:
            options["http_auth"] = (user, password)
        if conn.ca is not None:
            options["ca_certs"] = str(conn.ca)
        if not conn.verify:
            # The user chose not to verify (--insecure): one warning per request would bury the output.
            options.update(ssl_show_warn=False, ssl_assert_hostname=False)
        return OpenSearch(**options)

    def _set_dim(self, vector: dict[str, Any], dim: int) -> None:
        vector["dimension"] = dim

    def _add_graph(self, contexts: dict[str, Any]) -> None:
        """The lucene engine's HNSW graph (pure Java: the k-NN plugin's native faiss library is not in
        its Maven jars) over every context, for the no-IR search; the score script never reads it.

        Without it (the shipped mapping) the field has no ``method``: the default engine with
        ``approximate_threshold -1``, which stores the float32 vectors and never builds a graph. Not
        ``index.knn: false``: k-NN 2.19.1 fails such an index's shards on any later mapping update.
        """
        contexts["settings"]["index"] = {"knn": True}
        vector = contexts["mappings"]["properties"]["vector"]
        vector.pop("space_type", None)  # the method names it
        vector["method"] = dict(GRAPH_METHOD, parameters=dict(GRAPH_METHOD["parameters"]))

    def knn_exact_body(self, vector: np.ndarray, k: int, generations: Sequence[str]) -> dict[str, Any]:
        """The k-NN plugin's score script (brute force, l2) over the contexts of ``generations``.

        It reads each candidate's float32 vector and never the graph, so it is exact whatever the graph
        holds, and costs as much as the few hundred contexts of the top articles.
        """
        return {
            "size": k,
            "track_total_hits": False,
            "query": {
                "script_score": {
                    "query": {"bool": {"filter": [{"terms": {"generation": list(generations)}}]}},
                    "script": {
                        "source": "knn_score",
                        "lang": "knn",
                        "params": {"field": "vector", "query_value": floats(vector), "space_type": "l2"},
                    },
                }
            },
            "sort": TIE_ORDER,
            **context_fetch(),
        }

    def knn_approx_body(self, vector: np.ndarray, k: int, graph: bool = True) -> dict[str, Any]:
        """The HNSW graph (lucene engine) over every context, in an index made with ``--no-ir-graph``;
        without one (the default), the score script over every context: exact, at brute-force cost."""
        if not graph:
            body = self.knn_exact_body(vector, k, [])
            body["query"]["script_score"]["query"] = {"match_all": {}}
            return body
        # The lucene engine explores k candidates unless told more (it ignores the index's
        # knn.algo_param.ef_search): with ef 1 a 5-context graph gave a wrong nearest neighbour.
        search = {"vector": floats(vector), "k": k, "method_parameters": {"ef_search": max(k, EF_SEARCH)}}
        return {
            "size": k,
            "track_total_hits": False,
            "query": {"knn": {"vector": search}},
            "sort": TIE_ORDER,
            **context_fetch(),
        }

    def mget(self, client: Any, index: str, ids: list[str], source: list[str], realtime: bool) -> Any:
        return client.mget(index=index, body={"ids": ids}, _source_includes=source, realtime=realtime)

    def streaming_bulk(self, client: Any, actions: Iterable[dict[str, Any]], **options: Any) -> Iterator[Any]:
        from opensearchpy.helpers import streaming_bulk

        return streaming_bulk(client, actions, **options)

    def _scan(self, client: Any, index: str, query: dict[str, Any]) -> Iterator[dict[str, Any]]:
        from opensearchpy.helpers import scan

        return scan(client, index=index, query=query, size=SCAN_PAGE)

    def status(self, exc: BaseException) -> int | None:
        status = getattr(exc, "status_code", None)
        return status if isinstance(status, int) else None

    def is_connection_error(self, exc: BaseException) -> bool:
        return isinstance(exc, self._connection_error)

    def is_ssl_error(self, exc: BaseException) -> bool:
        return isinstance(exc, self._ssl_error)

    def _body(self, exc: BaseException) -> object:
        return getattr(exc, "info", None)

    def reason(self, exc: BaseException) -> str:
        if self.is_connection_error(exc):
            return str(getattr(exc, "info", None) or getattr(exc, "error", exc))
        found = super().reason(exc)
        if self.status(exc) is not None and not isinstance(self._body(exc), dict):
            return str(getattr(exc, "error", found))
        return found
