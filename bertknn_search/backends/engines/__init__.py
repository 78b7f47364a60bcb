"""The engine layer: OpenSearch and Elasticsearch as one backend (``backend.py``) with two small dialects."""

from __future__ import annotations

from collections.abc import Callable

from bertknn_search.backends.engines.dialect import Dialect
from bertknn_search.backends.engines.elasticsearch import ElasticsearchDialect
from bertknn_search.backends.engines.opensearch import OpenSearchDialect

DIALECTS: dict[str, Callable[[], Dialect]] = {
    "opensearch": OpenSearchDialect,
    "elasticsearch": ElasticsearchDialect,
}


def dialect_for(name: str) -> Dialect:
    """The dialect of backend ``name`` ("opensearch" or "elasticsearch")."""
    return DIALECTS[name]()
