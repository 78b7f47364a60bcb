"""Corpus readers: MediaWiki XML dumps, JSON Lines, parquet and WikiExtractor output -> Article records."""

from __future__ import annotations

import bz2
import gzip
import json
import math
import re
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from bertknn_search.errors import ConfigError, InputFormatError
from bertknn_search.ingest.wikitext import wikitext_to_text
from bertknn_search.records import Article
from bertknn_search.textcheck import describe_unencodable, first_unencodable

FORMATS = ("xml", "jsonl", "parquet", "wikiextractor")
SUPPORTED = (
    "MediaWiki XML dump (.xml, .xml.bz2), JSON Lines with id/title/text (.jsonl, .json, also .bz2/.gz), "
    "parquet with id/title/text columns (.parquet), WikiExtractor output (<doc> blocks)"
)
_BY_SUFFIX = {".xml": "xml", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
_FIELDS = ("id", "title", "text")
# An optional column: the article's popularity (page views), which the adaptive-retrieval gate reads.
POPULARITY = "popularity"
# Wikipedia's own cap on a page's wikitext (2 MiB). An article past it is not a Wikipedia article, and
# its cost (sentence splitting, hundreds of thousands of contexts, one stored row) is refused up front.
MAX_ARTICLE_CHARS = 2 * 1024 * 1024

_REDIRECT = re.compile(r"\s*#redirect", re.I)
_DOC_START = re.compile(r'<doc\s+id="(?P<id>[^"]*)"(?:\s+url="[^"]*")?\s+title="(?P<title>.*)">\s*$')


def read_articles(path: Path | str, limit: int | None = None, fmt: str | None = None) -> Iterator[Article]:
    """Stream the articles of a corpus file, or of every file under a directory (sorted by path).

    Redirects and pages outside the article namespace of XML dumps are skipped; wiki markup is
    reduced to plain prose with one paragraph per line. Articles whose text is empty are still
    yielded, so the caller can count them. A missing path or a file of unknown format fails at
    once; anything wrong inside a file surfaces while iterating, after the articles before it.

    Args:
        path: a file, or a directory read recursively (hidden files skipped), each file in its own format.
        limit: stop after this many articles.
        fmt: one of ``FORMATS`` to skip detection (applies to every file of a directory).

    Returns:
        An iterator of articles; ``id`` is the page id as a string, ``title`` and ``text`` are stripped.

    Raises:
        InputFormatError: the path is missing, the format unknown, or a file is truncated, corrupt,
            not UTF-8, malformed or lacks id/title/text; an article has an empty title, text that is not
            valid Unicode (an escaped lone surrogate) or more than ``MAX_ARTICLE_CHARS`` characters.
            The message is one line naming the file.
        ConfigError: ``limit`` is negative.
    """
    return (finish(record) for record in read_records(path, limit, fmt))


# A record as read, before its own work (JSON decoding, markup stripping, checks): an Article already, or
# a module-level function and its arguments, so a worker process can do that work (``finish``).
Record = Article | tuple[Callable[..., Article], tuple[Any, ...]]


def read_records(path: Path | str, limit: int | None = None, fmt: str | None = None) -> Iterator[Record]:
    """``read_articles`` with each article's own work left to ``finish``: the records come in the same
    order and count (redirects and other namespaces are skipped here), and ``finish`` raises the errors
    ``read_articles`` would for that record. Reading a file stays sequential; finishing can be parallel.

    Raises:
        InputFormatError, ConfigError: as ``read_articles``, for the path and the file as a whole.
    """
    path = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise InputFormatError(f"{path}: unknown format {fmt!r} asked for; use one of {', '.join(FORMATS)}")
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be 0 or more, not {limit}")
    _check_exists(path)
    records = _read_directory(path, fmt) if path.is_dir() else _READERS[fmt or detect_format(path)](path)
    return islice(records, limit)


def finish(record: Record) -> Article:
    """The article of a record from ``read_records``."""
    if isinstance(record, Article):
        return record
    make, args = record
    return make(*args)


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
    for packed in (".bz2", ".gz"):
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


def _read_directory(root: Path, fmt: str | None) -> Iterator[Record]:
    files = sorted(p for p in root.rglob("*") if p.is_file() and not _hidden(p.relative_to(root)))
    if not files:
        raise InputFormatError(f"{root}: the directory holds no corpus files; check the path")
    for file in files:
        yield from _READERS[fmt or detect_format(file)](file)


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)  # .DS_Store, .git: never corpus files


def _read_xml(path: Path) -> Iterator[Record]:
    with _errors(path), _open(path) as stream:
        events = ET.iterparse(stream, events=("start", "end"))
        _, root = next(events)
        for event, element in events:
            if event == "end" and element.tag.rpartition("}")[2] == "page":
                article = _page_article(path, element)
                root.clear()  # else finished pages pile up under <mediawiki>: memory must stay flat
                if article is not None:
                    yield article


def _page_article(path: Path, page: ET.Element) -> Record | None:
    title = (page.findtext("{*}title") or "").strip()
    if (page.findtext("{*}ns") or "0").strip() != "0" or page.find("{*}redirect") is not None:
        return None
    page_id = (page.findtext("{*}id") or "").strip()
    if not page_id:
        raise InputFormatError(f"{path}: page {title!r} has no <id>; is this a MediaWiki export dump?")
    revisions = page.findall("{*}revision")  # oldest first in exports: the last one is the latest
    wikitext = (revisions[-1].findtext("{*}text") or "") if revisions else ""
    if _REDIRECT.match(wikitext):
        return None
    where = f"page {page_id}"
    _check_size(path, where, title, wikitext)  # before parsing: markup costs more than prose
    return _page_text, (path, where, page_id, title, wikitext)


def _page_text(path: Path, where: str, page_id: str, title: str, wikitext: str) -> Article:
    return _article(path, where, page_id, title, wikitext_to_text(wikitext))


def _read_jsonl(path: Path) -> Iterator[Record]:
    with _errors(path), _open(path) as stream:
        for number, line in _lines(path, stream):
            if line.strip():
                yield _json_line, (path, number, line)


def _json_line(path: Path, number: int, line: str) -> Article:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputFormatError(
            f"{path}: line {number} is not JSON ({exc.msg}, column {exc.colno}); "
            "each line must be one object with id, title and text"
        ) from exc
    return _record(path, f"line {number}", row)


def _read_parquet(path: Path) -> Iterator[Article]:
    with _errors(path):
        table = pq.ParquetFile(path)
        missing = [name for name in _FIELDS if name not in table.schema_arrow.names]
        if missing:
            raise InputFormatError(
                f"{path}: parquet file lacks column(s) {', '.join(missing)}; it needs id, title and text"
            )
        row = 0
        names = [*_FIELDS, POPULARITY] if POPULARITY in table.schema_arrow.names else list(_FIELDS)
        for batch in table.iter_batches(batch_size=256, columns=names):
            for values in zip(*(batch.column(name).to_pylist() for name in names)):
                row += 1
                yield _record(path, f"row {row}", dict(zip(names, values)))


def _read_extracted(path: Path) -> Iterator[Article]:
    with _errors(path), _open(path) as stream:
        header: tuple[str, str, int] | None = None
        body: list[str] = []
        for number, line in _lines(path, stream):
            start = _DOC_START.match(line) if line.startswith("<doc") else None
            if start and header is not None:
                raise InputFormatError(
                    f"{path}: line {number} opens a <doc> inside the <doc> of line {header[2]}"
                )
            if start:
                header, body = (start["id"], start["title"], number), []
            elif header is None:
                if line.strip():
                    raise InputFormatError(
                        f"{path}: line {number} is outside any <doc>; not WikiExtractor output?"
                    )
            elif line.strip() == "</doc>":
                yield _extracted_article(path, header[2], header[0], header[1], body)
                header = None
            else:
                body.append(line.strip())
        if header is not None:
            raise InputFormatError(f"{path}: the <doc> of line {header[2]} is never closed; file truncated?")


_READERS = {
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
    _check_size(path, where, title, text)
    return Article(doc_id, title.strip(), text.strip())


def _check_size(path: Path, where: str, title: str, text: str) -> None:
    if len(text) > MAX_ARTICLE_CHARS:
        raise InputFormatError(
            f"{path}: {where} ({title.strip()!r}) holds {len(text):,} characters; one article may hold at"
            f" most {MAX_ARTICLE_CHARS:,} (Wikipedia's own page limit): split it into several articles"
        )


def _lines(path: Path, stream: IO[bytes]) -> Iterator[tuple[int, str]]:
    # Decoding line by line (not a text wrapper) lets a bad byte be reported by line and offset.
    offset = 0
    for number, raw in enumerate(stream, 1):
        try:
            yield number, raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise InputFormatError(
                f"{path}: line {number} is not UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
                f"{offset + exc.start}); convert the file to UTF-8"
            ) from exc
        offset += len(raw)


def _open(path: Path) -> IO[bytes]:
    with open(path, "rb") as probe:
        magic = probe.read(3)
    if magic == b"BZh":
        return bz2.open(path, "rb")
    if magic[:2] == b"\x1f\x8b":
        return gzip.open(path, "rb")
    return open(path, "rb")


def _check_exists(path: Path) -> None:
    if not path.exists():
        raise InputFormatError(f"{path}: no such file or directory; check the corpus path")


@contextmanager
def _errors(path: Path) -> Iterator[None]:
    """Turn the libraries' read errors into one-line InputFormatErrors that name the file."""
    try:
        yield
    except ET.ParseError as exc:
        raise InputFormatError(
            f"{path}: malformed XML ({_one_line(exc)}); the dump may be truncated, not UTF-8 or not an export"
        ) from exc
    except EOFError as exc:
        raise InputFormatError(
            f"{path}: compressed data ends early; the file is truncated, fetch it again"
        ) from exc
    except (OSError, zlib.error) as exc:
        raise InputFormatError(f"{path}: cannot read ({_one_line(exc)}); the file may be corrupt") from exc
    except pa.ArrowException as exc:
        raise InputFormatError(f"{path}: not a readable parquet file ({_one_line(exc)})") from exc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
