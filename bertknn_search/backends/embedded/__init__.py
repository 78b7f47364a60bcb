"""The embedded store: SQLite for texts and contexts, tantivy for IR, numpy for the exact kNN; no server."""

from bertknn_search.backends.embedded.backend import EmbeddedBackend

__all__ = ["EmbeddedBackend"]
