"""Writer: adds and deletes, one at a time, on their own thread, with an encoder loaded on first use.

Queries never wait for a write: the index takes an article and its contexts in one transaction, and a
query reads the last committed state. Writes are serialised so that two adds of one id cannot interleave.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from bertknn_search.config import Config
from bertknn_search.records import Article

log = logging.getLogger("bertknn_search.server")


class Writer:
    """Runs ``add`` and ``delete`` on one thread; ``close`` waits for the one in progress to finish."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="writer")
        self._encoder: Any = None  # bertknn_search.encoding.encoder.Encoder, loaded by the first add
        self._lock = threading.Lock()
        self.adds = 0
        self.deletes = 0
        self.running: str | None = None  # what the writer is doing now, for logs and /stats

    def add(self, articles: Sequence[Article]) -> Future[Any]:
        """Add or replace ``articles``; the future holds the ``IngestSummary`` once they are answerable."""
        return self._pool.submit(self._add, list(articles))

    def delete(self, article_ids: Sequence[str]) -> Future[int]:
        """Delete ``article_ids``; the future holds how many were stored."""
        return self._pool.submit(self._delete, list(article_ids))

    def close(self) -> None:
        """Finish the write in progress and any queued, then stop (a SIGTERM ends here, losing nothing)."""
        if self.running:
            log.info("waiting for the %s to finish", self.running)
        self._pool.shutdown(wait=True)

    # -- on the writer thread --------------------------------------------------------------------------
    def _add(self, articles: list[Article]) -> Any:
        from bertknn_search.encoding.encoder import Encoder
        from bertknn_search.ingest.pipeline import ingest

        config = self.config
        if self._encoder is None:
            self._encoder = Encoder(
                config.model, config.layer, config.device, config.max_length, config.precision, config.runtime
            )
        self.running = f"add of {len(articles):,} articles"
        log.info("%s started", self.running)
        try:
            summary = ingest(articles, config, progress=False, existing_only=True, encoder=self._encoder)
        finally:
            log.info("%s finished", self.running)
            self.running = None
        self.adds += 1
        return summary

    def _delete(self, article_ids: list[str]) -> int:
        from bertknn_search.backends import open_backend

        backend = open_backend(self.config)
        try:
            deleted = backend.delete_articles(article_ids)
        finally:
            backend.close()
        self.deletes += 1
        return deleted
