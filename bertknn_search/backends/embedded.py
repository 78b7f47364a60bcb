"""EmbeddedBackend: one SQLite file holding articles and float16 context blocks, and a tantivy article index.

Needs no server. Every write is one SQLite transaction in WAL mode, so readers in other processes keep
answering from the last committed state while an ``add`` runs, and a crash never leaves half an article.
The BM25 article index beside it (``article_index``) is kept in step with SQLite as that module describes.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np

from bertknn_search.backends import codec
from bertknn_search.backends.article_index import ArticleIndex, field_texts
from bertknn_search.backends.base import check_meta
from bertknn_search.backends.blocks import Block, FlatIndex, exact_knn
from bertknn_search.errors import BackendError, IndexCorruptError, IndexMismatchError, IndexNotFoundError
from bertknn_search.records import ArticleHit, EncodedArticle, IndexMeta, IndexStats, Neighbors
from bertknn_search.terms import query_terms

DB_NAME = "index.sqlite"
SCHEMA_VERSION = "3"  # 2: accent-folded IR terms, max_length in the meta; 3: tantivy article index

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS articles (
    rowid INTEGER PRIMARY KEY,
    id TEXT UNIQUE NOT NULL,
    title TEXT NOT NULL,
    title_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    n_sentences INTEGER NOT NULL,
    n_contexts INTEGER NOT NULL,
    ir_version INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS articles_title ON articles(title_key);
CREATE TABLE IF NOT EXISTS contexts (
    article INTEGER PRIMARY KEY REFERENCES articles(rowid),
    sentences TEXT NOT NULL,
    vectors BLOB NOT NULL,
    token_ids BLOB NOT NULL,
    sentence_ids BLOB NOT NULL,
    starts BLOB NOT NULL,
    ends BLOB NOT NULL
);
"""


class EmbeddedBackend:
    """The default backend: a directory holding ``index.sqlite``."""

    name = "embedded"

    def __init__(self, path: Path, conn: sqlite3.Connection, meta: IndexMeta, ir: ArticleIndex) -> None:
        self.path = path
        self._conn = conn
        self._meta = meta
        self._ir = ir
        self._lock = threading.RLock()  # the ingest writer thread shares the connection
        self._flat: FlatIndex | None = None
        ir.recover(self._ir_versions)

    # -- opening ----------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: Path, meta: IndexMeta) -> EmbeddedBackend:
        """Open the index at ``path``, creating it with ``meta`` if it does not exist yet."""
        path = Path(path)
        if (path / DB_NAME).exists():
            backend = cls.open(path)
            check_meta(backend.meta(), meta, str(path))
            return backend
        if path.exists() and not path.is_dir():
            raise IndexCorruptError(f"{path} is a file, not an index directory; choose another --index")
        try:
            path.mkdir(parents=True, exist_ok=True)
            ir = ArticleIndex.create(path)  # before SQLite: an index with a database has both
            conn = _connect(path / DB_NAME)
            conn.executescript(SCHEMA)
            values = {**{k: str(v) for k, v in asdict(meta).items()}, "schema_version": SCHEMA_VERSION}
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", values.items())
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('generation', '0')")
            conn.execute("COMMIT")
        except (OSError, sqlite3.Error) as exc:
            raise BackendError(f"cannot create index at {path}: {exc}") from exc
        return cls(path, conn, meta, ir)

    @classmethod
    def open(cls, path: Path) -> EmbeddedBackend:
        """Open an existing index.

        Raises:
            IndexNotFoundError: nothing at ``path``.
            IndexCorruptError: ``path`` holds something that is not a readable index.
        """
        path = Path(path)
        db = path / DB_NAME
        if not db.exists():
            if path.exists():
                raise IndexCorruptError(f"{path} is not a bertknn-search index (no {DB_NAME}); check --index")
            raise IndexNotFoundError(f"no index at {path}; build one with 'bertknn-search ingest wiki'")
        try:
            conn = _connect(db)
            rows = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            if rows.get("schema_version") != SCHEMA_VERSION:
                raise IndexCorruptError(
                    f"index at {path} has schema version {rows.get('schema_version')!r}, this version of"
                    f" bertknn-search reads {SCHEMA_VERSION}; ingest again into a new --index"
                )
            meta = IndexMeta(
                model=rows["model"],
                layer=int(rows["layer"]),
                dim=int(rows["dim"]),
                vocab_size=int(rows["vocab_size"]),
                mask_policy=rows["mask_policy"],
                store_dtype=rows["store_dtype"],
                max_length=int(rows["max_length"]),
            )
        except (sqlite3.Error, KeyError, ValueError) as exc:
            raise IndexCorruptError(
                f"index at {path} cannot be read ({exc}); rebuild it with ingest"
            ) from exc
        return cls(path, conn, meta, ArticleIndex.open(path))

    @property
    def location(self) -> str:
        return str(self.path)

    def meta(self) -> IndexMeta:
        return self._meta

    # -- writing ----------------------------------------------------------------------------------
    def add_articles(self, items: Sequence[EncodedArticle]) -> None:
        """Write or replace ``items`` in one transaction: all of them become visible at once."""
        items = list({item.article.id: item for item in items}.values())  # an id given twice: the last
        if not items:
            return
        fields = [field_texts(item.article.title, item.article.text) for item in items]  # before locking
        with self._lock, self._ir.writing(self._ir_versions, len(items)) as batch, self._write() as cur:
            for item, item_fields in zip(items, fields):
                batch.add(item.article.id, item_fields, replaces=self._write_one(cur, item, batch.version))
            cur.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'generation'")
            batch.commit()  # tantivy first: an article SQLite holds is always in tantivy

    def _write_one(self, cur: sqlite3.Cursor, item: EncodedArticle, ir_version: int) -> bool:
        """Write one article's row and contexts; True when it replaced a stored article."""
        art, block = item.article, item.contexts
        if block.vectors.shape[1:] != (self._meta.dim,):
            raise IndexMismatchError(
                f"article {art.id!r} has vectors of shape {block.vectors.shape};"
                f" the index dimension is {self._meta.dim}"
            )
        replaced = cur.execute("SELECT 1 FROM articles WHERE id = ?", (art.id,)).fetchone() is not None
        row = (art.title, art.title.strip().lower(), item.fingerprint, len(block.sentences), len(block))
        cur.execute(
            "INSERT INTO articles (id, title, title_key, fingerprint, n_sentences, n_contexts, ir_version)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT(id) DO UPDATE SET title=excluded.title, title_key=excluded.title_key,"
            " fingerprint=excluded.fingerprint, n_sentences=excluded.n_sentences,"
            " n_contexts=excluded.n_contexts, ir_version=excluded.ir_version",
            (art.id, *row, ir_version),
        )
        rowid = cur.execute("SELECT rowid FROM articles WHERE id = ?", (art.id,)).fetchone()[0]
        cur.execute(
            "INSERT OR REPLACE INTO contexts VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                rowid,
                json.dumps(block.sentences, ensure_ascii=False),
                codec.encode(block.vectors, self._meta.store_dtype),
                block.token_ids.astype(np.int32).tobytes(),
                block.sentence_ids.astype(np.int32).tobytes(),
                block.starts.astype(np.int32).tobytes(),
                block.ends.astype(np.int32).tobytes(),
            ),
        )
        return replaced

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Cursor]:
        cur = self._conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
            yield cur
            cur.execute("COMMIT")
        except BaseException as exc:
            if self._conn.in_transaction:
                self._conn.rollback()
            if isinstance(exc, sqlite3.OperationalError):
                raise BackendError(
                    f"cannot write to index at {self.path}: {exc}; nothing was written"
                ) from exc
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
            except sqlite3.DatabaseError as exc:
                raise IndexCorruptError(f"index at {self.path} cannot be read: {exc}") from exc
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

    def find_title(self, title: str) -> ArticleHit | None:
        with self._read() as cur:
            row = cur.execute(
                "SELECT id, title FROM articles WHERE title_key = ? ORDER BY id LIMIT 1",
                (title.strip().lower(),),
            ).fetchone()
        return None if row is None else ArticleHit(row[0], row[1], float("inf"))

    def search_articles(self, query: str, n: int) -> list[ArticleHit]:
        """Top ``n`` articles by Lucene BM25 summed over the unigram and bigram fields; ties by id."""
        unigrams, pairs = query_terms(query)
        titles: dict[str, str] = {}
        with self._read() as cur:
            # The snapshot starts with this first read, before tantivy's searcher is taken (see
            # article_index): every article it holds is in that searcher.
            cur.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()

            def held(ids: list[str]) -> dict[str, int]:
                versions = {}
                for chunk in _chunks(ids, 500):
                    marks = ",".join("?" * len(chunk))
                    sql = f"SELECT id, title, ir_version FROM articles WHERE id IN ({marks})"
                    for aid, title, version in cur.execute(sql, chunk):
                        titles[aid], versions[aid] = title, version
                return versions

            ranked = self._ir.search(unigrams, pairs, n, held)
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
        """Context arrays per article, sorted by article id (None: every article)."""
        sql = (
            "SELECT a.id, c.vectors, c.token_ids, c.sentence_ids, c.starts, c.ends FROM contexts c"
            " JOIN articles a ON a.rowid = c.article"
        )
        args: list[str] = []
        if article_ids is not None:
            sql += f" WHERE a.id IN ({','.join('?' * len(article_ids))})"
            args = list(article_ids)
        dim, dtype = self._meta.dim, self._meta.store_dtype
        with self._read() as cur:
            rows = cur.execute(sql + " ORDER BY a.id", args).fetchall()
        return [
            (
                aid,
                {
                    "vectors": codec.decode(v, len(t) // 4, dim, dtype),
                    "token_ids": np.frombuffer(t, dtype=np.int32),
                    "sentence_ids": np.frombuffer(s, dtype=np.int32),
                    "starts": np.frombuffer(a, dtype=np.int32),
                    "ends": np.frombuffer(e, dtype=np.int32),
                },
            )
            for aid, v, t, s, a, e in rows
        ]

    def _flat_index(self) -> FlatIndex:
        with self._read() as cur:
            generation = int(cur.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()[0])
        if self._flat is None or self._flat.generation != generation:
            self._flat = FlatIndex.build(self._load_blocks(None), self._meta.dim, generation)
        return self._flat

    def sentences(self, refs: Sequence[tuple[str, int]]) -> list[str]:
        wanted = sorted({aid for aid, _ in refs})
        with self._read() as cur:
            marks = ",".join("?" * len(wanted))
            rows = cur.execute(
                f"SELECT a.id, c.sentences FROM contexts c JOIN articles a ON a.rowid = c.article"
                f" WHERE a.id IN ({marks})",
                wanted,
            ).fetchall()
        texts = {aid: json.loads(s) for aid, s in rows}
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
        size = sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())
        return IndexStats("embedded", str(self.path), articles, sentences, contexts, size, self._meta)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _connect(db: Path) -> sqlite3.Connection:
    # check_same_thread=False: the ingest pipeline writes from one background thread, under self._lock.
    conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False, timeout=60.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
