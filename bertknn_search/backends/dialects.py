"""What OpenSearch and Elasticsearch do differently, for the one engine layer in ``engine.py``.

A dialect names the engine, connects its own Python client, ships its mappings (``mappings/<engine>-*.json``)
and writes the two request bodies that have no common form: exact kNN over a few articles' contexts, and
the approximate kNN over all of them (the no-IR mode). It also reads its client's exceptions. Everything
else (bulk writes, generations, settle and resume, metadata, article queries, retries) is shared.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import numpy as np

from bertknn_search.backends import engine_bodies
from bertknn_search.backends.engine_bodies import CONTEXT_SOURCE, TIE_ORDER, floats
from bertknn_search.backends.engine_client import PartialAnswer, public_url, whole_answer
from bertknn_search.config import Config
from bertknn_search.errors import ConfigError
from bertknn_search.terms import BIGRAM_JOIN

TIMEOUT_S = 120  # a bulk chunk of 768-d vectors can take a while on a busy node
# Elasticsearch's knn returns exactly k per shard; asking for more than k lets contexts that tie at the
# k-th distance be cut by (article, sentence, start) here, as the other backends cut them.
KNN_SPARE = 32
MAX_CANDIDATES = 10_000  # Elasticsearch's limit on num_candidates
SCAN_PAGE = 1000  # ids read per request when deleting by query


@dataclass(frozen=True)
class Connection:
    """Where a cluster is and how to log in (from the engine's own settings)."""

    url: str | None
    user: str | None
    password: str | None
    ca: Any
    verify: bool

    @property
    def remote(self) -> bool:
        """Not this machine: there gzip saves network time; on loopback it only costs CPU."""
        host = urlsplit(self.url or "").hostname or ""
        return host not in ("localhost", "127.0.0.1", "::1") and not host.startswith("127.")


class Dialect:
    """The engine-specific side of the engine layer. Subclasses fill in the class attributes."""

    name = ""  # the --backend word
    title = ""  # for messages
    env = ""  # the prefix of its environment variables (OPENSEARCH_URL, ...)
    bigram_field = ""  # the field that holds an article's word bigrams

    # -- connecting -------------------------------------------------------------------------------
    def connection(self, config: Config) -> Connection:
        """The engine's own settings of ``config`` (``<name>_url`` ...); verifying TLS is one setting."""
        url, user, password, ca = (
            getattr(config, f"{self.name}_{part}") for part in ("url", "user", "password", "ca")
        )
        return Connection(url, user, password, ca, config.opensearch_verify)

    def client(self, config: Config) -> Any:
        """The engine's client for ``config``; its own retries off (``engine_client.call`` retries).

        Raises:
            ConfigError: no URL, a URL that is not http(s), or a CA file that does not exist.
        """
        conn = self.connection(config)
        flag = f"--{self.name}-url"
        if not conn.url:
            raise ConfigError(
                f"the {self.name} backend needs a URL: set {self.env}_URL or {flag} (e.g. http://localhost:9200;"
                f" 'bertknn-search engine start {self.name}' starts a local node)"
            )
        parts = urlsplit(conn.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{self.title} URL {public_url(conn.url)!r} must look like http(s)://host:port")
        if conn.ca is not None and not conn.ca.is_file():
            raise ConfigError(f"CA file {conn.ca} not found; check --{self.name}-ca / {self.env}_CA")
        user = conn.user or (unquote(parts.username) if parts.username else None)
        password = conn.password or (unquote(parts.password) if parts.password else "")
        return self._make_client(conn, user, password)

    def _make_client(self, conn: Connection, user: str | None, password: str) -> Any:
        raise NotImplementedError

    # -- bodies -----------------------------------------------------------------------------------
    def create_bodies(self, meta_doc: dict[str, Any], dim: int) -> dict[str, dict[str, Any]]:
        """Create-index bodies of both indices, with ``_meta`` and the vector dimension filled in."""
        out = {kind: engine_bodies.load_mapping(f"{self.name}-{kind}") for kind in ("articles", "contexts")}
        for body in out.values():
            body["mappings"]["_meta"] = meta_doc
        self._set_dim(out["contexts"]["mappings"]["properties"]["vector"], dim)
        return out

    def _set_dim(self, vector: dict[str, Any], dim: int) -> None:
        raise NotImplementedError

    def article_fields(self, terms: list[str]) -> dict[str, Any]:
        """Fields an article doc needs besides the shared ones (from its IR terms)."""
        return {}

    def knn_exact_body(self, vector: np.ndarray, k: int, generations: Sequence[str]) -> dict[str, Any]:
        """Exact k nearest contexts (l2) among the contexts of ``generations``."""
        raise NotImplementedError

    def knn_approx_body(self, vector: np.ndarray, k: int) -> dict[str, Any]:
        """k nearest contexts over every context (the no-IR mode)."""
        raise NotImplementedError

    # -- the client's calls that differ -----------------------------------------------------------
    def mget(self, client: Any, index: str, ids: list[str], source: list[str], realtime: bool) -> Any:
        raise NotImplementedError

    def streaming_bulk(self, client: Any, actions: Iterable[dict[str, Any]], **options: Any) -> Iterator[Any]:
        raise NotImplementedError

    def scan_ids(self, client: Any, index: str, query: dict[str, Any]) -> list[str]:
        """The ids of every doc of ``index`` that ``query`` matches: one search where they fit a page
        (most deletes: an article's old contexts, or none on a new index), else a scroll."""
        body = {**query, "size": SCAN_PAGE, "_source": False, "track_total_hits": False}
        response = client.search(index=index, body=body, allow_partial_search_results=False)
        whole_answer(getattr(response, "body", response), index)  # a delete must see every shard
        hits = response["hits"]["hits"]
        if len(hits) < SCAN_PAGE:
            return [hit["_id"] for hit in hits]
        try:
            return [hit["_id"] for hit in self._scan(client, index, {**query, "_source": False})]
        except self.scan_errors as exc:  # the scroll lost a shard on the way
            raise PartialAnswer(f"a scroll of {index} failed: {exc}") from exc

    def _scan(self, client: Any, index: str, query: dict[str, Any]) -> Iterator[dict[str, Any]]:
        raise NotImplementedError

    # -- reading the client's exceptions ----------------------------------------------------------
    errors: tuple[type[BaseException], ...] = ()  # every exception the client raises for a request
    scan_errors: tuple[type[BaseException], ...] = ()  # its scroll helper's, for shards that failed
    not_found: tuple[type[BaseException], ...] = ()

    def status(self, exc: BaseException) -> int | None:
        """The HTTP status of a failed request, or None (no answer)."""
        raise NotImplementedError

    def is_connection_error(self, exc: BaseException) -> bool:
        raise NotImplementedError

    def is_ssl_error(self, exc: BaseException) -> bool:
        raise NotImplementedError

    def error_type(self, exc: BaseException) -> str | None:
        """The engine's error type (``resource_already_exists_exception``), where it said one."""
        info = self._body(exc)
        if isinstance(info, dict) and isinstance(info.get("error"), dict):
            return info["error"].get("type")
        return None

    def reason(self, exc: BaseException) -> str:
        """``type: reason`` of a failed request, as the engine said it."""
        info = self._body(exc)
        if isinstance(info, dict) and isinstance(info.get("error"), dict):
            err = info["error"]
            return f"{err.get('type')}: {err.get('reason')}"
        return f"{type(exc).__name__}: {exc}"

    def _body(self, exc: BaseException) -> object:
        raise NotImplementedError


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
            "hosts": [public_url(conn.url or "")],
            "max_retries": 0,
            "timeout": TIMEOUT_S,
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
            "_source": CONTEXT_SOURCE,
        }

    def knn_approx_body(self, vector: np.ndarray, k: int) -> dict[str, Any]:
        """The HNSW graph (lucene engine by default) over every context."""
        return {
            "size": k,
            "track_total_hits": False,
            "query": {"knn": {"vector": {"vector": floats(vector), "k": k}}},
            "sort": TIE_ORDER,
            "_source": CONTEXT_SOURCE,
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


class ElasticsearchDialect(Dialect):
    """Elasticsearch 8: ``dense_vector`` fields searched with the top-level ``knn``.

    The contexts' vectors are mapped ``flat`` (float32, brute force): a filtered ``knn`` over them
    scores every context of the top articles with the true l2 distance, so it is exact, and needs no
    script language (a node from Maven jars has no painless). The no-IR search over every context is
    then exact too, at brute-force cost. Bigrams are sent as their own field (no shingle filter needed).
    """

    name = "elasticsearch"
    title = "Elasticsearch"
    env = "ELASTICSEARCH"
    bigram_field = "bigrams"

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
            "hosts": [public_url(conn.url or "")],
            "max_retries": 0,
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

    def knn_approx_body(self, vector: np.ndarray, k: int) -> dict[str, Any]:
        return self._knn(vector, k, None)

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
        return {
            "size": wanted,
            "track_total_hits": False,
            "knn": knn,
            "sort": TIE_ORDER,
            "_source": CONTEXT_SOURCE,
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


DIALECTS: dict[str, Callable[[], Dialect]] = {
    "opensearch": OpenSearchDialect,
    "elasticsearch": ElasticsearchDialect,
}


def dialect(name: str) -> Dialect:
    """The dialect of backend ``name`` ("opensearch" or "elasticsearch")."""
    return DIALECTS[name]()
