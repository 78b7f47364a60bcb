"""Corpus readers: MediaWiki XML dumps, JSON Lines, parquet and WikiExtractor output -> Article records."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import math
import re
import sys
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NamedTuple
from xml.parsers import expat

if TYPE_CHECKING:  # imported where a parquet file is read: pyarrow costs every other start ~0.3 s
    import pyarrow as pa
    import pyarrow.parquet as pq

from bertknn_search.config import MAX_ARTICLE_BYTES
from bertknn_search.errors import ConfigError, InputFormatError
from bertknn_search.ingest.page_parse import page_text
from bertknn_search.records import Article
from bertknn_search.textcheck import describe_unencodable, first_unencodable

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
# An over-long line or XML text is read and dropped this many bytes at a time, never held whole.
_PIECE = 64 * 1024
# A parquet row group is pyarrow's unit of reading, so its size (by the file's metadata) bounds what a
# file needs: at most this many articles of the limit, else the file is refused.
PARQUET_GROUP_ARTICLES = 256
_PARQUET_BATCH = 256  # rows
# How an XML text that is dropped for its size still tells a redirect: by how it starts.
_HEAD = 64
# A dump nests 5 deep; expat keeps every open element, so nesting is bounded as text is.
_MAX_DEPTH = 100
# A dump declares 2 namespace prefixes, on its root. Expat keeps each declaration while its element is
# open and each prefix's name to the end: 95 nested elements of 70,000 prefixes each (a 16 MB .bz2) held
# 1.3 GB. So prefixes in scope at once, and different prefixes in a file, are bounded.
_MAX_NAMESPACES = 100

_REDIRECT = re.compile(r"\s*#redirect", re.I)
_DOC_START = re.compile(r'<doc\s+id="(?P<id>[^"]*)"(?:\s+url="[^"]*")?\s+title="(?P<title>.*)">\s*$')


def warn(message: str) -> None:
    """Say on stderr, in one line, what befell an article: skipped, or stripped by the fallback."""
    print(f"warning: {message}", file=sys.stderr)


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


class Noted(NamedTuple):
    """An article with a line to say about it: its markup was stripped by the fallback (``finish``)."""

    article: Article
    note: str


# A record as read, before its own work (JSON decoding, markup stripping, checks): an Article already, or
# a module-level function and its arguments, so a worker process can do that work (``finish``).
Record = Article | tuple[Callable[..., Article | Noted], tuple[Any, ...]]


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


class InputMeter:
    """How much of a corpus has been read, in bytes of its files as stored (compressed or not).

    A progress bar without ``--limit`` shows this against ``total`` and estimates the time left from it.
    """

    def __init__(self, path: Path | str) -> None:
        path = Path(path)
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        self.total = sum(p.stat().st_size for p in files if p.exists())
        self.done = 0  # bytes of files read so far (written from the reading thread)

    def add(self, n: int) -> None:
        self.done = min(self.done + n, self.total)


class _Metered(io.RawIOBase):
    """A file whose reads are counted on an ``InputMeter`` (a decompressor reads through it)."""

    def __init__(self, raw: IO[bytes], meter: InputMeter) -> None:
        self._raw, self._meter = raw, meter

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        self._meter.add(n or 0)
        return n  # type: ignore[no-any-return]

    def close(self) -> None:
        self._raw.close()
        super().close()


@dataclass(frozen=True)
class _Bound:
    """The most bytes one article may hold, who is told of one skipped for holding more, and the meter
    that counts what is read."""

    max_bytes: int
    on_skip: Callable[[str], None]
    meter: InputMeter | None = None

    def skip(self, path: Path, where: str, size: int) -> None:
        self.on_skip(
            f"{path}: {where} holds {size:,} bytes, more than the {self.max_bytes:,} one article may hold"
            " (--max-article-bytes): skipped"
        )


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


def _read_xml(path: Path, bound: _Bound) -> Iterator[Record]:
    # Expat is fed a piece at a time and its handlers keep only the fields a record needs, each up to
    # the limit: ElementTree would hold a <text> whole before showing it, however long.
    with _errors(path), _open(path, bound.meter) as stream:
        pages = _Pages(path, bound.max_bytes)
        parser = pages.parser()
        fed = quiet = 0  # bytes given to the parser; of them, since it last reported anything
        while True:
            data = stream.read(_PIECE)
            events = pages.events
            try:
                parser.Parse(data, not data)
            except (expat.ExpatError, InputFormatError):  # expat's error, or a handler's that stopped it
                yield from _settled(path, bound, pages.take())  # the pages before the error come first
                raise
            yield from _settled(path, bound, pages.take())
            if not data:
                return
            fed += len(data)
            quiet = quiet + len(data) if pages.events == events else 0
            if quiet > bound.max_bytes:  # expat holds a token (a tag, a comment) whole until it ends
                raise InputFormatError(
                    f"{path}: the {quiet:,} bytes of XML before byte {fed:,} hold no element or text, more"
                    f" than the {bound.max_bytes:,} an article may hold: one tag, comment or declaration"
                    " that long is not a MediaWiki dump"
                )


class _TooLarge(NamedTuple):
    where: str
    size: int


_Item = Record | _TooLarge | InputFormatError


def _settled(path: Path, bound: _Bound, items: list[_Item]) -> Iterator[Record]:
    """The records of ``items`` in order: skipped ones said, an error raised where it came."""
    for item in items:
        if isinstance(item, InputFormatError):
            raise item
        if isinstance(item, _TooLarge):
            bound.skip(path, item.where, item.size)
        else:
            yield item


class _Field:
    """The character data of one element, held up to the limit; past it only counted."""

    __slots__ = ("head", "pieces", "size")

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.size = 0  # UTF-8 bytes of all of it, held or not
        self.head = ""

    def add(self, data: str, max_bytes: int) -> None:
        if not self.size:
            self.head = data[:_HEAD]
        self.size += len(data.encode("utf-8"))
        if self.size > max_bytes:
            self.pieces.clear()
        else:
            self.pieces.append(data)

    def text(self) -> str:
        return "".join(self.pieces)


class _Pages:
    """Expat handlers that make each <page> a record as it ends (see ``take``).

    Of a page they keep its title, ns and id, whether it has a <redirect>, and the <text> of its last
    <revision> (oldest first in exports), each as ElementTree's ``findtext`` on the page would find it.
    """

    def __init__(self, path: Path, max_bytes: int) -> None:
        self._path = path
        self._max_bytes = max_bytes
        self.events = 0  # handler calls, the parser's sign of progress
        self._done: list[_Item] = []
        self._open: list[str] = []  # local names of the open elements
        self._page = 0  # how many elements were open when the current <page> started; 0 outside one
        self._fields: dict[str, _Field] = {}
        self._field: _Field | None = None  # where character data goes now; None: dropped
        self._redirect = False
        self._declared = 0  # namespace declarations in scope
        self._prefixes: set[str | None] = set()  # prefixes declared in the file (None: the default one)

    def parser(self) -> expat.XMLParserType:
        self._parser = parser = expat.ParserCreate(namespace_separator="}")  # "uri}page": namespace ignored
        # Character data comes in pieces of up to a buffer, not a call per line.
        parser.buffer_text = True
        parser.buffer_size = _PIECE
        parser.StartElementHandler = self._start
        parser.EndElementHandler = self._end
        parser.CharacterDataHandler = self._data
        parser.StartNamespaceDeclHandler = self._declare
        parser.EndNamespaceDeclHandler = self._undeclare
        return parser

    def take(self) -> list[_Item]:
        """What the pages finished since the last call make: records, sizes to skip and errors."""
        done, self._done = self._done, []
        return done

    def _declare(self, prefix: str | None, uri: str | None) -> None:
        self._declared += 1
        if len(self._prefixes) < _MAX_NAMESPACES:
            self._prefixes.add(prefix)
        elif prefix not in self._prefixes:
            self._declared = _MAX_NAMESPACES + 1
        if self._declared > _MAX_NAMESPACES:
            raise InputFormatError(
                f"{self._path}: more than {_MAX_NAMESPACES} XML namespace prefixes declared (in scope at once"
                f" or in the file) at line {self._parser.CurrentLineNumber}; a MediaWiki dump declares 2:"
                " not a dump"
            )

    def _undeclare(self, prefix: str | None) -> None:
        self._declared -= 1

    def _start(self, name: str, attrs: dict[str, str]) -> None:
        self.events += 1
        self._field = None  # an element's text is the data before its first child, as ElementTree's
        local = name.rpartition("}")[2]
        self._open.append(local)
        if len(self._open) > _MAX_DEPTH:
            raise InputFormatError(
                f"{self._path}: elements nested more than {_MAX_DEPTH} deep at line"
                f" {self._parser.CurrentLineNumber}; not a MediaWiki dump"
            )
        depth = len(self._open) - self._page
        if not self._page:
            if local == "page":
                self._page, self._fields, self._redirect = len(self._open), {}, False
        elif depth == 1 and local in ("title", "ns", "id"):
            self._field = self._fields[local] = _Field()
        elif depth == 1 and local == "redirect":
            self._redirect = True
        elif depth == 1 and local == "revision":
            self._fields.pop("text", None)  # a later revision without a <text> has none
        elif depth == 2 and local == "text" and self._open[-2] == "revision":
            self._field = self._fields["text"] = _Field()

    def _end(self, name: str) -> None:
        self.events += 1
        self._field = None
        if len(self._open) == self._page:
            self._page = 0
            item = self._record()
            if item is not None:
                self._done.append(item)
        self._open.pop()

    def _data(self, data: str) -> None:
        self.events += 1
        if self._field is not None:
            self._field.add(data, self._max_bytes)

    def _record(self) -> _Item | None:
        fields = self._fields
        title, ns, page_id = (fields[n].text() if n in fields else "" for n in ("title", "ns", "id"))
        title, page_id = title.strip(), page_id.strip()
        if (ns or "0").strip() != "0" or self._redirect:
            return None
        if not page_id:
            return InputFormatError(
                f"{self._path}: page {title!r} has no <id>; is this a MediaWiki export dump?"
            )
        text = fields.get("text") or _Field()
        wikitext = text.text()
        if _REDIRECT.match(wikitext or text.head):
            return None
        where = f"page {page_id}"
        # Told here, while reading, before the markup is parsed (``finish``): that costs more than prose.
        largest = max(held.size for held in fields.values())
        if largest > self._max_bytes:
            return _TooLarge(f"{where} ({title!r})", largest)
        return _page_text, (self._path, where, page_id, title, wikitext)


def _page_text(path: Path, where: str, page_id: str, title: str, wikitext: str) -> Article | Noted:
    text, why = page_text(wikitext)
    article = _article(path, where, page_id, title, text)
    if why is None:
        return article
    return Noted(
        article, f"{path}: {where} ({title!r}): {why}; its markup was stripped by the plain fallback"
    )


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


def _article(path: Path, where: str, doc_id: str, title: str, text: str) -> Article:
    """An Article once its fields are known to be storable: valid text, a title, a bounded size."""
    for name, value in (("id", doc_id), ("title", title), ("text", text)):
        bad = first_unencodable(value)
        if bad is not None:
            raise InputFormatError(
                f"{path}: {where} has a {name} that is not valid Unicode: {describe_unencodable(value, bad)}"
                " (an escape such as \\ud800 without its pair); fix or drop that article"
            )
    if not title.strip():
        raise InputFormatError(
            f"{path}: {where} (id {doc_id}) has an empty title; give every article a title (a subject"
            " finds its article by title)"
        )
    return Article(doc_id, title.strip(), text.strip())


class _Line(NamedTuple):
    number: int
    size: int  # bytes, with the line's end
    text: str | None  # None: longer than the limit, so read in pieces and dropped


def _lines(path: Path, stream: IO[bytes], max_bytes: int) -> Iterator[_Line]:
    # Decoding line by line (not a text wrapper) lets a bad byte be reported by line and offset.
    offset = number = 0
    while raw := stream.readline(max_bytes + 1):  # one byte more: room for the line's end
        number += 1
        if len(raw) > max_bytes and not raw.endswith(b"\n"):
            line = _Line(number, len(raw) + _rest_of_line(stream), None)
        else:
            line = _Line(number, len(raw), _decode(path, raw, number, offset))
        yield line
        offset += line.size


def _rest_of_line(stream: IO[bytes]) -> int:
    """Read the rest of an over-long line in pieces, holding none of them; its bytes."""
    size = 0
    while piece := stream.readline(_PIECE):
        size += len(piece)
        if piece.endswith(b"\n"):
            break
    return size


def _decode(path: Path, raw: bytes, number: int, offset: int) -> str:
    try:
        return raw.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        raise InputFormatError(
            f"{path}: line {number} is not UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
            f"{offset + exc.start}); convert the file to UTF-8"
        ) from exc


# Told by their first bytes, not their names: every one of them is read as a stream.
_DECOMPRESSORS: tuple[tuple[bytes, Callable[..., IO[bytes]]], ...] = (
    (b"BZh", bz2.open),
    (b"\x1f\x8b", gzip.open),
    (b"\xfd7zXZ\x00", lzma.open),
)


@contextmanager
def _open(path: Path, meter: InputMeter | None = None) -> Iterator[IO[bytes]]:
    with open(path, "rb") as probe:
        magic = probe.read(6)
    with open(path, "rb", buffering=0) as file:  # a decompressor given a file does not close it
        raw: Any = file if meter is None else _Metered(file, meter)
        opener = next((o for prefix, o in _DECOMPRESSORS if magic.startswith(prefix)), None)
        with opener(raw, "rb") if opener is not None else io.BufferedReader(raw) as stream:
            yield stream


def _check_exists(path: Path) -> None:
    if not path.exists():
        raise InputFormatError(f"{path}: no such file or directory; check the corpus path")


@contextmanager
def _errors(path: Path) -> Iterator[None]:
    """Turn the libraries' read errors into one-line InputFormatErrors that name the file."""
    try:
        yield
    except expat.ExpatError as exc:
        raise InputFormatError(
            f"{path}: malformed XML ({_one_line(exc)}); the dump may be truncated, not UTF-8 or not an export"
        ) from exc
    except EOFError as exc:
        raise InputFormatError(
            f"{path}: compressed data ends early; the file is truncated, fetch it again"
        ) from exc
    except (OSError, zlib.error, lzma.LZMAError) as exc:
        raise InputFormatError(f"{path}: cannot read ({_one_line(exc)}); the file may be corrupt") from exc
    except Exception as exc:
        arrow = sys.modules.get("pyarrow")  # only a parquet read, which imported it, raises its errors
        if arrow is None or not isinstance(exc, arrow.ArrowException):
            raise
        raise InputFormatError(f"{path}: not a readable parquet file ({_one_line(exc)})") from exc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
