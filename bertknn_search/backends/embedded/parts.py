"""The embedded backend's side for the lazy datastore (``ContextStore``): texts out, contexts in by parts.

A lazy index stores a long article's contexts in parts, in the order questions needed them, with which
rows are stored (``coverage``); the part that stores the last row makes the article whole, one row of
``contexts`` as an eager index stores it. ``EmbeddedBackend`` takes these methods from ``ContextStoreSide``;
its file, transactions and stored-text codec are its own (``embedded.py``).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import numpy as np

from bertknn_search.backends.embedded.text_codec import TextCodec, stored_size
from bertknn_search.records import (
    Article,
    ContextBlock,
    Coverage,
    EncodedArticle,
    EncodePlan,
    IndexMeta,
    PendingArticle,
)

if TYPE_CHECKING:
    from bertknn_search.backends.blocks import Block

# A lazy index stores a long article's contexts in parts, in the order questions needed them, with
# which rows are stored; the part tables join an index made before them on its first writable open.
PART_TABLES = """
CREATE TABLE IF NOT EXISTS context_parts (
    article INTEGER NOT NULL REFERENCES articles(rowid),
    part INTEGER NOT NULL,
    rows BLOB NOT NULL,
    vectors BLOB NOT NULL,
    token_ids BLOB NOT NULL,
    sentence_ids BLOB NOT NULL,
    starts BLOB NOT NULL,
    ends BLOB NOT NULL,
    PRIMARY KEY (article, part)
);
CREATE TABLE IF NOT EXISTS coverage (
    article INTEGER PRIMARY KEY REFERENCES articles(rowid),
    total INTEGER NOT NULL,
    encoded INTEGER NOT NULL,
    done BLOB NOT NULL,
    sentences TEXT NOT NULL,
    used REAL NOT NULL DEFAULT 0,
    bytes INTEGER NOT NULL DEFAULT 0
);
"""
# What an article's contexts are held in: the whole, or the parts and which rows they hold.
PARTS = ("context_parts", "coverage")
CONTEXTS = ("contexts", *PARTS)
BUSY_TIMEOUT_MS = 60_000  # how long a writer waits for another's transaction (sqlite3 timeout=60 s)


class ContextStoreSide:
    """The ``ContextStore`` methods of ``EmbeddedBackend``, over the file and helpers it provides."""

    # Provided by EmbeddedBackend.
    _conn: sqlite3.Connection
    _lock: threading.Lock
    _meta: IndexMeta
    _parts: bool
    _popularity: bool
    _read_only: str
    _read: Callable[[], AbstractContextManager[sqlite3.Cursor]]
    _write: Callable[..., AbstractContextManager[sqlite3.Cursor]]
    _check_writable: Callable[[], None]
    _check_dim: Callable[[str, ContextBlock], None]
    _columns: Callable[[ContextBlock], tuple[bytes, ...]]
    _put_block: Callable[[sqlite3.Cursor, int, ContextBlock], None]
    _block: Callable[..., Block]
    _text_codec: Callable[[sqlite3.Cursor], TextCodec]
    _unpack: Callable[..., str]
    _article_text: Callable[..., str]
    _sentence_list: Callable[..., list[str]]

    # -- the lazy datastore's side (ContextStore) ---------------------------------------------------
    def ensure_contexts(self, article_ids: Sequence[str], plan: EncodePlan | None = None) -> int:
        """Nothing to do here: a lazy index is searched through ``LazyDatastore``, which encodes."""
        return 0

    def encode_more(self, max_contexts: int, plan: EncodePlan | None = None) -> int:
        return 0

    @property
    def read_only(self) -> str:
        return self._read_only

    def unencoded(self, article_ids: Sequence[str]) -> list[PendingArticle]:
        ids = sorted(set(article_ids))
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        part = "v.total, v.done, v.sentences" if self._parts else "NULL, NULL, NULL"
        join = "LEFT JOIN coverage v ON v.article = a.rowid" if self._parts else ""
        # What an article's text is checked against (``_article_text``): its length, and its fingerprint's
        # other parts.
        popularity_sql = (
            "(SELECT p.value FROM popularity p WHERE p.article = a.rowid)" if self._popularity else "NULL"
        )
        with self._read() as cur:
            rows = cur.execute(
                f"SELECT a.id, a.title, t.text, a.fingerprint, {part}, a.n_chars, {popularity_sql}"
                f" FROM articles a JOIN texts t ON t.article = a.rowid {join} WHERE a.id IN ({marks})"
                " AND NOT EXISTS (SELECT 1 FROM contexts c WHERE c.article = a.rowid) ORDER BY a.id",
                ids,
            ).fetchall()
            self._text_codec(cur)
        out = []
        for aid, title, text, fp, total, done, sentences, n_chars, popularity in rows:
            rows_done = np.zeros(0, np.int64) if total is None else _unpack_rows(done, total)
            listed = None if sentences is None else self._sentence_list(aid, sentences, n_chars)
            article = Article(aid, title, self._article_text(aid, title, text, n_chars, fp, popularity))
            out.append(PendingArticle(article, fp, rows_done, listed))
        return out

    def coverage(self, article_ids: Sequence[str]) -> dict[str, Coverage]:
        """How many contexts of each of ``article_ids`` are stored, of how many; {} for eager indexes.

        An article never encoded has no entry: how many contexts it has is not known before it is split.
        """
        ids = sorted(set(article_ids))
        if not ids or self._meta.contexts != "lazy":
            return {}
        marks = ",".join("?" * len(ids))
        partial = (
            "UNION ALL SELECT a.id, v.encoded, v.total FROM coverage v JOIN articles a ON a.rowid = v.article"
            f" WHERE a.id IN ({marks})"
            if self._parts
            else ""
        )
        with self._read() as cur:
            rows = cur.execute(
                "SELECT a.id, a.n_contexts, a.n_contexts FROM contexts c JOIN articles a"
                f" ON a.rowid = c.article WHERE a.id IN ({marks}) {partial}",
                ids * (2 if partial else 1),
            ).fetchall()
        return {aid: Coverage(encoded, total) for aid, encoded, total in rows}

    def partial_articles(self, limit: int) -> list[str]:
        """Up to ``limit`` articles whose contexts are partly stored, most recently used first."""
        if not self._parts:
            return []
        with self._read() as cur:
            rows = cur.execute(
                "SELECT a.id FROM coverage v JOIN articles a ON a.rowid = v.article"
                " ORDER BY v.used DESC, a.id LIMIT ?",
                (limit,),
            ).fetchall()
        return [aid for (aid,) in rows]

    def touch(self, article_ids: Sequence[str]) -> None:
        """Mark cached contexts as just used; best effort, never waiting long for a busy writer.

        Least-recently-used order only steers eviction, so a query that cannot take the write lock at
        once (an add is committing) or runs on a read-only index skips this rather than wait or fail.
        """
        ids = list(article_ids)
        marks = ",".join("?" * len(ids))
        with self._lock:
            try:
                self._conn.execute("PRAGMA busy_timeout = 20")
                for table in ("contexts", "coverage") if self._parts else ("contexts",):
                    self._conn.execute(
                        f"UPDATE {table} SET used = ? WHERE article IN"
                        f" (SELECT rowid FROM articles WHERE id IN ({marks}))",
                        (time.time(), *ids),
                    )
            except sqlite3.OperationalError:
                pass
            finally:
                self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")

    def put_contexts(self, items: Sequence[EncodedArticle]) -> int:
        self._check_writable()
        stored = 0
        with self._lock, self._write(len(items)) as cur:
            for item in items:
                if item.contexts is None:
                    continue
                self._check_dim(item.article.id, item.contexts)
                found = cur.execute(
                    "SELECT rowid FROM articles WHERE id = ? AND fingerprint = ?",
                    (item.article.id, item.fingerprint),
                ).fetchone()
                if found is None:  # replaced (or removed) since its text was read: that text is gone
                    continue
                if item.rows is None:
                    self._put_whole(cur, found[0], item.contexts)
                    stored += 1
                elif self._put_part(cur, found[0], item):
                    stored += 1
        return stored

    def _put_whole(self, cur: sqlite3.Cursor, rowid: int, block: ContextBlock) -> None:
        """An article's every context: one row of ``contexts``; any parts it had are superseded."""
        delete_rows(cur, PARTS, rowid)
        self._put_block(cur, rowid, block)
        cur.execute(
            "UPDATE articles SET n_sentences = ?, n_contexts = ? WHERE rowid = ?",
            (len(block.sentences), len(block), rowid),
        )

    def _put_part(self, cur: sqlite3.Cursor, rowid: int, item: EncodedArticle) -> bool:
        """Store the rows of a part that are not stored yet; the last part makes the article whole.

        Rows another writer stored meanwhile are left out, so two processes encoding one article keep
        one copy of each context. Returns whether anything new was stored.
        """
        block, rows, total = item.contexts, item.rows, item.total
        assert block is not None and rows is not None and total is not None
        if cur.execute("SELECT 1 FROM contexts WHERE article = ?", (rowid,)).fetchone():
            return False  # whole already
        held = cur.execute("SELECT done, bytes FROM coverage WHERE article = ?", (rowid,)).fetchone()
        done = np.zeros(total, bool) if held is None else _unpack_mask(held[0], total)
        new = ~done[rows]
        if not new.any():
            return False
        part = _select(block, np.flatnonzero(new))
        rows = rows[new]
        done[rows] = True
        columns = self._columns(part)
        sentences = self._text_codec(cur).pack(json.dumps(block.sentences, ensure_ascii=False))
        size = sum(len(c) for c in columns) + rows.size * 4 + (held[1] if held else 0)
        if held is None:
            size += stored_size(sentences)
        number = cur.execute(
            "SELECT COALESCE(MAX(part), -1) + 1 FROM context_parts WHERE article = ?", (rowid,)
        ).fetchone()[0]
        cur.execute(
            "INSERT INTO context_parts VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (rowid, number, rows.astype(np.int32).tobytes(), *columns),
        )
        cur.execute(
            "INSERT INTO coverage (article, total, encoded, done, sentences, used, bytes)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(article) DO UPDATE SET encoded = excluded.encoded,"
            " done = excluded.done, used = excluded.used, bytes = excluded.bytes",
            (
                rowid,
                total,
                int(done.sum()),
                np.packbits(done).tobytes(),
                sentences,
                time.time(),
                size,
            ),
        )
        if done.all():  # the whole article: one row, in row order, as an eager index stores it
            whole = self._whole_from_parts(cur, item.article.id, rowid, block.sentences)
            self._put_whole(cur, rowid, whole)
        return True

    def _whole_from_parts(
        self, cur: sqlite3.Cursor, article_id: str, rowid: int, sentences: list[str]
    ) -> ContextBlock:
        parts = cur.execute(
            "SELECT rows, vectors, token_ids, sentence_ids, starts, ends FROM context_parts"
            " WHERE article = ? ORDER BY part",
            (rowid,),
        ).fetchall()
        rows = np.concatenate([np.frombuffer(p[0], np.int32) for p in parts])
        blocks = [self._block(article_id, *p[1:]) for p in parts]
        order = np.argsort(rows, kind="stable")
        merged = {name: np.concatenate([b[name] for b in blocks])[order] for name in blocks[0]}
        return ContextBlock(
            sentences=list(sentences),
            vectors=merged["vectors"].astype(np.float16),
            token_ids=merged["token_ids"],
            sentence_ids=merged["sentence_ids"],
            starts=merged["starts"],
            ends=merged["ends"],
        )

    def evict_contexts(self, budget: int, keep: Sequence[str]) -> int:
        with self._lock, self._write(0, stores=False) as cur:
            held = "SELECT article, bytes, used FROM contexts UNION ALL"
            held += " SELECT article, bytes, used FROM coverage"
            total = cur.execute(f"SELECT COALESCE(SUM(bytes), 0) FROM ({held})").fetchone()[0]
            if total <= budget:
                return 0
            kept = set(keep)
            # Only articles that still have their text can be encoded again; an eager article cannot.
            oldest = cur.execute(
                f"SELECT c.article, c.bytes, a.id FROM ({held}) c JOIN articles a ON a.rowid = c.article"
                " WHERE EXISTS (SELECT 1 FROM texts t WHERE t.article = c.article) ORDER BY c.used, a.id"
            )
            dropped = []
            for rowid, size, aid in oldest:
                if total <= budget:
                    break
                if aid not in kept:
                    dropped.append(rowid)
                    total -= size
            for lo in range(0, len(dropped), 500):
                chunk = dropped[lo : lo + 500]
                marks = ",".join("?" * len(chunk))
                for table in CONTEXTS:
                    cur.execute(f"DELETE FROM {table} WHERE article IN ({marks})", chunk)
                cur.execute(
                    f"UPDATE articles SET n_sentences = 0, n_contexts = 0 WHERE rowid IN ({marks})", chunk
                )
        return len(dropped)


def delete_rows(cur: sqlite3.Cursor, tables: Sequence[str], rowid: int) -> None:
    for table in tables:
        cur.execute(f"DELETE FROM {table} WHERE article = ?", (rowid,))


def _unpack_mask(done: bytes, total: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(done, np.uint8), count=total).astype(bool)


def _unpack_rows(done: bytes, total: int) -> np.ndarray:
    return np.flatnonzero(_unpack_mask(done, total))


def _select(block: ContextBlock, keep: np.ndarray) -> ContextBlock:
    return ContextBlock(
        sentences=block.sentences,
        vectors=block.vectors[keep],
        token_ids=block.token_ids[keep],
        sentence_ids=block.sentence_ids[keep],
        starts=block.starts[keep],
        ends=block.ends[keep],
    )
