"""An input's stamp (its size and modification time), so that a re-run over a complete index ends at once.

Re-running ``ingest wiki`` resumes: every article already stored with the same fingerprint is skipped. It
still reads, decompresses and hashes the whole input to know which those are (21-29 s for a 50 MB
fragment, hours for a whole dump). After a run that read its input to the end (no ``--limit``, no error,
no Ctrl-C), the embedded index keeps a stamp of that input: its path, size and modification time, the
settings that decide the fingerprints, and how many articles the index then held. A later run whose input
and settings match the stamp, over an index that still holds that many articles (nothing added or deleted
since), has nothing to do and says so without reading. What the complete run said about the input (the
articles it skipped, each named in a warning line) is kept too and said again, so a re-run reads the same
whether it read the input or not.

An index on OpenSearch or Elasticsearch keeps no stamp (nothing local is tied to its lifetime: the
index can be dropped and rebuilt from elsewhere): a re-run there reads the input again.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from bertknn_search.config import Config

FILE = "input-stamp.json"
MAX_LINES = 1_000  # warning lines kept to say again; past these, how many more there were


@dataclass(frozen=True)
class Stamp:
    """What a complete run read, and what the index held after it."""

    input: str  # the input's absolute path
    size: int  # bytes (a folder: of all its files)
    mtime_ns: int  # the latest modification time (a folder: of any of its files)
    settings: str  # what decides the fingerprints and what is read
    articles: int  # articles the index held when the run ended


def of_input(source: Path, config: Config, fmt: str | None) -> Stamp | None:
    """The stamp ``source`` has now (``articles`` left 0); None where it cannot be read."""
    try:
        if source.is_dir():
            size, mtime = 0, source.stat().st_mtime_ns
            for root, _dirs, files in os.walk(source):
                for name in files:
                    info = (Path(root) / name).stat()
                    size, mtime = size + info.st_size, max(mtime, info.st_mtime_ns)
        else:
            info = source.stat()
            size, mtime = info.st_size, info.st_mtime_ns
    except OSError:
        return None
    settings = "\t".join(
        str(v)
        for v in (
            config.model,
            config.layer,
            config.mask_policy,
            config.max_length,
            config.contexts,
            config.store_dtype,
            config.max_article_bytes,
            fmt or "",
        )
    )
    return Stamp(str(source.resolve()), size, mtime, settings, 0)


def place(config: Config) -> Path | None:
    """Where the index ``config`` names keeps its stamp: inside an embedded index's folder; None on an
    engine."""
    return config.index / FILE if config.backend == "embedded" else None


@dataclass(frozen=True)
class Replay:
    """What the complete run said and counted about its input, to say and count again."""

    articles: int
    counts: dict[str, int]  # IngestSummary fields: empty, duplicates, too_large, unstorable, unparsed
    lines: list[str]  # its warning lines, in order (at most MAX_LINES, then one saying how many more)


def unchanged(source: Path, config: Config, fmt: str | None, stored: int) -> Replay | None:
    """What a complete run that read ``source`` as it is now, with these settings, into an index that
    still holds the ``stored`` articles it held then, said and counted; None when there was none."""
    where = place(config)
    now = of_input(source, config, fmt)
    if where is None or now is None or stored == 0:
        return None
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
        kept = Stamp(**data["stamp"])
        replay = Replay(stored, {str(k): int(v) for k, v in data["counts"].items()}, list(data["lines"]))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return replay if kept == Stamp(now.input, now.size, now.mtime_ns, now.settings, stored) else None


def record(
    source: Path, config: Config, fmt: str | None, stored: int, counts: dict[str, int], lines: list[str]
) -> None:
    """Keep the stamp of a complete run, with what it counted and said (a failure to write it costs only
    the next run's read)."""
    where = place(config)
    now = of_input(source, config, fmt)
    if where is None or now is None:
        return
    kept = lines[:MAX_LINES]
    if len(lines) > MAX_LINES:
        kept.append(f"... and {len(lines) - MAX_LINES:,} more warnings, said by the run that read {source}")
    body = {"stamp": asdict(Stamp(**{**asdict(now), "articles": stored})), "counts": counts, "lines": kept}
    temp = where.with_name(f".{FILE}.{os.getpid()}")
    with contextlib.suppress(OSError):
        temp.write_text(json.dumps(body), encoding="utf-8")
        os.replace(temp, where)


def forget(config: Config) -> None:
    """Drop the stamp: a run that stops early leaves the index short of what its input holds."""
    where = place(config)
    if where is not None:
        with contextlib.suppress(OSError):
            where.unlink()


def stored_now(config: Config) -> tuple[int, str] | None:
    """The articles the index holds and its location, before a run writes; None where there is no index
    yet (or it cannot be opened: the run itself then says why)."""
    from bertknn_search.backends import open_backend
    from bertknn_search.errors import BertKnnError

    try:
        backend = open_backend(config)
    except BertKnnError:
        return None
    try:
        return backend.stats().articles, backend.location
    except BertKnnError:
        return None
    finally:
        with contextlib.suppress(BertKnnError):
            backend.close()
