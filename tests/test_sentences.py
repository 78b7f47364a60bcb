"""Tests for ingest.sentences: concrete splits and the no-text-lost property."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertknn_search.eval.evidence import evidence_articles
from bertknn_search.ingest.readers import read_articles
from bertknn_search.ingest.sentences import split_sentences

LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # everything str.splitlines splits on


def visible(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "Dr. Smith went to Washington D.C. on Monday. He left.",
            ["Dr. Smith went to Washington D.C. on Monday.", "He left."],
        ),
        (
            "Einstein was born in Ulm, Germany. He died in Princeton, N.J., in 1955.",
            ["Einstein was born in Ulm, Germany.", "He died in Princeton, N.J., in 1955."],
        ),
        (
            "  First paragraph. Still first.\n\n   \nSecond paragraph, no full stop\r\nThird? Yes!  ",
            ["First paragraph.", "Still first.", "Second paragraph, no full stop", "Third?", "Yes!"],
        ),
        ("Zürich liegt am See. 東京は日本の首都です。", ["Zürich liegt am See.", "東京は日本の首都です。"]),
        ("", []),
        (" \n\t\n ", []),
    ],
)
def test_split_sentences(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    # Where sentencex and pysbd (the splitter before it) differ on Wikipedia text: "c." before a year,
    # an abbreviation ending a sentence, sentences glued without a space (common in LAMA's evidence).
    [
        (
            "He was born c. 1500 in Rome. He died in 1560.",
            ["He was born c. 1500 in Rome.", "He died in 1560."],
        ),
        (
            "It was built in the 4th century B.C. The temple survives.",
            ["It was built in the 4th century B.C.", "The temple survives."],
        ),
        (
            "Einstein was born in Ulm.He moved to Munich.",
            ["Einstein was born in Ulm.", "He moved to Munich."],
        ),
        ("He asked Mr.?! Nobody answered.", ["He asked Mr.?!", "Nobody answered."]),
    ],
)
def test_wikipedia_boundaries(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "J. R. R. Tolkien wrote The Hobbit while George H. W. Bush was young.",
        "It cost $3.14 in 1999, and pi is 3.14159 approximately.",
        '"I am here." she said.',
        "Mr. and Mrs. Jones met Prof. Brown on Main St. at 5 p.m. with Gen. Lee, e.g. at noon.",
        "Vladimir Lenin (22 April [O.S. 10 April] 1870 – 21 January 1924) was a revolutionary.",
        "The U.S. Army and Acme Inc. fought in Smith v. Jones (see Fig. 3), i.e. in court.",
    ],
)
def test_initials_decimals_abbreviations_and_quotes_do_not_split(text: str) -> None:
    assert split_sentences(text) == [text]


def test_no_text_is_lost_on_real_wikipedia_and_lama_evidence(shared_data: Path) -> None:
    wiki = (
        shared_data / "wiki-sample" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    )
    articles = [*read_articles(wiki), *evidence_articles([shared_data / "lama" / "TREx"])]
    assert len(articles) > 20_000
    for article in articles:
        sentences = split_sentences(article.text)
        assert visible("".join(sentences)) == visible(article.text)
        assert all(sentence and sentence == sentence.strip() for sentence in sentences)


ABBREVIATIONS = ["Dr.", "Mr.", "U.S.", "e.g.", "etc.", "No.", "St.", "p.m.", "1.", "(a)", "3.14", "..."]
WORDS = ["the", "Smith", "went", "home", "Zürich", "東京", ".", "?", "!", "?!", "!!", ",", ";", '"', "(", ")"]
SPACES = [" ", "  ", "\n", "\n\n", "\t", "\u00a0", "\u2028", "\r\n"]
PROSE = st.lists(st.sampled_from([*ABBREVIATIONS, *WORDS, *SPACES]), max_size=40).map(" ".join)


@given(st.one_of(PROSE, st.text(max_size=80)))
@settings(max_examples=400, deadline=None)
@pytest.mark.reliability
def test_no_text_is_lost_and_no_sentence_is_empty(text: str) -> None:
    sentences = split_sentences(text)
    assert visible("".join(sentences)) == visible(text)
    assert all(sentence and sentence == sentence.strip() for sentence in sentences)
    assert not any(char in sentence for sentence in sentences for char in LINE_BREAKS)


@given(st.lists(PROSE, min_size=1, max_size=4))
@settings(max_examples=100, deadline=None)
@pytest.mark.reliability
def test_paragraphs_split_independently(paragraphs: list[str]) -> None:
    text = "\n".join(paragraphs)
    assert split_sentences(text) == [s for p in paragraphs for s in split_sentences(p)]


def test_a_huge_paragraph_is_split_whole_and_loses_nothing() -> None:
    # A 50 MB line once cost pysbd days (its time grows with the square of its input); sentencex is linear.
    paragraph = " ".join(f"Zorblat met poet number {i} in Quenton." for i in range(2000))  # ~80,000 chars
    out = split_sentences(paragraph + "\nA short one. Another.")
    assert "".join("".join(out).split()) == "".join((paragraph + "A short one. Another.").split())
    assert out[:2] == ["Zorblat met poet number 0 in Quenton.", "Zorblat met poet number 1 in Quenton."]
    assert out[-2:] == ["A short one.", "Another."]
    assert len(out) == 2002
