"""The dialect: what OpenSearch and Elasticsearch do differently, for the one engine layer (``backend.py``).

A dialect names the engine, connects its own Python client, ships its mappings (``mappings/<engine>-*.json``)
and writes the two request bodies that have no common form: exact kNN over a few articles' contexts, and
the approximate kNN over all of them (the no-IR mode). It also reads its client's exceptions. Everything
else (bulk writes, generations, settle and resume, metadata, article queries, retries) is shared.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bertknn_search.backends.engines import bodies as engine_bodies
from bertknn_search.backends.engines.urls import NodeURL, node_urls, public_urls
from bertknn_search.config import Config
from bertknn_search.errors import ConfigError

TIMEOUT_S = 120  # a bulk chunk of 768-d vectors can take a while on a busy node
# Elasticsearch's knn returns exactly k per shard; asking for more than k lets contexts that tie at the
# k-th distance be cut by the request's sort (score, article, sentence, start), as the other backends
# cut them.
KNN_SPARE = 32
MAX_CANDIDATES = 10_000  # Elasticsearch's limit on num_candidates
SCAN_PAGE = 1000  # ids read per request when deleting by query
# The most text one article may hold on an engine: its doc carries the text about four times (the text,
# its terms, its bigrams, its sentences) in one request, which a node takes up to its
# http.max_content_length (100 MB by default): a 60 MB article was refused with HTTP 413.
MAX_ARTICLE_BYTES = 16 * 1024 * 1024


def public_url(url: str) -> str:
    """``url`` (one node URL or a comma list) without any ``user:password@`` part: the only form that is
    ever shown or logged."""
    return public_urls(url)


class PartialAnswer(Exception):
    """An engine answered from some of its shards only (a node lost): worth another try."""


def whole_answer(response: dict[str, Any], index: str) -> None:
    """Raise ``PartialAnswer`` where a search left shards out or an mget could not read a document.

    ``allow_partial_search_results=false`` makes the engine refuse most of these itself; this also
    catches an engine that ignores it and the per-document errors an mget answers with 200.
    """
    shards = response.get("_shards") or {}
    if shards.get("failed"):
        reasons = shards.get("failures") or [{}]
        cause = (reasons[0].get("reason") or {}).get("type", "unknown")
        raise PartialAnswer(f"{shards['failed']} of {shards.get('total')} shards of {index} failed ({cause})")
    errors = [d for d in response.get("docs", ()) if d.get("error")]
    if errors:
        error = errors[0]["error"]
        cause = error.get("type", "unknown") if isinstance(error, dict) else str(error)
        raise PartialAnswer(f"{len(errors)} documents of {index} could not be read ({cause})")


@dataclass(frozen=True)
class Connection:
    """Where a cluster is and how to log in (from the engine's own settings)."""

    url: str | None
    user: str | None
    password: str | None
    ca: Any
    verify: bool

    nodes: tuple[NodeURL, ...] = ()  # the URL's nodes, checked (``Dialect.client`` fills them in)

    @property
    def hosts(self) -> list[str]:
        """The nodes' URLs for the client, without credentials: it spreads requests over them and
        moves on to the next when one does not answer."""
        return [node.shown for node in self._nodes()]

    def _nodes(self) -> tuple[NodeURL, ...]:
        return self.nodes or tuple(node_urls(self.url or "", "the engine URL"))

    @property
    def remote(self) -> bool:
        """Not this machine: there gzip saves network time; on loopback it only costs CPU."""
        return any(
            node.host not in ("localhost", "127.0.0.1", "::1") and not node.host.startswith("127.")
            for node in self._nodes()
        )


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

    default_port = 9200  # where 'engine start NAME' puts it in the project's own set-up

    def client(self, config: Config) -> Any:
        """The engine's client for ``config``: every node of its URL list as the client's hosts; its own
        retries only to move on to the next node (``client.call`` retries the rest).

        Raises:
            ConfigError: no URL, a URL that is not http(s) with a well-formed host and a numeric port,
                or a CA file that does not exist.
        """
        conn = self.connection(config)
        flag = f"--{self.name}-url"
        if not conn.url:
            port = f" --port {self.default_port}" if self.default_port != 9200 else ""
            raise ConfigError(
                f"the {self.name} backend needs a URL: set {self.env}_URL or {flag} (e.g."
                f" http://localhost:{self.default_port}; 'bertknn-search engine start {self.name}{port}'"
                " starts a local node there)"
            )
        nodes = node_urls(conn.url, f"{self.env}_URL / {flag}")
        if config.max_article_bytes > MAX_ARTICLE_BYTES:
            raise ConfigError(
                f"--max-article-bytes {config.max_article_bytes:,} is more than {self.title} can take of"
                f" one article: at most {MAX_ARTICLE_BYTES:,} bytes (its doc carries the text about four"
                " times in one request, and a node takes requests up to its http.max_content_length,"
                f" 100 MB by default); give --max-article-bytes {MAX_ARTICLE_BYTES} or less"
            )
        if conn.ca is not None and not conn.ca.is_file():
            raise ConfigError(f"CA file {conn.ca} not found; check --{self.name}-ca / {self.env}_CA")
        given = next((node for node in nodes if node.user), None)
        user = conn.user or (given.user if given else None)
        password = conn.password or (given.password if given and given.password else "")
        return self._make_client(replace(conn, nodes=tuple(nodes)), user, password)

    def _make_client(self, conn: Connection, user: str | None, password: str) -> Any:
        raise NotImplementedError

    # -- bodies -----------------------------------------------------------------------------------
    def create_bodies(self, meta_doc: dict[str, Any], dim: int) -> dict[str, dict[str, Any]]:
        """Create-index bodies of both indices, with ``_meta`` and the vector dimension filled in, and
        the no-IR graph where ``meta_doc`` asks for one (``no_ir_graph``) and the engine builds one."""
        out = {kind: engine_bodies.load_mapping(f"{self.name}-{kind}") for kind in ("articles", "contexts")}
        for body in out.values():
            body["mappings"]["_meta"] = meta_doc
        self._set_dim(out["contexts"]["mappings"]["properties"]["vector"], dim)
        if meta_doc.get("no_ir_graph"):
            self._add_graph(out["contexts"])
        return out

    def _set_dim(self, vector: dict[str, Any], dim: int) -> None:
        raise NotImplementedError

    def _add_graph(self, contexts: dict[str, Any]) -> None:
        """Make the contexts' create body build an approximate graph for the no-IR search; by default
        none (the engine's no-IR search then scans every context, exactly)."""

    def article_fields(self, terms: list[str]) -> dict[str, Any]:
        """Fields an article doc needs besides the shared ones (from its IR terms)."""
        return {}

    def knn_exact_body(self, vector: np.ndarray, k: int, generations: Sequence[str]) -> dict[str, Any]:
        """Exact k nearest contexts (l2) among the contexts of ``generations``."""
        raise NotImplementedError

    def knn_approx_body(self, vector: np.ndarray, k: int, graph: bool = True) -> dict[str, Any]:
        """k nearest contexts over every context (the no-IR mode).

        Args:
            graph: the vector field has an approximate graph to search (else: brute force, exact).
        """
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
            said = f"{err.get('type')}: {err.get('reason')}"
            # "all shards failed" and the like: the cause the engine found is what to read.
            roots = err.get("root_cause")
            cause = err.get("caused_by") or (roots[0] if isinstance(roots, list) and roots else None)
            if isinstance(cause, dict) and cause.get("reason") and cause.get("reason") != err.get("reason"):
                said += f" ({cause.get('type')}: {cause.get('reason')})"
            return said
        # elastic_transport's errors print as "Connection error"; their message names the cause.
        message = getattr(exc, "message", None)
        return f"{type(exc).__name__}: {message if isinstance(message, str) and message else exc}"

    def _body(self, exc: BaseException) -> object:
        raise NotImplementedError
