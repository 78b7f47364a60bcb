"""Wikitext to prose: the templates that stand for words in a sentence are kept as those words."""

from __future__ import annotations

import bz2
import hashlib
import random
import xml.etree.ElementTree as ET
from pathlib import Path

import mwparserfromhell
import pytest

from bertknn_search.ingest.wikitext import _COMMENTS_AND_REFS, _strip_nodes, _stripped, wikitext_to_text


@pytest.mark.parametrize(
    ("wikitext", "prose"),
    [
        # The gap that showed in evidence as "typically between ." before.
        (
            "Adults are typically between {{convert|10|and|20|cm|in|abbr=on}} long.",
            "Adults are typically between 10 and 20 cm long.",
        ),
        ("The lake is {{cvt|3|-|5|km}} wide.", "The lake is 3–5 km wide."),
        ("Summers reach {{convert|30|C|F}}.", "Summers reach 30 °C."),
        (
            "Einstein (born {{birth date|1879|3|14|df=y}}) grew up in {{lang|de|Ulm}}.",
            "Einstein (born 14 March 1879) grew up in Ulm.",
        ),
        ("It was built {{circa|1900}} and rose {{val|1.5|u=m}}.", "It was built c. 1900 and rose 1.5 m."),
        (
            "He moved{{snd}}again{{nbsp}}to {{nowrap|{{convert|3|km}} away}}.",
            "He moved – again to 3 km away.",
        ),
        ("She met {{ill|Hans Meyer|de|Hans Meyer (Maler)}} there.", "She met Hans Meyer there."),
    ],
)
def test_inline_templates_read_as_their_words(wikitext: str, prose: str) -> None:
    assert wikitext_to_text(wikitext) == prose


def test_other_templates_are_still_dropped() -> None:
    wikitext = (
        "{{Infobox person|name=Zorblat|birth_place={{convert|1|km}}}}"
        "Zorblat was a painter.{{cite web|url=x|title={{lang|de|Titel}}}} {{Citation needed|date=May 2020}}"
    )
    assert wikitext_to_text(wikitext) == "Zorblat was a painter."


# sha256 of the stripped pages joined by "\x1e", as the node-tree path (mwparserfromhell's builder,
# ``_prune``, ``strip_code``) gave them with mwparserfromhell 0.7.2 before the token path replaced it.
REAL_PAGES = {
    "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2": (
        206,
        "fa2ad27d65b7b0ef2c7a0e057ac3037870eb1fd33c4e59af9219e5673363adc6",
    ),
    "enwiki-table-markup.xml.bz2": (5, "6896ed73eb7ef17f5e7e724d6c8827fcf8c2c8561fbe57309543afe09d479c6c"),
}


def _pages(path: Path) -> list[str]:
    with bz2.open(path) as stream:
        return [el.text or "" for _, el in ET.iterparse(stream) if el.tag.endswith("}text")]


def _tree_path(wikitext: str) -> str:
    return _strip_nodes(mwparserfromhell.parse(wikitext))


@pytest.mark.parametrize("name", sorted(REAL_PAGES))
def test_real_pages_give_the_text_they_gave_before(shared_data: Path, name: str) -> None:
    pages = _pages(shared_data / "wiki-sample" / name)
    count, digest = REAL_PAGES[name]
    joined = "\x1e".join(wikitext_to_text(p) for p in pages)
    assert len(pages) == count
    assert hashlib.sha256(joined.encode()).hexdigest() == digest


def test_token_path_equals_the_tree_path_on_pieces_of_real_pages(shared_data: Path) -> None:
    # Cut anywhere, pages leave constructs open or closed at random: the tokenizer's odd corners.
    pages = [p for p in _pages(shared_data / "wiki-sample" / sorted(REAL_PAGES)[0]) if p]
    rng = random.Random(0)
    for _ in range(400):
        page = rng.choice(pages)
        start = rng.randrange(len(page))
        piece = _COMMENTS_AND_REFS.sub("", page[start : start + rng.choice([40, 400, 4000])])
        assert _stripped(piece) == _tree_path(piece), piece


@pytest.mark.parametrize(
    "wikitext",
    [
        "[[File:A.jpg|thumb|A [[b|c]] d]] e [[Category:X]] [[de:Y]] [[de:Y|z]] [[:Category:Q|q]]",
        "[[{{tl|x}}|t]] [[a{{nowrap|b}}]] [[File{{!}}x]] [[<b>File</b>:y|z]]",
        "'''''bold italic''''' '''b''' ''i'' <b>x<i>y</i></b> <span class=\"a\">s</span>",
        '<div style="{{x}}">d</div> <math>x^2</math> <gallery>a.jpg</gallery> <nowiki>[[n]]</nowiki>',
        'a<br>b<br/>c<BR />d <ref name="a"/> <references/> <poem>p\nq</poem>',
        "* item one\n# item two is a long enough sentence here.\n; term : def\n:indent",
        '{| class="wikitable"\n|-\n! h\n| c || d\n|}\nafter',
        "{{{arg|default}}} {{{1}}} {{#if:x|y|z}} {{ {{name}} |a}} {{Infobox|a=[[b]]}}",
        "[http://x.org title] [http://x.org] http://y.org/z [[a]]b &amp; &#931; &#x3a3; &nbsp;",
        "a [http://x.org] b",
        "a [http://x.org] b [//x.org c] [ftp://y z]",
        "== Head ==\ntext\n=== Sub [[x]] ===\n<!-- c --> __NOTOC__ x\n\n\n\ny",
        "{{convert|{{val|3}}|km}} {{lang|fr|''le'' [[mot]]}} {{nowrap}} {{birth date|x}}",
        "unclosed [[link {{tmpl <b>tag ''style '''more [http://x",
        "}} ]] |} </b> ''' '' {{ [[ [",
    ],
)
def test_token_path_equals_the_tree_path_on_odd_markup(wikitext: str) -> None:
    assert _stripped(wikitext) == _tree_path(wikitext)
