"""Corpus files opened and read safely: decompression, metered reads, bounded lines, UTF-8 checks, the
checks every article passes, and one-line errors naming the file."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import sys
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple
from xml.parsers import expat

from bertknn_search.errors import InputFormatError
from bertknn_search.records import Article
from bertknn_search.textcheck import describe_unencodable, first_unencodable

# An over-long line or XML text is read and dropped this many bytes at a time, never held whole.
_PIECE = 64 * 1024


# Told by their first bytes, not their names: every one of them is read as a stream.
_DECOMPRESSORS: tuple[tuple[bytes, Callable[..., IO[bytes]]], ...] = (
    (b"BZh", bz2.open),
    (b"\x1f\x8b", gzip.open),
    (b"\xfd7zXZ\x00", lzma.open),
)


def warn(message: str) -> None:
    """Say on stderr, in one line, what befell an article: skipped, or stripped by the fallback."""
    print(f"warning: {message}", file=sys.stderr)


class Noted(NamedTuple):
    """An article with a line to say about it: its markup was stripped by the fallback (``finish``)."""

    article: Article
    note: str


# A record as read, before its own work (JSON decoding, markup stripping, checks): an Article already, or
# a module-level function and its arguments, so a worker process can do that work (``finish``).
Record = Article | tuple[Callable[..., Article | Noted], tuple[Any, ...]]


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
