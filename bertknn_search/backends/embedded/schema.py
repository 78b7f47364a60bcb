"""The embedded store's SQLite schema, its versions, and how an index's metadata is read back."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bertknn_search.backends.embedded import sqlite_file
from bertknn_search.backends.embedded.parts import PART_TABLES
from bertknn_search.errors import IndexCorruptError, IndexIncompleteError
from bertknn_search.records import IndexMeta

DB_NAME = sqlite_file.DB_NAME
SCHEMA_VERSION = "5"  # 2: accent-folded terms, max_length; 3: tantivy, lazy contexts; 4: precision;
# 5: texts and sentences stored zstd-compressed (text_codec), and whole-word values (a negative hash beside
# token ids, see values.py) under the whole-word policies. The versions this code opens: a "4" index
# holds plain TEXT rows, which are read as they are, and becomes "5" at its first write that stores text or
# contexts (rows then mix).
READABLE_VERSIONS = ("4", SCHEMA_VERSION)
# How a stored text is checked against its article's row (``_article_text``): an article of n characters
# holds at most 4n bytes of UTF-8, and its sentence list's JSON at most 6 bytes a character (an escaped
# control character) and 4 a sentence (its quotes and separator); this bound is looser still.
UTF8_BYTES_PER_CHAR = 4
SENTENCES_BYTES_PER_CHAR = 16
SENTENCES_SLACK = 4096
DICTIONARY_KEY = "text_dictionary"  # meta: the zstd dictionary trained on the first large write
POPULARITY_TABLE = (
    "CREATE TABLE IF NOT EXISTS popularity"
    " (article INTEGER PRIMARY KEY REFERENCES articles(rowid), value REAL NOT NULL)"
)
GENERATION = "SELECT value FROM meta WHERE key = 'generation'"  # +1 by every write of articles

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS articles (
    rowid INTEGER PRIMARY KEY,
    id TEXT UNIQUE NOT NULL,
    title TEXT NOT NULL,
    title_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    n_sentences INTEGER NOT NULL,
    n_contexts INTEGER NOT NULL,
    ir_version INTEGER NOT NULL,
    n_chars INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS articles_title ON articles(title_key);
CREATE TABLE IF NOT EXISTS popularity (
    article INTEGER PRIMARY KEY REFERENCES articles(rowid),
    value REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS contexts (
    article INTEGER PRIMARY KEY REFERENCES articles(rowid),
    sentences TEXT NOT NULL,
    vectors BLOB NOT NULL,
    token_ids BLOB NOT NULL,
    sentence_ids BLOB NOT NULL,
    starts BLOB NOT NULL,
    ends BLOB NOT NULL,
    used REAL NOT NULL DEFAULT 0,
    bytes INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS contexts_used ON contexts(used);
-- A lazy index keeps each article's text until (and after) its contexts are encoded.
CREATE TABLE IF NOT EXISTS texts (
    article INTEGER PRIMARY KEY REFERENCES articles(rowid),
    text TEXT NOT NULL
);
"""
    + PART_TABLES
)


def read_meta(conn: sqlite3.Connection, path: Path) -> IndexMeta:
    try:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        rows = dict(conn.execute("SELECT key, value FROM meta").fetchall()) if "meta" in tables else {}
        if "schema_version" not in rows:
            if "articles" in tables and conn.execute("SELECT EXISTS (SELECT 1 FROM articles)").fetchone()[0]:
                raise IndexCorruptError(
                    f"index at {path} cannot be read (it holds articles but no metadata): it is damaged;"
                    " restore it from a backup or ingest again into a new --index"
                )
            # Only an older version could publish a file before its metadata; it holds no data.
            raise IndexIncompleteError(
                f"index at {path} was never completely created (an ingest stopped while creating it);"
                " run 'bertknn-search ingest wiki' again to create it"
            )
        if rows["schema_version"] not in READABLE_VERSIONS:
            raise IndexCorruptError(
                f"index at {path} has schema version {rows['schema_version']!r}, this version of"
                f" bertknn-search reads {' and '.join(READABLE_VERSIONS)}; ingest again into a new --index"
            )
        return IndexMeta(
            model=rows["model"],
            layer=int(rows["layer"]),
            dim=int(rows["dim"]),
            vocab_size=int(rows["vocab_size"]),
            mask_policy=rows["mask_policy"],
            store_dtype=rows["store_dtype"],
            max_length=int(rows["max_length"]),
            contexts=rows["contexts"],
            precision=rows["precision"],
            splitter=rows.get("splitter", ""),  # absent in indexes made before it was recorded
            no_ir_graph=rows.get("no_ir_graph") == "True",  # likewise; written as str(bool)
        )
    except sqlite3.Error as exc:
        raise sqlite_file.read_error(path, exc) from exc
    except (KeyError, ValueError) as exc:
        raise IndexCorruptError(
            f"index at {path} cannot be read (its metadata lacks or garbles {exc}): it is damaged;"
            " restore it from a backup or rebuild it with ingest"
        ) from exc
