"""Wikitext to prose: the templates that stand for words in a sentence are kept as those words."""

from __future__ import annotations

import pytest

from bertknn_search.ingest.wikitext import wikitext_to_text


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
