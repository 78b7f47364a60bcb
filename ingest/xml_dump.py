"""MediaWiki XML dumps read a piece at a time with expat: pages, redirects, namespaces, fields bounded."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple
from xml.parsers import expat

from bertknn_search.errors import InputFormatError
from bertknn_search.ingest.input_files import (
    Noted,
    Record,
    _article,
    _Bound,
    _errors,
    _open,
)
from bertknn_search.ingest.page_parse import page_text
from bertknn_search.records import Article

# How an XML text that is dropped for its size still tells a redirect: by how it starts.
_HEAD = 64

# XML is given to expat this many bytes at a time (an over-long text is dropped a piece at a time too).
_PIECE = 64 * 1024


# A dump nests 5 deep; expat keeps every open element, so nesting is bounded as text is.
_MAX_DEPTH = 100


# A dump declares 2 namespace prefixes, on its root. Expat keeps each declaration while its element is
# open and each prefix's name to the end: 95 nested elements of 70,000 prefixes each (a 16 MB .bz2) held
# 1.3 GB. So prefixes in scope at once, and different prefixes in a file, are bounded.
_MAX_NAMESPACES = 100


_REDIRECT = re.compile(r"\s*#redirect", re.I)


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
