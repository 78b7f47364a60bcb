"""Bulk mode of ``EngineBackend``: no periodic refresh while an add or an ingest writes, put back after.

The values to put back are recorded in the cluster before they are changed, in one place: the articles
index's ``_meta`` (``bodies.RESTORE_KEY``). An add that dies in bulk mode leaves them for the next add to
restore; with overlapping adds the last one to enter holds the record and the first to finish leaves it.
The contexts index's mapping is never updated after it is made (OpenSearch's k-NN 2.19.1 fails a
graph-less shard on a mapping update).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

from bertknn_search.backends.engines import bodies
from bertknn_search.errors import BertKnnError

# While an add runs: no periodic refresh (add_articles refreshes itself when a batch is complete); put
# back by close(). Replicas stay: an add that dropped them would lose its shards with the first node
# lost during it (the indices red, every question and re-run failing until the node came back).
BULK_SETTINGS = {"refresh_interval": "-1"}
# A run that wrote at least this share of the articles index (a first ingest, a rebuild) merges it into one
# segment at its end, where the index is smaller than MERGE_MAX_BYTES (and the run wrote at least
# MERGE_MIN_DOCS). Docs are written with their IR terms, which ``_source`` leaves out: the engine keeps the
# whole source beside it for recovery (``_recovery_source``, a third of the index at 5,000 articles) until a
# merge drops it (usually: see ``_merge_if_mostly_new``); one segment is also smaller than several, and
# searches faster. Larger indices are left to the engine's own merges (a force merge rewrites the whole index,
# and segments of over 5 GB are never merged again).
MERGE_SHARE = 0.5
MERGE_MAX_BYTES = 2 * 1024**3
# A run of fewer articles is not merged: at 1,000 (about 7 MB on an engine) the merge saved 2-4 MB and
# took up to 0.8 s beyond the refresh it replaces, of a lazy ingest of 2-3 s; the index stays under 2x
# embedded's disk without it (1.3x / 1.6x, docs/performance.md).
MERGE_MIN_DOCS = 2_000


class EngineBulkMode:
    """Entering and leaving bulk mode, and a run of writes (``bulk``) that refreshes once at its end."""

    # Provided by EngineBackend.
    client: Any
    names: dict[str, str]
    _call: Callable[..., Any]
    _restore: dict[str, dict[str, Any]] | None  # settings to put back, once this writer entered
    _token: str  # names this writer in the restore record it holds
    _in_run: bool  # inside ``bulk``: a lazy write leaves its refresh to the run's end
    _unrefreshed: bool  # articles written in this run that no refresh has made searchable yet
    _run_docs: int  # article docs this run wrote (a doc replaced twice counted twice)

    @contextlib.contextmanager
    def bulk(self, write_articles: int, write_chars: int) -> Iterator[None]:
        """A run of writes: text-only articles (a lazy ingest) become searchable together at its end.

        Each ``add_articles`` is still whole on its own: a doc is written whole, and read by id at
        once (``fingerprints``); only the search's refresh waits for the run's end, one where there was
        one per write. Writes that replace contexts or add them still refresh at once (``add_articles``).
        """
        self._in_run = True
        try:
            yield
        except BaseException:
            # What the run wrote before it failed is kept, and searchable like the rest; the error that
            # stopped it is the one to report, not a second one from this refresh.
            with contextlib.suppress(BertKnnError):
                self._end_run()
            raise
        self._end_run()

    def _end_run(self) -> None:
        self._in_run = False
        if not self._unrefreshed:
            return
        articles = self.names["articles"]
        if MERGE_SHARE <= 1 and self._run_docs >= MERGE_MIN_DOCS:
            self._merge_if_mostly_new(articles)
        self._call("refresh the articles index", lambda: self.client.indices.refresh(index=articles))
        self._unrefreshed, self._run_docs = False, 0

    def _merge_if_mostly_new(self, articles: str) -> None:
        """Merge the articles index into one segment where this run wrote most of it (``MERGE_SHARE``)."""
        found = self._call(
            "read the articles index's size",
            lambda: self.client.indices.stats(index=articles, metric="docs,store"),
        )
        total = found.get("_all", {}).get("primaries", {})
        docs = int(total.get("docs", {}).get("count") or 0) + int(total.get("docs", {}).get("deleted") or 0)
        size = int(total.get("store", {}).get("size_in_bytes") or 0)
        # Unrefreshed docs are counted once flushed: the engine's counts may lag the run's.
        if size > MERGE_MAX_BYTES or self._run_docs < MERGE_SHARE * max(docs, self._run_docs):
            return
        # The engine drops the recovery source only below what its retention leases, renewed every 30 s
        # or so, hold: a merge right after the writes keeps it in some runs (20,000 articles: 4 of 12),
        # and the one segment is still smaller than the several. With its commit (the default); the
        # refresh after makes the merged segment searchable.
        merge = self.client.indices.forcemerge
        self._call("merge the articles index", lambda: merge(index=articles, max_num_segments=1))

    def _enter_bulk_mode(self) -> None:
        """Record both indices' settings in the articles index's ``_meta``, then apply the bulk values.

        Three requests: one read of both indices (settings and mappings), one mapping update of the
        articles index, one settings update of both; the contexts index's mapping only where an older
        version left its own record there (moved here, then dropped there).
        """
        if self._restore is not None:
            return
        indices = ",".join(self.names.values())
        state = self._call("read index settings", lambda: self.client.indices.get(index=indices))
        restore = bodies.settings_to_restore(state, self.names)
        # Record the values to restore in the cluster first: if this process dies, the next add finds them.
        # The last writer to enter holds the record; only the holder removes it when it is done.
        self._put_meta(bodies.meta_of(state, self.names["articles"]), restore)
        contexts = self.names["contexts"]
        old = bodies.meta_of(state, contexts)
        if bodies.RESTORE_KEY in old:  # an older version's record: its values are in the one just written
            body = {"_meta": bodies.meta_with_restore(old, None)}
            put = self.client.indices.put_mapping
            self._call("record index settings", lambda: put(index=contexts, body=body))
        self._call(
            "apply bulk-load settings",
            lambda: self.client.indices.put_settings(index=indices, body={"index": BULK_SETTINGS}),
        )
        self._restore = restore

    def _leave_bulk_mode(self) -> None:
        """Put back the recorded settings, and drop the record where this writer still holds it."""
        if self._restore is None:
            return
        # One request per distinct set of values: both indices at once where they had the same.
        groups: dict[str, list[str]] = {}
        for name, settings in self._restore.items():
            groups.setdefault(json.dumps(settings, sort_keys=True), []).append(name)
        put = self.client.indices.put_settings
        for values, group in groups.items():
            index, body = ",".join(group), {"index": json.loads(values)}
            self._call("restore index settings", lambda i=index, b=body: put(index=i, body=b))
        articles = self.names["articles"]
        mappings = self._call("read index metadata", lambda: self.client.indices.get_mapping(index=articles))
        meta = bodies.meta_of(mappings, articles)
        if bodies.restore_owner(meta) == self._token:  # a later writer may still need it
            self._put_meta(meta, None)
        self._restore = None

    def _put_meta(self, meta: dict[str, Any], restore: dict[str, dict[str, Any]] | None) -> None:
        """The articles index's ``_meta`` (read as ``meta``) with this writer's restore record, or none."""
        body = {"_meta": bodies.meta_with_restore(meta, restore, self._token)}
        name, put = self.names["articles"], self.client.indices.put_mapping
        self._call("record index settings", lambda: put(index=name, body=body))
