"""Backends: ``open_backend`` is the one place that maps a backend name to a class."""

from __future__ import annotations

from bertknn_search.backends.base import Backend
from bertknn_search.config import Config
from bertknn_search.records import IndexMeta


def open_backend(config: Config, create: IndexMeta | None = None) -> Backend:
    """Open the index ``config`` names; with ``create``, make it (or check it matches) first.

    Raises:
        IndexNotFoundError, IndexCorruptError, IndexMismatchError, BackendError.
    """
    if config.backend == "opensearch":
        from bertknn_search.backends.opensearch import OpenSearchBackend

        return OpenSearchBackend.create(config, create) if create else OpenSearchBackend.open(config)
    from bertknn_search.backends.embedded import EmbeddedBackend

    return EmbeddedBackend.create(config.index, create) if create else EmbeddedBackend.open(config.index)


__all__ = ["Backend", "open_backend"]
