"""The SQLite file of the embedded index: atomic creation, opening (read-only volumes too), error kinds.

A new index file is built under a temporary name and linked into place complete, so a kill at any
moment leaves no index or a whole empty one. An index on a read-only volume is opened immutable;
errors say whether the file is damaged or only cannot be reached, so a good index is never called
corrupt.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from bertknn_search.errors import BackendError, BertKnnError, IndexCorruptError, IndexNotFoundError

DB_NAME = "index.sqlite"
BUILD_PREFIX = ".index.sqlite.new-"  # a new index file under construction: <prefix><pid>-<random>


def connect(db: Path) -> tuple[sqlite3.Connection, str]:
    """A connection to ``db``, and why it is read-only ("" when it may write)."""
    why = _why_read_only(db)
    conn: sqlite3.Connection | None = None
    try:
        if why:
            return _connect_read_only(db), why
        conn = _sqlite(str(db))
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn, ""
    except sqlite3.Error as exc:
        if conn is not None:
            conn.close()
        raise read_error(db.parent, exc) from exc


def _sqlite(target: str, uri: bool = False) -> sqlite3.Connection:
    # check_same_thread=False: the ingest pipeline writes from one background thread, under self._lock.
    return sqlite3.connect(target, uri=uri, isolation_level=None, check_same_thread=False, timeout=60.0)


def _connect_read_only(db: Path) -> sqlite3.Connection:
    """Open ``db`` without writing anything, on a read-only volume too.

    A WAL database is read through its shared-memory file (``-shm``), which SQLite must be able to
    create; on a read-only volume it cannot, and the file is opened as immutable instead, which is
    exact there because nothing can change it.
    """
    uri = db.resolve().as_uri()
    conn = _sqlite(f"{uri}?mode=ro", uri=True)
    try:
        conn.execute("PRAGMA schema_version").fetchone()  # the first read is where -shm is needed
        return conn
    except sqlite3.OperationalError as exc:
        conn.close()
        where = db.parent
        if not _read_only_volume(where):
            raise BackendError(
                f"cannot open the index at {where} read-only ({exc}): SQLite must create {db.name}-shm"
                f" beside it and this user cannot write {where}; give it write access there, or serve"
                " the index from a read-only mount"
            ) from exc
        wal = db.with_name(db.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise BackendError(
                f"the index at {where} is on a read-only volume with writes still in {wal.name} but no"
                f" {db.name}-shm to read them with; open it once where it is writable (for example"
                " 'bertknn-search stats'), then copy it again"
            ) from exc
    return _sqlite(f"{uri}?mode=ro&immutable=1", uri=True)


def _why_read_only(db: Path) -> str:
    if _read_only_volume(db.parent):
        return "a read-only volume"
    if not (os.access(db.parent, os.W_OK) and os.access(db, os.W_OK)):
        return "no write permission"
    return ""


def _read_only_volume(directory: Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except (AttributeError, OSError):  # no statvfs (Windows): permissions decide alone
        return False


def read_error(path: Path, exc: sqlite3.Error) -> BertKnnError:
    """Damage (not a database, malformed, tables missing) or an obstacle that leaves the index intact."""
    message = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and not message.startswith(("no such table", "no such col")):
        return BackendError(f"cannot read the index at {path}: {message}; the index itself may be fine")
    return IndexCorruptError(
        f"index at {path} cannot be read ({message}): it is damaged; restore it from a backup or rebuild"
        " it with ingest"
    )


def missing_index(path: Path, parts: Sequence[str] = ()) -> BertKnnError:
    """The error for a ``path`` without an index file: nothing there yet, or something else.

    ``parts`` name the other files an index directory holds (made before the SQLite file), so a
    directory holding only those and unfinished builds is an index whose creation is still to finish.
    """

    def ours(p: Path) -> bool:
        return p.name.startswith(BUILD_PREFIX) or p.name in parts

    if path.exists() and not (path.is_dir() and all(ours(p) for p in path.iterdir())):
        return IndexCorruptError(f"{path} is not a bertknn-search index (no {DB_NAME}); check --index")
    return IndexNotFoundError(f"no index at {path}; build one with 'bertknn-search ingest wiki'")


def publish(db: Path, schema: str, meta: dict[str, str]) -> None:
    """Build an empty index under a temporary name, then link it into place as ``db`` in one step.

    A link (unlike a rename) never replaces a file: when two processes create the same index, the
    first one's stays and the second opens it.

    Args:
        db: where the index file goes; its directory exists.
        schema: SQL that creates the tables (it must create ``meta (key, value)``).
        meta: the rows of ``meta``, committed before the file is linked into place.
    """
    if not db.exists():
        # The log of a deleted index would be replayed into the new file: it belongs to no database now.
        for leftover in _sidecars(db):
            leftover.unlink(missing_ok=True)
    build = db.with_name(f"{BUILD_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        conn = sqlite3.connect(build, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")  # recorded in the file: every later opener uses it
            conn.executescript(schema)
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta.items())
            conn.execute("COMMIT")
        finally:
            conn.close()  # the last connection merges the WAL into the file and removes it
        _fsync(build)
        try:
            os.link(build, db)
        except FileExistsError:
            pass  # another process created it meanwhile; the caller opens that one and checks its meta
        except OSError:
            if not db.exists():  # a file system without hard links
                os.replace(build, db)
        with contextlib.suppress(OSError):  # not every system can open a directory to sync it
            _fsync(db.parent)
    finally:
        for leftover in (build, *_sidecars(build)):
            leftover.unlink(missing_ok=True)


def _sidecars(db: Path) -> list[Path]:
    return [db.with_name(db.name + suffix) for suffix in ("-wal", "-shm", "-journal")]


def discard(db: Path) -> None:
    """Remove an index file that was never completely created, with its WAL and shared memory."""
    for f in (db, *_sidecars(db)):
        f.unlink(missing_ok=True)


def remove_abandoned_builds(directory: Path) -> None:
    """Delete the files of creations that were killed (their process is gone)."""
    for f in directory.glob(BUILD_PREFIX + "*"):
        pid = f.name[len(BUILD_PREFIX) :].split("-")[0]
        if pid.isdigit() and not _running(int(pid)):
            with contextlib.suppress(OSError):  # a read-only volume: they stay, harmless
                f.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    if os.name != "posix":
        return True  # no cheap, harmless way to ask: keep the file
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists but belongs to another user
    return True


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
