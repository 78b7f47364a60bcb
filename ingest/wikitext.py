"""Wikitext -> plain prose: templates, tables, refs, files, categories, headings and link lists removed."""

from __future__ import annotations

import re

import mwparserfromhell
from mwparserfromhell.nodes import Argument, Comment, Heading, Node, Tag, Template, Text, Wikilink
from mwparserfromhell.wikicode import Wikicode

# MediaWiki itself drops comments and ends a <ref> at the first </ref>, so a regex pass is faithful here,
# and it halves the mwparserfromhell parse time (citations are a third of enwiki's wikitext).
_COMMENTS_AND_REFS = re.compile(r"<!--.*?(?:-->|\Z)|<ref\b[^>]*?/>|<ref\b[^>]*>.*?</ref\s*>", re.S | re.I)
_HIDDEN_LINK = re.compile(r"\s*(?:file|image|media|category)\s*:", re.I)
_INTERLANGUAGE = re.compile(r"\s*[a-z]{2,3}(?:-[a-z]+)*\s*:")
_DROPPED_TAGS = frozenset({"ref", "references", "table", "gallery", "syntaxhighlight", "source", "timeline"})
_LIST_MARK = "\ue000"  # a private-use char survives strip_code, so list items stay recognisable per line
_MARKUP_JUNK = re.compile(r"\{\||\||!\s|!!|\}\}|\[\[")  # leftovers of rows and links the parser gave up on
_EMPTY_PARENS = re.compile(r"\(\s*(?:[,;:]\s*)*\)")  # "()" and "(; )" are what dropped templates leave behind
_LEADING_SEPARATORS = re.compile(r"\(\s*(?:[,;:]\s*)+")
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_SENTENCE_END = re.compile(r"[.!?][\"')\]”’]*$")
_MIN_ITEM_WORDS = 6
# Templates that stand for words inside a sentence. Dropped like the others, they left gaps that then showed
# in evidence ("typically between ." for "typically between {{convert|10|and|20|cm}}."); these are rendered
# as MediaWiki shows them, in their plain form. Other templates are still dropped (infoboxes, citations,
# navigation), so an uncommon inline one can still leave a gap.
_RANGE_WORDS = {"-": "–", "–": "–", "to": " to ", "and": " and ", "or": " or ", "by": " by ", "x": " × "}
_UNIT_SHOWN = {"C": "°C", "F": "°F"}
_MONTHS = ("January February March April May June July August September October November December").split()
_FIRST_ARGUMENT = frozenset(
    {"nowrap", "nobr", "abbr", "small", "smaller", "big", "ill", "not a typo", "proper name"}
)
_DATES = frozenset(
    {"birth date", "death date", "birth date and age", "death date and age", "start date", "end date"}
)
_SYMBOLS = {"nbsp": " ", "ndash": "–", "mdash": "—", "snd": " – ", "spaced ndash": " – "}
_INLINE = (
    _FIRST_ARGUMENT | _DATES | {"convert", "cvt", "val", "circa", "c.", "lang", "transl", "transliteration"}
)


def wikitext_to_text(wikitext: str) -> str:
    """Plain prose of one page, for sentence splitting.

    Link text is kept and ``'''bold'''``/``''italic''`` unwrapped (mwparserfromhell's ``strip_code``);
    templates, tables, refs, comments, headings, magic words and File/Image/Category/interlanguage
    links are dropped, and so are leftover table rows and list items that do not read as a sentence
    ("See also" entries, bibliographies).

    Args:
        wikitext: the source of one page.

    Returns:
        One paragraph per line, whitespace collapsed inside lines; "" when nothing is left.
    """
    code = mwparserfromhell.parse(_COMMENTS_AND_REFS.sub("", wikitext))
    _prune(code)
    lines = []
    for raw in code.strip_code(normalize=True, collapse=True).split("\n"):
        line = _EMPTY_PARENS.sub("", _MAGIC_WORD.sub(" ", raw.replace(_LIST_MARK, " ")))
        line = " ".join(_LEADING_SEPARATORS.sub("(", line).split())
        if not any(char.isalnum() for char in line) or _MARKUP_JUNK.match(line):
            continue
        if raw.lstrip().startswith(_LIST_MARK) and not _reads_as_sentence(line):
            continue
        lines.append(line)
    return "\n".join(lines)


def _reads_as_sentence(line: str) -> bool:
    return len(line.split()) >= _MIN_ITEM_WORDS and _SENTENCE_END.search(line) is not None


def _prune(code: Wikicode) -> None:
    # Rebuilding each node list in one pass is linear; Wikicode.remove searches the whole tree per call.
    kept: list[Node] = []
    for node in code.nodes:
        if isinstance(node, Template):
            shown = _inline_template(node)
            if shown:
                kept.append(Text(shown))
            continue
        if isinstance(node, (Argument, Comment, Heading)) or _hidden_link(node):
            continue
        if isinstance(node, Tag):
            tag = str(node.tag).strip().lower()
            if tag in _DROPPED_TAGS:
                continue
            if tag == "br" or node.wiki_markup in ("*", "#", ";"):
                kept.append(Text(" " if tag == "br" else _LIST_MARK))
                continue
        for child in node.__children__():
            _prune(child)
        kept.append(node)
    code.nodes = kept


def _hidden_link(node: Node) -> bool:
    if not isinstance(node, Wikilink):
        return False
    title = str(node.title)
    return bool(_HIDDEN_LINK.match(title) or (node.text is None and _INTERLANGUAGE.match(title)))


def _inline_template(template: Template) -> str | None:
    """The words an inline template shows in the text (see ``_FIRST_ARGUMENT`` etc.); None: drop it."""
    name = " ".join(str(template.name).replace("_", " ").split()).lower()
    if name in _SYMBOLS:
        return _SYMBOLS[name]
    # Not {{lang-xx|...}}: those give a lead's other names ("Zürich (Swiss German: Züri)"), not its prose.
    if name not in _INLINE:
        return None  # infoboxes and citations: not worth rendering their many arguments to drop them
    args = [_plain(p.value) for p in template.params if not p.showkey]
    if name in ("convert", "cvt") and args:
        return _convert(args)
    if name == "val" and args:
        unit = next((_plain(p.value) for p in template.params if str(p.name).strip() in ("u", "ul")), "")
        return f"{args[0]} {unit}".strip()
    if name in _DATES:
        return _date(args)
    if name in ("circa", "c."):
        return f"c. {args[0]}" if args else "c."
    if name == "lang" and len(args) >= 2:
        return args[1]
    if name in _FIRST_ARGUMENT and args:
        return args[0]
    if name in ("transl", "transliteration") and args:
        return args[-1]
    return None


def _plain(value: Wikicode) -> str:
    """A template argument as text: nested templates rendered or dropped as in the page's own text."""
    code = mwparserfromhell.parse(str(value))
    _prune(code)
    return " ".join(code.strip_code(normalize=True, collapse=True).split())


def _convert(args: list[str]) -> str:
    """{{convert|10|and|20|cm|in}} -> "10 and 20 cm": the amounts as given and their unit, no conversion."""
    shown, rest = args[0], args[1:]
    while len(rest) >= 2 and rest[0].lower() in _RANGE_WORDS:
        shown += _RANGE_WORDS[rest[0].lower()] + rest[1]
        rest = rest[2:]
    if rest:
        shown += " " + _UNIT_SHOWN.get(rest[0], rest[0])
    return shown


def _date(args: list[str]) -> str | None:
    """{{birth date|1879|3|14}} -> "14 March 1879" (day first, as most of enwiki's prose has it)."""
    numbers = [a for a in args[:3] if a.isdigit()]
    if not numbers:
        return None
    year, *rest = numbers
    if not rest or not 1 <= int(rest[0]) <= 12:
        return year
    month = _MONTHS[int(rest[0]) - 1]
    return f"{int(rest[1])} {month} {year}" if len(rest) > 1 else f"{month} {year}"
