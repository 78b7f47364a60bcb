"""Wikitext -> plain prose: templates, tables, refs, files, categories, headings and link lists removed."""

from __future__ import annotations

import html
import re

from mwparserfromhell.definitions import INVISIBLE_TAGS, PARSER_BLACKLIST, is_visible
from mwparserfromhell.nodes import Argument, Comment, Heading, Node, Tag, Template, Text, Wikilink
from mwparserfromhell.parser import Parser
from mwparserfromhell.parser import tokens as tk
from mwparserfromhell.parser.builder import Builder
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
_ALNUM = re.compile(r"[^\W_]")  # what str.isalnum accepts: re's \w is it or "_"
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
    return _prose(_stripped(_COMMENTS_AND_REFS.sub("", wikitext)))


def _prose(stripped: str) -> str:
    """The lines of stripped wikitext that read as prose, whitespace collapsed (``wikitext_to_text``)."""
    lines = []
    for raw in stripped.split("\n"):
        line = raw.replace(_LIST_MARK, " ")
        # Most lines hold no "__" and no "(": the checks skip substitutions that could not match.
        if "__" in line:
            line = _MAGIC_WORD.sub(" ", line)
        if "(" in line:
            line = _LEADING_SEPARATORS.sub("(", _EMPTY_PARENS.sub("", line))
        line = " ".join(line.split())
        if not _ALNUM.search(line) or _MARKUP_JUNK.match(line):
            continue
        if raw.lstrip().startswith(_LIST_MARK) and not _reads_as_sentence(line):
            continue
        lines.append(line)
    return "\n".join(lines)


def _stripped(wikitext: str) -> str:
    """``strip_code(normalize=True, collapse=True)`` of the page parsed and pruned (``_prune``).

    Made from mwparserfromhell's tokens (``_TokenStrip``) without building its node tree: building
    and pruning the tree was 80% of the time, most of it on templates and tags that are then dropped.
    """
    tokens = Parser()._tokenizer.tokenize(wikitext, 0, False)  # what mwparserfromhell.parse builds from
    spans = _spans(tokens)
    try:
        if spans is not None:
            return _TokenStrip(tokens, spans).code(0, len(tokens))
    except _Unusual:
        pass
    # Never seen from the tokenizer: the tree path does what it always did (a ParserError, most likely).
    return _strip_nodes(Builder().build(tokens))


def _strip_nodes(code: Wikicode) -> str:
    """The reference: the tree pruned, then stripped by mwparserfromhell (what ``_TokenStrip`` equals)."""
    _prune(code)
    return code.strip_code(normalize=True, collapse=True)


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
    return " ".join(_stripped(str(value)).split())


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


# Each construct's opening token and the tokens that can close it (the builder's pairs).
_CLOSES: dict[type, tuple[type, ...]] = {
    tk.TemplateOpen: (tk.TemplateClose,),
    tk.ArgumentOpen: (tk.ArgumentClose,),
    tk.WikilinkOpen: (tk.WikilinkClose,),
    tk.ExternalLinkOpen: (tk.ExternalLinkClose,),
    tk.HTMLEntityStart: (tk.HTMLEntityEnd,),
    tk.HeadingStart: (tk.HeadingEnd,),
    tk.CommentStart: (tk.CommentEnd,),
    tk.TagOpenOpen: (tk.TagCloseSelfclose, tk.TagCloseClose),
}
_CLOSERS = frozenset(c for closes in _CLOSES.values() for c in closes)
_DROPPED = frozenset({tk.ArgumentOpen, tk.CommentStart, tk.HeadingStart})  # as ``_prune`` drops them
_TEMPLATE_END = (tk.TemplateParamSeparator, tk.TemplateClose)
_TAG_NAME_END = (tk.TagAttrStart, tk.TagCloseOpen, tk.TagCloseSelfclose)


def _spans(tokens: list[tk.Token]) -> list[int] | None:
    """For each opening token, the index of the token that closes it; None if they do not pair up."""
    ends = [0] * len(tokens)
    stack: list[int] = []
    for i, token in enumerate(tokens):
        kind = type(token)
        if kind is tk.Text:
            continue
        if kind in _CLOSES:
            stack.append(i)
        elif kind in _CLOSERS:
            if not stack or kind not in _CLOSES[type(tokens[stack[-1]])]:
                return None
            ends[stack.pop()] = i
    return None if stack else ends


def _collapse(text: str) -> str:
    """strip_code's ``collapse``, which it applies at every level of the tree."""
    text = text.strip("\n")
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text


class _Unusual(Exception):
    """Tokens the builder would not make a tree of: left to it, to fail as it does."""


class _TokenStrip:
    """``_strip_nodes`` computed over a token list: each construct's stripped text from its tokens.

    ``code(lo, hi)`` is ``strip_code`` of the node list the builder makes of ``tokens[lo:hi]``, pruned:
    the stripped, non-empty text of each node joined, then collapsed. A node is built as a tree only
    where its text needs one (an inline template, a name or title that is not plain text).
    """

    def __init__(self, tokens: list[tk.Token], ends: list[int]) -> None:
        self.tokens = tokens
        self.ends = ends

    def code(self, lo: int, hi: int) -> str:
        tokens, ends = self.tokens, self.ends
        parts = []
        i = lo
        while i < hi:
            token = tokens[i]
            kind = type(token)
            if kind is tk.Text:
                parts.append(token["text"])
                i += 1
                continue
            if kind not in _CLOSES:
                raise _Unusual  # a separator outside its construct: the builder rejects such tokens
            end = ends[i]
            if kind not in _DROPPED:
                shown = self._node(kind, i, end)
                if shown:
                    parts.append(shown)
            i = end + 1
        text = "".join(parts)
        return _collapse(text) if "\n" in text else text  # most parts (a link's text) hold no newline

    def _node(self, kind: type, i: int, end: int) -> str | None:
        if kind is tk.TemplateOpen:
            name = self._plain_text(i + 1, end, _TEMPLATE_END)
            if name is not None:
                name = " ".join(name.replace("_", " ").split()).lower()
                if name not in _SYMBOLS and name not in _INLINE:
                    return None
            return self._built(i, end)
        if kind is tk.WikilinkOpen:
            return self._wikilink(i, end)
        if kind is tk.TagOpenOpen:
            return self._tag(i, end)
        if kind is tk.ExternalLinkOpen:
            return self._external_link(i, end)
        if kind is tk.HTMLEntityStart:
            return self._built(i, end)
        raise _Unusual

    def _plain_text(self, lo: int, hi: int, stops: tuple[type, ...]) -> str | None:
        """The text of ``tokens[lo:]`` up to the first of ``stops`` (or ``hi``); None unless all Text."""
        tokens = self.tokens
        parts = []
        for i in range(lo, hi):
            kind = type(tokens[i])
            if kind is tk.Text:
                parts.append(tokens[i]["text"])
            elif kind in stops:
                break
            else:
                return None
        return "".join(parts)

    def _source(self, lo: int, hi: int) -> str:
        """``str()`` of the node list of ``tokens[lo:hi]``: its wikitext as written."""
        return str(Builder().build(list(self.tokens[lo:hi])))

    def _separator(self, lo: int, hi: int, separator: type) -> int | None:
        """Index of the first ``separator`` among ``tokens[lo:hi]`` outside nested constructs."""
        tokens, ends = self.tokens, self.ends
        i = lo
        while i < hi:
            kind = type(tokens[i])
            if kind is separator:
                return i
            i = ends[i] + 1 if kind in _CLOSES else i + 1
        return None

    def _wikilink(self, i: int, end: int) -> str | None:
        tokens = self.tokens
        if end == i + 2 and type(tokens[i + 1]) is tk.Text:  # [[title]], most links: the general path, short
            title = tokens[i + 1]["text"]
            if _HIDDEN_LINK.match(title) or _INTERLANGUAGE.match(title):
                return None
            return _collapse(title) if "\n" in title else title
        sep = self._separator(i + 1, end, tk.WikilinkSeparator)
        title_end = end if sep is None else sep
        title = self._plain_text(i + 1, title_end, ())
        if title is None:
            title = self._source(i + 1, title_end)
        if _HIDDEN_LINK.match(title) or (sep is None and _INTERLANGUAGE.match(title)):
            return None
        return self.code(i + 1, end) if sep is None else self.code(sep + 1, end)

    def _external_link(self, i: int, end: int) -> str | None:
        sep = self._separator(i + 1, end, tk.ExternalLinkSeparator)
        if not self.tokens[i].get("brackets"):
            return self.code(i + 1, end if sep is None else sep)
        return None if sep is None else self.code(sep + 1, end)

    def _tag(self, i: int, end: int) -> str | None:
        tokens, ends = self.tokens, self.ends
        # The builder's order: name, attributes, then ">" contents "</" closing name ">", or "/>".
        j = i + 1
        while j < end and type(tokens[j]) not in _TAG_NAME_END:
            j = ends[j] + 1 if type(tokens[j]) in _CLOSES else j + 1
        name = self._plain_text(i + 1, j, ())
        if name is None:
            name = self._source(i + 1, j)
        tag = name.strip().lower()
        if tag in _DROPPED_TAGS:
            return None
        if tag == "br" or tokens[i].get("wiki_markup") in ("*", "#", ";"):
            return " " if tag == "br" else _LIST_MARK
        if type(tokens[end]) is tk.TagCloseSelfclose:
            return None  # no contents
        opened = j
        while opened < end and type(tokens[opened]) is not tk.TagCloseOpen:
            opened = ends[opened] + 1 if type(tokens[opened]) in _CLOSES else opened + 1
        closed = self._separator(opened + 1, end, tk.TagOpenClose)
        if opened >= end or closed is None:
            return self._built(i, end)  # not the usual shape: let the builder say what it is
        return self.code(opened + 1, closed) if is_visible(name) else None

    def _built(self, i: int, end: int) -> str | None:
        """The node of ``tokens[i:end + 1]`` built as a tree, pruned and stripped as ``_strip_nodes`` does."""
        code = Builder().build(list(self.tokens[i : end + 1]))
        _prune(code)
        parts = [str(s) for node in code.nodes if (s := node.__strip__(normalize=True, collapse=True))]
        return "".join(parts)


# -- The fallback: prose by one linear pass ---------------------------------------------------------
_PLAIN_TOKEN = re.compile(
    r"<!--|\{\{|\}\}|\{\||\|\}(?!\})|\[\[|\]\]|<(/?)([A-Za-z][\w-]{0,30})((?:\s[^<>]{0,1000})?/?)>"
)
_PLAIN_DEPTH = 100  # constructs tracked open at once (the tokenizer's own limit); more are dropped
_PLAIN_SKIPPED = _DROPPED_TAGS | frozenset(INVISIBLE_TAGS)  # tags dropped with what they hold
_PLAIN_LITERAL = frozenset(PARSER_BLACKLIST) - _PLAIN_SKIPPED  # tags whose contents are shown as written
_CLOSERS_OF = {"}}": "{{", "|}": "{|", "]]": "[["}
_EXTERNAL_LINK = re.compile(
    r"\[(?:[A-Za-z][\w+.-]{0,20}:)?//[^\s\[\]<>]{1,2000}(?:[ \t]+([^\[\]\n]{0,1000}))?\]"
)
_QUOTES = re.compile(r"''+")
_LIST_START = re.compile(r"[*#;:]+")


def plain_text(wikitext: str) -> str:
    """Prose of a page by one pass over its markup, in time linear in the page: ``page_text``'s fallback.

    What ``wikitext_to_text`` drops, it drops too (comments, templates, tables, refs and the tags
    MediaWiki hides, headings, File/Category/interlanguage links, magic words, list items that are no
    sentence), and it keeps link text; but no template is rendered as words (``{{convert|...}}`` is
    dropped), and a construct left open hides the rest of the page (a template or table) or only its
    own markup (a link or tag). It never raises.
    """
    out: list[str] = []
    opened: list[tuple[str, int]] = []  # "{{", "{|" or "[[", and where in ``out`` each one's text starts
    hidden = 0  # of ``opened``, the templates and tables: text inside one is dropped
    ends = _EndTags(wikitext)
    pos = 0
    while (m := _PLAIN_TOKEN.search(wikitext, pos)) is not None:
        if not hidden:
            out.append(wikitext[pos : m.start()])
        token, pos = m.group(), m.end()
        if token == "<!--":
            end = wikitext.find("-->", pos)
            pos = len(wikitext) if end < 0 else end + 3
        elif token in ("{{", "{|", "[["):
            if len(opened) < _PLAIN_DEPTH:
                opened.append((token, len(out)))
                hidden += token != "[["
        elif token in _CLOSERS_OF:
            k = len(opened) - 1
            while k >= 0 and opened[k][0] != _CLOSERS_OF[token]:
                k -= 1
            if k < 0:
                continue  # a stray end: dropped
            closed = opened[k:]
            del opened[k:]
            hidden -= sum(kind != "[[" for kind, _ in closed)
            if token == "]]" and not hidden:
                start = closed[0][1]
                inner = "".join(out[start:])
                del out[start:]
                out.append(_plain_link(inner))
        else:
            name = m.group(2).lower()
            if name in _PLAIN_SKIPPED or name in _PLAIN_LITERAL:
                if m.group(1) or m.group(3).endswith("/"):
                    continue  # an end tag without its start, or a tag that holds nothing
                end_tag = ends.after(name, pos)
                if end_tag is None:
                    continue  # never ended: only the tag itself goes
                if name in _PLAIN_LITERAL and not hidden:
                    out.append(wikitext[pos : end_tag.start()])
                pos = end_tag.end()
            elif name == "br" and not hidden:
                out.append(" ")
    if not hidden:
        out.append(wikitext[pos:])
    text = html.unescape(_QUOTES.sub("", _EXTERNAL_LINK.sub(lambda m: m.group(1) or "", "".join(out))))
    lines = []
    for line in text.split("\n"):
        line = line.lstrip()
        if line.startswith("="):
            continue  # a heading
        marks = _LIST_START.match(line)
        if marks:
            line = (_LIST_MARK if marks.group().strip(":") else "") + line[marks.end() :]
        lines.append(line)
    return _prose("\n".join(lines))


def _plain_link(inner: str) -> str:
    """What ``[[inner]]`` shows: the text after its first "|", else its title; hidden links nothing."""
    title, pipe, label = inner.partition("|")
    if _HIDDEN_LINK.match(title) or (not pipe and _INTERLANGUAGE.match(title)):
        return ""
    return label if pipe else title


class _EndTags:
    """The next end tag of each name after a position; each name's search moves left to right only."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._found: dict[str, re.Match[str] | None] = {}

    def after(self, name: str, pos: int) -> re.Match[str] | None:
        if name in self._found:
            found = self._found[name]
            if found is None or found.start() >= pos:
                return found  # None: there is none after an earlier position, so none after this one
        found = _end_tag(name).search(self._text, pos)
        self._found[name] = found
        return found


_END_TAGS: dict[str, re.Pattern[str]] = {}


def _end_tag(name: str) -> re.Pattern[str]:
    if name not in _END_TAGS:
        _END_TAGS[name] = re.compile(rf"</{re.escape(name)}\s*>", re.I)
    return _END_TAGS[name]
