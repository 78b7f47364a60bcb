"""Corpus readers: MediaWiki XML dumps, JSON Lines, parquet and WikiExtractor output -> Article records."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where a parquet file is read: pyarrow costs every other start ~0.3 s
    import pyarrow as pa
    import pyarrow.parquet as pq

from bertknn_search.config import MAX_ARTICLE_BYTES
from bertknn_search.errors import ConfigError, InputFormatError
from bertknn_search.ingest.input_files import (
    InputMeter,
    Noted,
    Record,
    _article,
    _Bound,
    _check_exists,
    _errors,
    _Line,
    _lines,
    _open,
    warn,
)
from bertknn_search.ingest.xml_dump import _read_xml
from bertknn_search.records import Article

FORMATS = ("xml", "jsonl", "parquet", "wikiextractor")
SUPPORTED = (
    "MediaWiki XML dump (.xml, .xml.bz2), JSON Lines with id/title/text (.jsonl, .json), "
    "parquet with id/title/text columns (.parquet), WikiExtractor output (<doc> blocks); "
    "all but parquet also compressed (.bz2, .gz, .xz)"
)
_BY_SUFFIX = {".xml": "xml", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
_FIELDS = ("id", "title", "text")
# An optional column: the article's popularity (page views), which the adaptive-retrieval gate reads.
POPULARITY = "popularity"
# A parquet row group is pyarrow's unit of reading, so its size (by the file's metadata) bounds what a
# file needs: at most this many articles of the limit, else the file is refused.
PARQUET_GROUP_ARTICLES = 256
_PARQUET_BATCH = 256  # rows

_DOC_START = re.compile(r'<doc\s+id="(?P<id>[^"]*)"(?:\s+url="[^"]*")?\s+title="(?P<title>.*)">\s*$')


def read_articles(
    path: Path | str,
    limit: int | None = None,
    fmt: str | None = None,
    *,
    max_bytes: int = MAX_ARTICLE_BYTES,
    on_skip: Callable[[str], None] = warn,
    on_unparsed: Callable[[str], None] = warn,
) -> Iterator[Article]:
    """Stream the articles of a corpus file, or of every file under a directory (sorted by path).

    Redirects and pages outside the article namespace of XML dumps are skipped; wiki markup is
    reduced to plain prose with one paragraph per line. Articles whose text is empty are still
    yielded, so the caller can count them. A missing path or a file of unknown format fails at
    once; anything wrong inside a file surfaces while iterating, after the articles before it.

    An article longer than ``max_bytes`` (its JSONL line, XML page's wikitext or WikiExtractor
    ``<doc>`` body, each as read; a parquet text value) is read in pieces, never held whole, and
    skipped: ``on_skip`` gets one line naming it, and reading goes on. Memory stays bounded whatever a
    compressed file (bz2, gzip, xz) expands to; a parquet row group is read whole, and is refused when
    its metadata says it holds more than ``PARQUET_GROUP_ARTICLES`` articles of ``max_bytes``.

    An XML page's markup is parsed under a bound of time, isolated from crashes of the parser
    (``page_parse.page_text``); a page the parser cannot take gets the plain fallback's text, and
    ``on_unparsed`` one line naming it.

    Args:
        path: a file, or a directory read recursively (hidden files skipped), each file in its own format.
        limit: stop after this many articles (skipped ones do not count).
        fmt: one of ``FORMATS`` to skip detection (applies to every file of a directory).
        max_bytes: the most bytes one article may hold.
        on_skip: called with a one-line message for each article skipped for its size.
        on_unparsed: called with a one-line message for each page whose markup the fallback stripped.

    Returns:
        An iterator of articles; ``id`` is the page id as a string, ``title`` and ``text`` are stripped.

    Raises:
        InputFormatError: the path is missing, the format unknown, or a file is truncated, corrupt,
            not UTF-8, malformed or lacks id/title/text; an article has an empty title or text that is
            not valid Unicode (an escaped lone surrogate); an XML file holds a tag or comment longer than
            ``max_bytes``, elements nested past any dump or more namespace prefixes than one declares
            (``_MAX_NAMESPACES``), or a parquet row group is over its bound. The message is one line
            naming the file.
        ConfigError: ``limit`` is negative or ``max_bytes`` not positive.
    """
    records = read_records(path, limit, fmt, max_bytes=max_bytes, on_skip=on_skip)
    return (finish(record, on_unparsed) for record in records)


def read_records(
    path: Path | str,
    limit: int | None = None,
    fmt: str | None = None,
    *,
    max_bytes: int = MAX_ARTICLE_BYTES,
    on_skip: Callable[[str], None] = warn,
    meter: InputMeter | None = None,
) -> Iterator[Record]:
    """``read_articles`` with each article's own work left to ``finish``: the records come in the same
    order and count (redirects, other namespaces and articles over ``max_bytes`` are skipped here), and
    ``finish`` raises the errors ``read_articles`` would for that record. Reading a file stays
    sequential; finishing can be parallel.

    Raises:
        InputFormatError, ConfigError: as ``read_articles``, for the path and the file as a whole.
    """
    path = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise InputFormatError(f"{path}: unknown format {fmt!r} asked for; use one of {', '.join(FORMATS)}")
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be 0 or more, not {limit}")
    if max_bytes < 1:
        raise ConfigError(f"max_bytes must be 1 or more, not {max_bytes}")
    _check_exists(path)
    bound = _Bound(max_bytes, on_skip, meter)
    if path.is_dir():
        return islice(_read_directory(path, fmt, bound), limit)
    return islice(_READERS[fmt or detect_format(path)](path, bound), limit)


def finish(record: Record, on_unparsed: Callable[[str], None] = warn) -> Article:
    """The article of a record from ``read_records``; ``on_unparsed`` hears of pages the fallback stripped."""
    article, note = finish_noted(record)
    if note is not None:
        on_unparsed(note)
    return article


def finish_noted(record: Record) -> tuple[Article, str | None]:
    """``finish``, with the line to say about the article (None: nothing), for a caller to say later."""
    if isinstance(record, Article):
        return record, None
    make, args = record
    made = make(*args)
    return (made.article, made.note) if isinstance(made, Noted) else (made, None)


def record_size(record: Record) -> int:
    """About how many characters a record holds (its text, line or wikitext), for sizing batches."""
    if isinstance(record, Article):
        return len(record.text)
    return len(record[1][-1])


def detect_format(path: Path | str) -> str:
    """Name the format of a corpus file: by its suffix (under .bz2/.gz), else by its first bytes.

    Args:
        path: a corpus file or directory.

    Returns:
        One of ``FORMATS``, or ``"directory"`` for a directory.

    Raises:
        InputFormatError: the path is missing, unreadable, or in none of the supported formats.
    """
    path = Path(path)
    _check_exists(path)
    if path.is_dir():
        return "directory"
    name = path.name.lower()
    for packed in (".bz2", ".gz", ".xz"):
        name = name.removesuffix(packed)
    if Path(name).suffix in _BY_SUFFIX:
        return _BY_SUFFIX[Path(name).suffix]
    with _errors(path), _open(path) as stream:
        head = stream.read(4096)
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"PAR1"):
        return "parquet"
    if start.startswith(b"<doc "):
        return "wikiextractor"
    if start.startswith((b"<?xml", b"<mediawiki")):
        return "xml"
    if start.startswith(b"{"):
        return "jsonl"
    raise InputFormatError(f"{path}: unknown corpus format; supported: {SUPPORTED}; or pass the format")


def _read_directory(root: Path, fmt: str | None, bound: _Bound) -> Iterator[Record]:
    files = sorted(p for p in root.rglob("*") if p.is_file() and not _hidden(p.relative_to(root)))
    if not files:
        raise InputFormatError(f"{root}: the directory holds no corpus files; check the path")
    for file in files:
        yield from _READERS[fmt or detect_format(file)](file, bound)


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)  # .DS_Store, .git: never corpus files


def _read_jsonl(path: Path, bound: _Bound) -> Iterator[Record]:
    with _errors(path), _open(path, bound.meter) as stream:
        for line in _lines(path, stream, bound.max_bytes):
            if line.text is None:
                bound.skip(path, f"line {line.number}", line.size)
            elif line.text.strip():
                yield _json_line, (path, line.number, line.text)


def _json_line(path: Path, number: int, line: str) -> Article:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputFormatError(
            f"{path}: line {number} is not JSON ({exc.msg}, column {exc.colno}); "
            "each line must be one object with id, title and text"
        ) from exc
    return _record(path, f"line {number}", row)


def _read_parquet(path: Path, bound: _Bound) -> Iterator[Article]:
    import pyarrow.parquet as pq

    with _errors(path):
        table = pq.ParquetFile(path)
        missing = [name for name in _FIELDS if name not in table.schema_arrow.names]
        if missing:
            raise InputFormatError(
                f"{path}: parquet file lacks column(s) {', '.join(missing)}; it needs id, title and text"
            )
        row = 0
        names = [*_FIELDS, POPULARITY] if POPULARITY in table.schema_arrow.names else list(_FIELDS)
        cap = PARQUET_GROUP_ARTICLES * bound.max_bytes
        for group in range(table.metadata.num_row_groups):
            size = _group_bytes(table.metadata.row_group(group), names)
            if size > cap:
                raise InputFormatError(
                    f"{path}: row group {group + 1} holds {size:,} bytes of {', '.join(names)}, more than"
                    f" {cap:,} ({PARQUET_GROUP_ARTICLES} articles of --max-article-bytes), and a row group"
                    " is read whole: write the file with smaller row groups (row_group_size=1000)"
                )
            # One stored value may stand for many rows (a dictionary page): fewer rows a batch keep a
            # batch's Python strings within the cap too.
            rows = max(1, min(_PARQUET_BATCH, cap // max(size, 1)))
            for batch in table.iter_batches(batch_size=rows, row_groups=[group], columns=names):
                sizes = _text_bytes(batch.column("text"))
                columns = [_short_texts(batch, name, sizes, bound.max_bytes).to_pylist() for name in names]
                for values, text_size in zip(zip(*columns), sizes):
                    row += 1
                    record = dict(zip(names, values))
                    if text_size > bound.max_bytes:
                        bound.skip(path, f"row {row} (id {record['id']}, {record['title']!r})", text_size)
                    else:
                        yield _record(path, f"row {row}", record)


def _group_bytes(group: pq.RowGroupMetaData, names: list[str]) -> int:
    """Uncompressed bytes of the columns ``names`` in one row group, by the file's metadata."""
    chunks = (group.column(i) for i in range(group.num_columns))
    return sum(chunk.total_uncompressed_size for chunk in chunks if chunk.path_in_schema in names)


def _text_bytes(column: pa.Array) -> list[int]:
    """UTF-8 bytes of each value, from the array's offsets (nothing copied); 0 for a non-string column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return [0] * len(column)
    return pc.fill_null(pc.binary_length(column), 0).to_pylist()


def _short_texts(batch: pa.RecordBatch, name: str, sizes: list[int], max_bytes: int) -> pa.Array:
    """Column ``name`` of the batch; for "text", over-long values made null so no Python string holds them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = batch.column(name)
    if name != "text" or max(sizes, default=0) <= max_bytes:
        return column
    return pc.if_else(pa.array([size > max_bytes for size in sizes]), pa.scalar(None, column.type), column)


@dataclass
class _Doc:
    """A <doc> being read: its header, and its body lines up to the limit; past it only counted."""

    id: str
    title: str
    opened: int  # its line number
    body: list[str] = field(default_factory=list)
    size: int = 0  # bytes of the body as read, held or not

    def add(self, line: _Line, max_bytes: int) -> None:
        self.size += line.size
        if self.size > max_bytes:
            self.body.clear()
        elif line.text is not None:
            self.body.append(line.text.strip())


def _read_extracted(path: Path, bound: _Bound) -> Iterator[Article]:
    with _errors(path), _open(path, bound.meter) as stream:
        doc: _Doc | None = None
        for line in _lines(path, stream, bound.max_bytes):
            text = line.text or ""  # an over-long line is neither a header nor an end
            start = _DOC_START.match(text) if text.startswith("<doc") else None
            if start and doc is not None:
                raise InputFormatError(
                    f"{path}: line {line.number} opens a <doc> inside the <doc> of line {doc.opened}"
                )
            if start:
                doc = _Doc(start["id"], start["title"], line.number)
            elif doc is None:
                if line.text is None or text.strip():
                    raise InputFormatError(
                        f"{path}: line {line.number} is outside any <doc>; not WikiExtractor output?"
                    )
            elif text.strip() == "</doc>":
                if doc.size > bound.max_bytes:
                    bound.skip(path, f"the <doc> of line {doc.opened} (id {doc.id}, {doc.title!r})", doc.size)
                else:
                    yield _extracted_article(path, doc.opened, doc.id, doc.title, doc.body)
                doc = None
            else:
                doc.add(line, bound.max_bytes)
        if doc is not None:
            raise InputFormatError(f"{path}: the <doc> of line {doc.opened} is never closed; file truncated?")


_READERS: dict[str, Callable[[Path, _Bound], Iterator[Record]]] = {
    "xml": _read_xml,
    "jsonl": _read_jsonl,
    "parquet": _read_parquet,
    "wikiextractor": _read_extracted,
}


def _extracted_article(path: Path, opened: int, doc_id: str, title: str, body: list[str]) -> Article:
    lines = [line for line in body if line]
    if lines and lines[0] == title.strip():
        lines = lines[1:]  # WikiExtractor repeats the title as the first line
    return _article(path, f"the <doc> of line {opened}", doc_id.strip(), title, "\n".join(lines))


def _record(path: Path, where: str, row: Any) -> Article:
    if not isinstance(row, dict):
        raise InputFormatError(f"{path}: {where} is not an object; it needs id, title and text")
    missing = [name for name in _FIELDS if name not in row]
    if missing:
        raise InputFormatError(
            f"{path}: {where} lacks {', '.join(missing)}; articles need id, title and text"
        )
    doc_id, title, text = row["id"], row["title"], row["text"]
    if isinstance(doc_id, bool) or not isinstance(doc_id, (int, str)) or not str(doc_id).strip():
        raise InputFormatError(f"{path}: {where} has id {doc_id!r}; use a non-empty string or an integer")
    if not isinstance(title, str) or not isinstance(text, str):
        raise InputFormatError(f"{path}: {where} has a title or text that is not a string")
    article = _article(path, where, str(doc_id).strip(), title, text)
    popularity = row.get(POPULARITY)
    if popularity is None:
        return article
    number = isinstance(popularity, int | float) and not isinstance(popularity, bool)
    if not number or not 0 <= popularity < math.inf:
        raise InputFormatError(
            f"{path}: {where} has popularity {popularity!r}; use a number >= 0 (page views) or leave it out"
        )
    return Article(article.id, article.title, article.text, float(popularity))
