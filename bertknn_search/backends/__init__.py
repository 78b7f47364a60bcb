"""Backends: ``open_backend`` is the one place that maps a backend name to a class."""

from __future__ import annotations

from bertknn_search.backends.base import Backend
from bertknn_search.config import Config
from bertknn_search.records import IndexMeta


def open_backend(config: Config, create: IndexMeta | None = None, for_writing: bool = False) -> Backend:
    """Open the index ``config`` names; with ``create``, make it (or check it matches) first.

    ``for_writing`` (implied by ``create``) fails at once where the embedded index cannot be written;
    an OpenSearch cluster reports its permissions on the first write.

    Raises:
        IndexNotFoundError, IndexCorruptError, IndexMismatchError, BackendError.
    """
    if config.backend == "opensearch":
        from bertknn_search.backends.opensearch import OpenSearchBackend

        return OpenSearchBackend.create(config, create) if create else OpenSearchBackend.open(config)
    from bertknn_search.backends.embedded import EmbeddedBackend

    if create:
        return EmbeddedBackend.create(config.index, create)
    return EmbeddedBackend.open(config.index, for_writing=for_writing)


__all__ = ["Backend", "open_backend"]
