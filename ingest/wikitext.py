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
        if isinstance(node, (Template, Argument, Comment, Heading)) or _hidden_link(node):
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
