"""EmbeddedBackend: one SQLite file holding articles and float16 context blocks, and a tantivy article index.

Needs no server. Every write is one SQLite transaction in WAL mode, so readers in other processes keep
answering from the last committed state while an ``add`` runs, and a crash never leaves half an article.
The BM25 article index beside it (``article_index``) is kept in step with SQLite as that module describes.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np

from bertknn_search.backends import codec
from bertknn_search.backends.base import check_meta, extrapolate, title_patterns
from bertknn_search.backends.blocks import Block, FlatIndex, exact_knn
from bertknn_search.backends.embedded import sqlite_file
from bertknn_search.backends.embedded.article_index import IR_DIR, ArticleIndex, field_texts
from bertknn_search.backends.embedded.article_index import PARTS as IR_PARTS
from bertknn_search.backends.embedded.parts import (
    CONTEXTS,
    PART_TABLES,
    PARTS,
    ContextStoreSide,
    delete_rows,
)
from bertknn_search.backends.embedded.schema import (
    DB_NAME,
    GENERATION,
    POPULARITY_TABLE,
    SCHEMA,
    SCHEMA_VERSION,
    read_meta,
)
from bertknn_search.backends.embedded.text_codec import TextCodec, stored_size
from bertknn_search.backends.embedded.texts import TextStoreSide
from bertknn_search.errors import (
    BackendError,
    IndexCorruptError,
    IndexIncompleteError,
    IndexMismatchError,
    StoreWriteError,
)
from bertknn_search.records import (
    ArticleHit,
    ContextBlock,
    EncodedArticle,
    IndexMeta,
    IndexStats,
    Neighbors,
)
from bertknn_search.terms import query_terms


class EmbeddedBackend(ContextStoreSide, TextStoreSide):
    """The default backend: a directory holding ``index.sqlite``."""

    name = "embedded"

    def __init__(
        self, path: Path, conn: sqlite3.Connection, meta: IndexMeta, ir: ArticleIndex, read_only: str = ""
    ) -> None:
        self.path = path
        self._conn = conn
        self._meta = meta
        self._ir = ir
        self._read_only = read_only  # why this index was opened read-only; "" when it is writable
        self._lock = threading.RLock()  # the ingest writer thread shares the connection
        self._flat: FlatIndex | None = None
        self._codec = TextCodec()  # its dictionary is read in with the first snapshot that has one
        self._version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
        if not read_only:
            # Indexes built before article popularity existed gain its table (optional: no new version).
            with self._lock, conn:
                conn.execute(POPULARITY_TABLE)
                for statement in PART_TABLES.split(";"):
                    if statement.strip():
                        conn.execute(statement)
            ir.recover(self._ir_versions)
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        self._popularity = "popularity" in tables
        self._parts = "coverage" in tables  # absent from an older index opened read-only

    # -- opening ----------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: Path, meta: IndexMeta) -> EmbeddedBackend:
        """Open the index at ``path`` for writing, creating it with ``meta`` if it does not exist yet.

        Creation is atomic: the new file is built under a temporary name beside ``index.sqlite`` and
        linked into place only once its schema and metadata are committed, so a kill at any moment
        leaves either no index or a complete empty one, and running the command again goes on.

        Raises:
            IndexMismatchError: the index exists and was built with other settings.
            BackendError: the index cannot be created, or exists but is read-only.
        """
        path = Path(path)
        db = path / DB_NAME
        if path.exists() and not path.is_dir():
            raise IndexCorruptError(f"{path} is a file, not an index directory; choose another --index")
        if path.is_dir():
            sqlite_file.remove_abandoned_builds(path)
        if db.exists():
            try:
                return cls._open_for_writing(path, meta)
            except IndexIncompleteError:
                # An interrupted creation (by an older version) left it; it holds no data.
                sqlite_file.discard(db)
        made = not path.exists()
        try:
            path.mkdir(parents=True, exist_ok=True)
            ArticleIndex.create(path)  # before SQLite: an index with a database has both
            values = {**{k: str(v) for k, v in asdict(meta).items()}, "schema_version": SCHEMA_VERSION}
            sqlite_file.publish(db, SCHEMA, {**values, "generation": "0"})
        except (OSError, sqlite3.Error) as exc:
            if made:  # the directory is ours alone: take back the article index made in it too
                shutil.rmtree(path, ignore_errors=True)
            raise BackendError(
                f"cannot create index at {path}: {exc}; nothing was created, run the command again once"
                " the cause is fixed"
            ) from exc
        return cls._open_for_writing(path, meta)

    @classmethod
    def _open_for_writing(cls, path: Path, meta: IndexMeta) -> EmbeddedBackend:
        backend = cls.open(path, for_writing=True)
        try:
            check_meta(backend.meta(), meta, str(path))
        except BaseException:
            backend.close()
            raise
        return backend

    @classmethod
    def open(cls, path: Path, for_writing: bool = False) -> EmbeddedBackend:
        """Open an existing index; read-only when its directory or volume cannot be written.

        Args:
            path: the index directory.
            for_writing: fail at once, with why, when the index can only be read here.

        Raises:
            IndexNotFoundError: nothing at ``path`` (IndexIncompleteError: its creation was interrupted).
            IndexCorruptError: ``path`` holds something that is not a readable index.
            BackendError: the index cannot be opened here (permissions, a read-only volume it cannot be
                read from); the index itself is fine.
        """
        path = Path(path)
        db = path / DB_NAME
        if not db.exists():
            raise sqlite_file.missing_index(path, IR_PARTS)
        conn, read_only = sqlite_file.connect(db)
        try:
            meta = read_meta(conn, path)
            backend = cls(path, conn, meta, ArticleIndex.open(path, bool(read_only)), read_only)
            if for_writing:
                backend._check_writable()
        except BaseException:
            conn.close()
            raise
        return backend

    @property
    def location(self) -> str:
        return str(self.path)

    def meta(self) -> IndexMeta:
        return self._meta

    def _check_writable(self) -> None:
        if self._read_only:
            raise BackendError(
                f"index at {self.path} is read-only here ({self._read_only}); ingest and add need write"
                " access to it and its directory"
            )

    # -- writing ----------------------------------------------------------------------------------
    def add_articles(
        self, items: Sequence[EncodedArticle], ir_fields: Mapping[str, tuple[str, str]] | None = None
    ) -> None:
        """Write or replace ``items`` in one transaction: all of them become visible at once.

        Args:
            ir_fields: article id -> its ``field_texts``, where the caller made them already (ingest's
                worker processes); made here for the others.
        """
        items = list({item.article.id: item for item in items}.values())  # an id given twice: the last
        if not items:
            return
        self._check_writable()
        given = ir_fields or {}
        fields = [  # before locking
            given.get(item.article.id) or field_texts(item.article.title, item.article.text) for item in items
        ]
        with (
            self._lock,
            self._ir.writing(
                self._ir_versions, len(items), sum(len(item.article.text) for item in items)
            ) as batch,
            self._write(len(items)) as cur,
        ):
            self._train_codec(cur, [item.article.text for item in items if item.contexts is None])
            for item, item_fields in zip(items, fields):
                batch.add(item.article.id, item_fields, replaces=self._write_one(cur, item, batch.version))
            cur.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'generation'")
            batch.commit()  # tantivy first: an article SQLite holds is always in tantivy

    def bulk(self, write_articles: int, write_chars: int) -> AbstractContextManager[None]:
        """Hold the write lock and one tantivy writer for the run (``ArticleIndex.bulk``)."""
        self._check_writable()
        return self._ir.bulk(self._ir_versions, write_articles, write_chars)

    def delete_articles(self, article_ids: Sequence[str]) -> int:
        """Delete articles, their contexts and texts in one transaction, then their tantivy documents.

        As for a replaced article, tantivy's documents go after SQLite commits (readers ignore documents
        of articles their snapshot lacks), and a writer that dies in between is repaired by the next.
        """
        self._check_writable()
        ids = list(dict.fromkeys(article_ids))
        if not self._ir_versions(ids):
            return 0
        deleted = 0
        with (
            self._lock,
            self._ir.writing(self._ir_versions, 0) as batch,
            self._write(len(ids), stores=False) as cur,
        ):
            for aid in ids:
                row = cur.execute("SELECT rowid FROM articles WHERE id = ?", (aid,)).fetchone()
                if row is None:
                    continue
                delete_rows(cur, (*CONTEXTS, "texts", "popularity"), row[0])
                cur.execute("DELETE FROM articles WHERE rowid = ?", row)
                batch.remove(aid)
                deleted += 1
            cur.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'generation'")
            batch.commit()
        return deleted

    def _write_one(self, cur: sqlite3.Cursor, item: EncodedArticle, ir_version: int) -> bool:
        """Write one article's row and its contexts (or, lazy, its text); True when it replaced one."""
        art, block = item.article, item.contexts
        if block is not None:
            self._check_dim(art.id, block)
        replaced = cur.execute("SELECT 1 FROM articles WHERE id = ?", (art.id,)).fetchone() is not None
        counts = (0, 0) if block is None else (len(block.sentences), len(block))
        row = (art.title, art.title.strip().lower(), item.fingerprint, *counts)
        cur.execute(
            "INSERT INTO articles (id, title, title_key, fingerprint, n_sentences, n_contexts, ir_version,"
            " n_chars) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT(id) DO UPDATE SET title=excluded.title, title_key=excluded.title_key,"
            " fingerprint=excluded.fingerprint, n_sentences=excluded.n_sentences,"
            " n_contexts=excluded.n_contexts, ir_version=excluded.ir_version, n_chars=excluded.n_chars",
            (art.id, *row, ir_version, len(art.text)),
        )
        rowid = cur.execute("SELECT rowid FROM articles WHERE id = ?", (art.id,)).fetchone()[0]
        cur.execute("DELETE FROM popularity WHERE article = ?", (rowid,))
        if art.popularity is not None:
            cur.execute("INSERT INTO popularity VALUES (?, ?)", (rowid, art.popularity))
        if block is None:
            # Text only (a lazy index): contexts cached for an older text are stale from now on.
            delete_rows(cur, CONTEXTS, rowid)
            cur.execute("INSERT OR REPLACE INTO texts VALUES (?, ?)", (rowid, self._codec.pack(art.text)))
        else:
            delete_rows(cur, PARTS, rowid)
            self._put_block(cur, rowid, block)
        return replaced

    def _check_dim(self, article_id: str, block: ContextBlock) -> None:
        if block.vectors.shape[1:] != (self._meta.dim,):
            raise IndexMismatchError(
                f"article {article_id!r} has vectors of shape {block.vectors.shape};"
                f" the index dimension is {self._meta.dim}"
            )

    def _columns(self, block: ContextBlock) -> tuple[bytes, ...]:
        """A block's arrays as stored: vectors, token ids, sentence ids, starts, ends."""
        return (
            codec.encode(block.vectors, self._meta.store_dtype),
            block.token_ids.astype(np.int32).tobytes(),
            block.sentence_ids.astype(np.int32).tobytes(),
            block.starts.astype(np.int32).tobytes(),
            block.ends.astype(np.int32).tobytes(),
        )

    def _put_block(self, cur: sqlite3.Cursor, rowid: int, block: ContextBlock) -> None:
        sentences = self._text_codec(cur).pack(json.dumps(block.sentences, ensure_ascii=False))
        columns = self._columns(block)
        size = sum(len(c) for c in columns) + stored_size(sentences)
        cur.execute(
            "INSERT OR REPLACE INTO contexts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (rowid, sentences, *columns, time.time(), size),
        )

    @contextmanager
    def _write(self, articles: int, stores: bool = True) -> Iterator[sqlite3.Cursor]:
        """One write transaction for ``articles`` articles: all of them are committed, or none.

        ``stores``: the write may store text or sentences in this version's form, so an older index is
        marked with this version (a delete or an eviction stores nothing and leaves it readable by the
        release that made it).
        """
        cur = self._conn.cursor()
        # A dictionary trained in a write that rolls back was never stored: rows packed with it later
        # would be unreadable to every other process, so the codec goes back with the transaction.
        codec = self._codec
        try:
            cur.execute("BEGIN IMMEDIATE")
            if stores and self._version != SCHEMA_VERSION:  # an older index: what is stored needs this code
                cur.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION,))
            yield cur
            cur.execute("COMMIT")
            if stores:
                self._version = SCHEMA_VERSION
        except BaseException as exc:
            self._codec = codec
            if self._conn.in_transaction:
                self._conn.rollback()
            if isinstance(exc, sqlite3.DatabaseError):  # disk full, I/O error, read-only file
                raise StoreWriteError(str(self.path), str(exc), articles) from exc
            raise

    # -- reading ----------------------------------------------------------------------------------
    @contextmanager
    def _read(self) -> Iterator[sqlite3.Cursor]:
        """A read transaction: every SELECT inside sees the same committed snapshot."""
        with self._lock:
            cur = self._conn.cursor()
            try:
                cur.execute("BEGIN")
                yield cur
            except sqlite3.Error as exc:
                raise sqlite_file.read_error(self.path, exc) from exc
            finally:
                if self._conn.in_transaction:
                    self._conn.rollback()

    def fingerprints(self, article_ids: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        with self._read() as cur:
            for chunk in _chunks(list(article_ids), 500):
                marks = ",".join("?" * len(chunk))
                sql = f"SELECT id, fingerprint FROM articles WHERE id IN ({marks})"
                out.update(cur.execute(sql, chunk).fetchall())
        return out

    def find_titles(self, title: str, n: int) -> list[ArticleHit]:
        popularity = (
            "(SELECT value FROM popularity p WHERE p.article = a.rowid)" if self._popularity else "NULL"
        )
        with self._read() as cur:
            rows = cur.execute(
                f"SELECT a.id, a.title, {popularity} FROM articles a WHERE a.title_key = ? ORDER BY a.id"
                " LIMIT ?",
                (title.strip().lower(), n),
            ).fetchall()
        return [ArticleHit(id_, found, float("inf"), pop) for id_, found, pop in rows]

    def closest_titles(self, subject: str, n: int) -> list[ArticleHit]:
        for pattern in title_patterns(subject):
            if found := self.list_titles(pattern, n):
                return found
        return []

    def subject_articles(self, subject: str, query: str, n: int) -> list[ArticleHit]:
        return self.find_titles(subject, n) or (self.search_articles(query, n) if query else [])

    def list_titles(self, pattern: str, n: int) -> list[ArticleHit]:
        # LIKE's own wildcards in the pattern stand for themselves.
        escaped = "".join("\\" + c if c in "%_\\" else c for c in pattern.strip().lower())
        with self._read() as cur:
            rows = cur.execute(
                "SELECT id, title FROM articles WHERE title_key LIKE ? ESCAPE '\\' ORDER BY title_key, id"
                " LIMIT ?",
                (f"%{escaped}%", n),
            ).fetchall()
        return [ArticleHit(id_, title, 0.0) for id_, title in rows]

    def search_articles(self, query: str, n: int) -> list[ArticleHit]:
        """Top ``n`` articles by Lucene BM25 summed over the unigram and bigram fields; ties by id."""
        unigrams, pairs = query_terms(query)
        if n <= 0 or not (unigrams or pairs):
            return []
        titles: dict[str, str] = {}
        with self._read() as cur:
            # The snapshot starts with this first read, before tantivy's searcher is taken or chosen (see
            # article_index): every article it holds is in that searcher.
            row = cur.execute(GENERATION).fetchone()

            def held(ids: list[str]) -> dict[str, int]:
                versions = {}
                for chunk in _chunks(ids, 500):
                    marks = ",".join("?" * len(chunk))
                    sql = f"SELECT id, title, ir_version FROM articles WHERE id IN ({marks})"
                    for aid, title, version in cur.execute(sql, chunk):
                        titles[aid], versions[aid] = title, version
                return versions

            ranked = self._ir.search(unigrams, pairs, n, held, None if row is None else str(row[0]))
        return [ArticleHit(aid, titles[aid], score) for aid, score in ranked]

    def _ir_versions(self, article_ids: Sequence[str]) -> dict[str, int]:
        """The committed tantivy version of each article SQLite holds."""
        out: dict[str, int] = {}
        with self._read() as cur:
            for chunk in _chunks(list(article_ids), 500):
                marks = ",".join("?" * len(chunk))
                sql = f"SELECT id, ir_version FROM articles WHERE id IN ({marks})"
                out.update(cur.execute(sql, chunk).fetchall())
        return out

    def knn(self, vector: np.ndarray, k: int, article_ids: Sequence[str] | None = None) -> Neighbors:
        """Exact k nearest contexts inside ``article_ids``; None searches all contexts with FAISS."""
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if article_ids is None:
            return self._flat_index().search(query, k)
        blocks = self._load_blocks(sorted(set(article_ids)))
        return exact_knn(query, k, blocks)

    def _load_blocks(self, article_ids: Sequence[str] | None) -> list[tuple[str, Block]]:
        """Context arrays per article, sorted by article id (None: every article).

        A partly encoded article gives one block per stored part: exact kNN breaks ties by article,
        sentence and position, so how an article's contexts are split does not change an answer.
        """
        columns = "a.id, c.vectors, c.token_ids, c.sentence_ids, c.starts, c.ends"
        where, args = "", []
        if article_ids is not None:
            where = f" WHERE a.id IN ({','.join('?' * len(article_ids))})"
            args = list(article_ids)
        sql = f"SELECT {columns} FROM contexts c JOIN articles a ON a.rowid = c.article{where}"
        if self._parts:
            parts = f"SELECT {columns} FROM context_parts c JOIN articles a ON a.rowid = c.article{where}"
            sql, args = f"{sql} UNION ALL {parts}", args * 2
        with self._read() as cur:
            rows = cur.execute(f"SELECT * FROM ({sql}) ORDER BY 1", args).fetchall()
        return [(row[0], self._block(*row)) for row in rows]

    def _block(self, article_id: str, vectors: bytes, *columns: bytes) -> Block:
        """One article's stored context arrays, checked: a damaged row is named, not a numpy error."""
        try:
            token_ids, sentence_ids, starts, ends = (np.frombuffer(c, dtype=np.int32) for c in columns)
            if not token_ids.size == sentence_ids.size == starts.size == ends.size:
                raise ValueError("its context arrays differ in length")
            decoded = codec.decode(vectors, token_ids.size, self._meta.dim, self._meta.store_dtype)
        except (ValueError, TypeError, IndexCorruptError) as exc:
            raise IndexCorruptError(
                f"index at {self.path}: the stored contexts of article {article_id!r} are damaged ({exc});"
                " add that article again or rebuild the index with ingest"
            ) from exc
        return {
            "vectors": decoded,
            "token_ids": token_ids,
            "sentence_ids": sentence_ids,
            "starts": starts,
            "ends": ends,
        }

    def _flat_index(self) -> FlatIndex:
        with self._read() as cur:
            row = cur.execute(GENERATION).fetchone()
        value = None if row is None else row[0]
        try:
            generation = int(value)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise IndexCorruptError(
                f"index at {self.path}: its generation counter is damaged ({value!r}); rebuild it with ingest"
            ) from exc
        if self._flat is None or self._flat.generation != generation:
            self._flat = FlatIndex.build(self._load_blocks(None), self._meta.dim, generation)
        return self._flat

    def sentences(self, refs: Sequence[tuple[str, int]]) -> list[str]:
        wanted = sorted({aid for aid, _ in refs})
        marks = ",".join("?" * len(wanted))
        sql = (
            "SELECT a.id, c.sentences, a.n_chars FROM contexts c JOIN articles a ON a.rowid = c.article"
            f" WHERE a.id IN ({marks})"
        )
        if self._parts:
            sql += (
                " UNION ALL SELECT a.id, v.sentences, a.n_chars FROM coverage v JOIN articles a"
                f" ON a.rowid = v.article WHERE a.id IN ({marks})"
            )
        with self._read() as cur:
            rows = cur.execute(sql, wanted * (2 if self._parts else 1)).fetchall()
            self._text_codec(cur)
        texts = {aid: self._sentence_list(aid, s, n) for aid, s, n in rows}
        return [texts[aid][i] if aid in texts and i < len(texts[aid]) else "" for aid, i in refs]

    def titles(self, article_ids: Sequence[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(article_ids))
        with self._read() as cur:
            marks = ",".join("?" * len(ids))
            return dict(cur.execute(f"SELECT id, title FROM articles WHERE id IN ({marks})", ids).fetchall())

    def stats(self) -> IndexStats:
        with self._read() as cur:
            articles, sentences, contexts = cur.execute(
                "SELECT COUNT(*), COALESCE(SUM(n_sentences), 0), COALESCE(SUM(n_contexts), 0) FROM articles"
            ).fetchone()
            encoded, held = cur.execute("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM contexts").fetchone()
            partial, partial_contexts, partial_bytes = (
                cur.execute(
                    "SELECT COUNT(*), COALESCE(SUM(encoded), 0), COALESCE(SUM(bytes), 0) FROM coverage"
                ).fetchone()
                if self._parts
                else (0, 0, 0)
            )
            chars, encoded_chars = cur.execute(
                "SELECT COALESCE(SUM(n_chars), 0), COALESCE(SUM(n_chars * (n_contexts > 0)), 0) FROM articles"
            ).fetchone()
        files = [p for p in self.path.iterdir() if p.name.startswith(DB_NAME)]
        size = sum(p.stat().st_size for p in [*files, *(self.path / IR_DIR).rglob("*")] if p.is_file())
        estimate = extrapolate(contexts, chars, encoded_chars, self._meta)
        return IndexStats(
            backend="embedded",
            location=str(self.path),
            articles=articles,
            sentences=sentences,
            contexts=contexts + partial_contexts,
            bytes_on_disk=size,
            meta=self._meta,
            encoded_articles=encoded,
            context_bytes=held + partial_bytes,
            estimated_contexts=max(estimate, contexts + partial_contexts),
            partial_articles=partial,
            partial_contexts=partial_contexts,
        )

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
