"""Backends: ``open_backend`` is the one place that maps a backend name to a class."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bertknn_search.backends.base import Backend
from bertknn_search.config import Config
from bertknn_search.records import IndexMeta

if TYPE_CHECKING:
    from bertknn_search.encoding.encoder import Encoder


def open_backend(config: Config, create: IndexMeta | None = None, for_writing: bool = False) -> Backend:
    """Open the index ``config`` names; with ``create``, make it (or check it matches) first.

    ``for_writing`` (implied by ``create``) fails at once where the embedded index cannot be written;
    an OpenSearch or Elasticsearch cluster reports its permissions on the first write.

    Raises:
        IndexNotFoundError, IndexCorruptError, IndexMismatchError, BackendError.
    """
    if config.backend != "embedded":  # a search engine: one layer, the engine's dialect inside it
        from bertknn_search.backends.engines.backend import EngineBackend

        return EngineBackend.create(config, create) if create else EngineBackend.open(config)
    from bertknn_search.backends.embedded.backend import EmbeddedBackend

    if create:
        return EmbeddedBackend.create(config.index, create)
    return EmbeddedBackend.open(config.index, for_writing=for_writing)


def searchable(backend: Backend, encoder: Encoder, config: Config) -> Backend:
    """The backend queries go through: a lazy index is wrapped so that it encodes contexts on demand."""
    if backend.meta().contexts == "eager":
        return backend
    from bertknn_search.backends.lazy import LazyDatastore

    return LazyDatastore(backend, encoder, config)  # type: ignore[arg-type]


__all__ = ["Backend", "open_backend", "searchable"]
