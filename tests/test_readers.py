"""Tests for ingest.readers: every corpus format, directory input, limits, errors and the shared samples."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import re
from collections.abc import Callable
from pathlib import Path
from xml.sax.saxutils import escape

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertknn_search.errors import ConfigError, InputFormatError
from bertknn_search.ingest import xml_dump
from bertknn_search.ingest.readers import FORMATS, detect_format, read_articles
from bertknn_search.records import Article

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "wiki-sample"
GENSIM_DUMP = SHARED / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
EXTRACTED = SHARED / "wikiextractor-featured"

ZURICH_WIKITEXT = """{{Infobox settlement
| name = Zürich
| population = 421,878
}}
'''Zürich''' ({{IPA-de|ˈtsyːrɪç}}; {{lang-gsw|Züri}}) is the [[List of cities in Switzerland|largest city]] \
in [[Switzerland]].<ref>{{cite web|url=http://example.org|title=Stats}}</ref> It lies on [[Lake Zurich]].\
<ref name="fso"/>
[[File:Zurich skyline.jpg|thumb|The skyline of ''Zürich'']]
<!-- editors: keep this short -->
== History ==
The city was founded by the Romans &amp; called ''Turicum''.<br />It grew in the Middle Ages.
{| class="wikitable"
! Year !! Population
|-
| 1900 || 150,703
|}
* [[Geneva]]
* Zürich is a [[global city]] and among the world's largest financial centres.
__NOTOC__
[[Category:Cities in Switzerland]]
[[de:Zürich]]"""
ZURICH_TEXT = (
    "Zürich is the largest city in Switzerland. It lies on Lake Zurich.\n"
    "The city was founded by the Romans & called Turicum. It grew in the Middle Ages.\n"
    "Zürich is a global city and among the world's largest financial centres."
)


def page(page_id: int, title: str, *texts: str, ns: int = 0, redirect: bool = False) -> str:
    revisions = "".join(
        f'<revision><id>{page_id * 10 + i}</id><text xml:space="preserve">{escape(t)}</text></revision>'
        for i, t in enumerate(texts)
    )
    marker = '<redirect title="Target" />' if redirect else ""
    return f"<page><title>{escape(title)}</title><ns>{ns}</ns><id>{page_id}</id>{marker}{revisions}</page>\n"


def dump(*pages: str, version: str = "0.10") -> str:
    xmlns = f"http://www.mediawiki.org/xml/export-{version}/"
    head = f'<mediawiki xmlns="{xmlns}" version="{version}" xml:lang="en">'
    return f"{head}\n<siteinfo><sitename>Wikipedia</sitename></siteinfo>\n{''.join(pages)}</mediawiki>\n"


WIKI_PAGES = (
    page(10, "Zürich", "old text", ZURICH_WIKITEXT),
    page(11, "Zurich", "#REDIRECT [[Zürich]]", redirect=True),
    page(12, "Zuerich", "#redirect [[Zürich]]"),  # old dumps: no <redirect> element, only the text
    page(13, "Talk:Zürich", "Where is the lake?", ns=1),
    page(14, "東京", "{{Infobox}}\n[[Category:Cities]]"),
    page(15, "Tokyo Bay", "'''Tokyo Bay''' is a [[bay]] in [[Japan|the south of Japan]]."),
)
WIKI_ARTICLES = [
    Article("10", "Zürich", ZURICH_TEXT),
    Article("14", "東京", ""),
    Article("15", "Tokyo Bay", "Tokyo Bay is a bay in the south of Japan."),
]


def doc(doc_id: str, title: str, *paragraphs: str) -> str:
    url = f"https://en.wikipedia.org/wiki?curid={doc_id}"
    body = "\n".join(paragraphs)
    return f'<doc id="{doc_id}" url="{url}" title="{title}">\n{title}\n\n{body}\n</doc>\n'


def write(path: Path, data: str | bytes, opener: Callable[..., object] = open) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with opener(path, "wb") as out:  # type: ignore[operator]
        out.write(raw)
    return path


def jsonl(rows: list[dict[str, object]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def one_line_error(path: Path, exc: pytest.ExceptionInfo[InputFormatError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    assert str(path) in message
    return message


# --- formats ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.10", "0.8"])
@pytest.mark.parametrize(
    "name, opener", [("dump.xml", open), ("dump.xml.bz2", bz2.open), ("dump.xml.xz", lzma.open)]
)
def test_xml_dump_yields_latest_revision_of_articles_as_prose(
    tmp_path: Path, version: str, name: str, opener: Callable[..., object]
) -> None:
    path = write(tmp_path / name, dump(*WIKI_PAGES, version=version), opener)
    assert list(read_articles(path)) == WIKI_ARTICLES


def test_jsonl_plain_and_compressed_with_int_ids(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {"id": 7, "url": "https://x", "title": " Zürich ", "text": "  Zürich is a city.\nIt is big. \n"},
        {"id": "東京-1", "title": "東京", "text": ""},
    ]
    expected = [Article("7", "Zürich", "Zürich is a city.\nIt is big."), Article("東京-1", "東京", "")]
    for name, opener in [
        ("a.jsonl", open),
        ("b.json", open),
        ("c.jsonl.gz", gzip.open),
        ("d.jsonl.bz2", bz2.open),
        ("e.jsonl.xz", lzma.open),
    ]:
        assert list(read_articles(write(tmp_path / name, jsonl(rows), opener))) == expected


def test_parquet_in_batches_with_int_ids(tmp_path: Path) -> None:
    n = 600  # more than one record batch
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "url": [f"https://x/{i}" for i in range(n)],
            "title": ["Zürich" if i == 0 else f"Title {i}" for i in range(n)],
            "text": [f" Text {i}.\n" for i in range(n)],
        }
    )
    pq.write_table(table, tmp_path / "wiki.parquet", row_group_size=250)
    articles = list(read_articles(tmp_path / "wiki.parquet"))
    assert articles == [Article(str(i), "Zürich" if i == 0 else f"Title {i}", f"Text {i}.") for i in range(n)]


def test_wikiextractor_drops_the_repeated_title(tmp_path: Path) -> None:
    anarchism = doc("12", "Anarchism", "Anarchism is a philosophy.", "", "It rejects hierarchy.")
    assert list(read_articles(write(tmp_path / "AA" / "wiki_00", anarchism + doc("25", "東京")))) == [
        Article("12", "Anarchism", "Anarchism is a philosophy.\nIt rejects hierarchy."),
        Article("25", "東京", ""),
    ]


def test_directory_reads_every_file_sorted_each_in_its_format(tmp_path: Path) -> None:
    write(tmp_path / "AB" / "wiki_00", doc("3", "Gamma", "Third."))
    write(tmp_path / "AA" / "wiki_01", doc("2", "Beta", "Second."))
    write(tmp_path / "AA" / "wiki_00", doc("1", "Alpha", "First."))
    write(tmp_path / "extra.jsonl", jsonl([{"id": 4, "title": "Delta", "text": "Fourth."}]))
    write(tmp_path / "pages.xml.bz2", dump(page(5, "Epsilon", "Fifth.")), bz2.open)
    write(tmp_path / ".DS_Store", b"\x00\x01 not a corpus")
    write(tmp_path / ".git" / "HEAD", "ref: refs/heads/main")
    titles = [a.title for a in read_articles(tmp_path)]
    assert titles == ["Alpha", "Beta", "Gamma", "Delta", "Epsilon"]
    assert [a.title for a in read_articles(tmp_path, limit=2)] == ["Alpha", "Beta"]


def test_limit_and_fmt_override(tmp_path: Path) -> None:
    path = write(tmp_path / "corpus.txt", jsonl([{"id": i, "title": f"T{i}", "text": "x"} for i in range(5)]))
    assert [a.id for a in read_articles(path, limit=3, fmt="jsonl")] == ["0", "1", "2"]
    assert list(read_articles(path, limit=0)) == []
    assert len(list(read_articles(path, limit=99))) == 5
    with pytest.raises(ConfigError, match="limit"):
        read_articles(path, limit=-1)


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("dump.xml", "<mediawiki/>", "xml"),
        ("dump.xml.bz2", "<mediawiki/>", "xml"),
        ("enwiki-latest-pages-articles1.xml-p10p30302-shortened.bz2", "<mediawiki/>", "xml"),
        ("a.jsonl.gz", "{}", "jsonl"),
        ("a.jsonl.xz", "{}", "jsonl"),
        ("wiki_00.xz", '<doc id="1" url="u" title="t">\n</doc>\n', "wikiextractor"),
        ("a.json", "{}", "jsonl"),
        ("wiki_00", '<doc id="1" url="u" title="t">\n</doc>\n', "wikiextractor"),
        ("no-suffix", '{"id": 1}', "jsonl"),
        ("x.parquet", "", "parquet"),
    ],
)
def test_detect_format(tmp_path: Path, name: str, content: str, expected: str) -> None:
    opener = {".bz2": bz2.open, ".gz": gzip.open, ".xz": lzma.open}.get(Path(name).suffix, open)
    assert detect_format(write(tmp_path / name, content, opener)) == expected
    assert expected in FORMATS


def test_detect_format_of_a_directory(tmp_path: Path) -> None:
    assert detect_format(tmp_path) == "directory"


@given(
    st.lists(
        st.tuples(
            st.integers() | st.text(min_size=1).filter(str.strip),
            st.text(min_size=1).filter(str.strip),  # every article has a title
            st.text(),
            st.booleans(),
        ),
        max_size=8,
    )
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@pytest.mark.reliability
def test_jsonl_round_trip(tmp_path: Path, rows: list[tuple[int | str, str, str, bool]]) -> None:
    path = tmp_path / "round.jsonl"
    lines = [json.dumps({"id": i, "title": t, "text": x}, ensure_ascii=a) + "\n" for i, t, x, a in rows]
    path.write_text("".join(lines), encoding="utf-8")
    expected = [Article(str(i).strip(), t.strip(), x.strip()) for i, t, x, _ in rows]
    assert list(read_articles(path)) == expected


# --- errors ----------------------------------------------------------------------------------------


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(InputFormatError) as exc:
        read_articles(tmp_path / "nope.xml.bz2")
    assert "no such file" in one_line_error(tmp_path / "nope.xml.bz2", exc)


def test_unknown_format_names_the_supported_ones(tmp_path: Path) -> None:
    path = write(tmp_path / "notes.txt", "just some notes\n")
    with pytest.raises(InputFormatError) as exc:
        read_articles(path)
    message = one_line_error(path, exc)
    assert "unknown corpus format" in message and "JSON Lines" in message and "WikiExtractor" in message
    with pytest.raises(InputFormatError, match="unknown format 'csv'"):
        read_articles(path, fmt="csv")


def test_unknown_file_inside_a_directory(tmp_path: Path) -> None:
    write(tmp_path / "AA" / "wiki_00", doc("1", "Alpha", "First."))
    bad = write(tmp_path / "README.md", "# corpus\n")
    with pytest.raises(InputFormatError) as exc:
        list(read_articles(tmp_path))
    assert "unknown corpus format" in one_line_error(bad, exc)


def test_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(InputFormatError) as exc:
        list(read_articles(tmp_path))
    assert "no corpus files" in one_line_error(tmp_path, exc)


def corrupt(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0x55 for b in data[middle : middle + 16]) + data[middle + 16 :]


LONG_DUMP = dump(
    *(page(i, f"Page {i}", f"Article number {i} is about {i * 7919 % 1000}.") for i in range(1, 400))
)
LONG_JSONL = jsonl([{"id": i, "title": f"T{i}", "text": f"Text {i * 7919 % 1000}."} for i in range(2000)])


@pytest.mark.parametrize(
    "name, raw, damage, expected",
    [
        ("dump.xml.bz2", bz2.compress(LONG_DUMP.encode()), lambda b: b[: len(b) // 2], "ends early"),
        ("dump.xml.bz2", bz2.compress(LONG_DUMP.encode()), corrupt, "corrupt"),
        ("rows.jsonl.gz", gzip.compress(LONG_JSONL.encode()), lambda b: b[: len(b) // 2], "ends early"),
        ("rows.jsonl.gz", gzip.compress(LONG_JSONL.encode()), corrupt, "corrupt"),
        ("rows.jsonl.xz", lzma.compress(LONG_JSONL.encode()), lambda b: b[: len(b) // 2], "ends early"),
        ("rows.jsonl.xz", lzma.compress(LONG_JSONL.encode()), corrupt, "corrupt"),
    ],
)
@pytest.mark.reliability
def test_truncated_or_corrupt_compression(
    tmp_path: Path, name: str, raw: bytes, damage: Callable[[bytes], bytes], expected: str
) -> None:
    path = write(tmp_path / name, damage(raw))
    with pytest.raises(InputFormatError) as exc:
        list(read_articles(path))
    assert expected in one_line_error(path, exc)


@pytest.mark.reliability
def test_malformed_xml_names_the_line(tmp_path: Path) -> None:
    broken = page(2, "Bad", "Oops.").replace("</title>", "</titel>")
    path = write(tmp_path / "bad.xml", dump(page(1, "Good", "Fine."), broken, page(3, "Never", "Reached.")))
    articles = read_articles(path)
    assert next(articles) == Article("1", "Good", "Fine.")  # the error comes after what was readable
    with pytest.raises(InputFormatError) as exc:
        next(articles)
    assert re.search(r"malformed XML \(mismatched tag: line 4, column \d+\)", one_line_error(path, exc))


@pytest.mark.reliability
def test_xml_not_utf8(tmp_path: Path) -> None:
    path = write(tmp_path / "latin1.xml", dump(page(1, "Zürich", "Zürich.")).encode("latin-1"))
    with pytest.raises(InputFormatError) as exc:
        list(read_articles(path))
    assert re.search(
        r"malformed XML \(not well-formed \(invalid token\): line 3, column \d+\)", one_line_error(path, exc)
    )


@pytest.mark.reliability
def test_jsonl_not_utf8_names_line_and_offset(tmp_path: Path) -> None:
    first = b'{"id": 1, "title": "A", "text": "ok"}\n'
    path = write(
        tmp_path / "rows.jsonl", first + '{"id": 2, "title": "Zürich", "text": ""}\n'.encode("latin-1")
    )
    articles = read_articles(path)
    assert next(articles) == Article("1", "A", "ok")
    with pytest.raises(InputFormatError) as exc:
        next(articles)
    offset = len(first) + len(b'{"id": 2, "title": "Z')
    assert f"line 2 is not UTF-8 (byte 0xfc at offset {offset})" in one_line_error(path, exc)


@pytest.mark.reliability
@pytest.mark.parametrize(
    "line, expected",
    [
        ("not json at all", "line 3 is not JSON (Expecting value, column 1)"),
        ('{"id": 3, "title": "C"}', "line 3 lacks text"),
        ('{"title": "C"}', "line 3 lacks id, text"),
        ("[1, 2, 3]", "line 3 is not an object"),
        ('{"id": null, "title": "C", "text": ""}', "line 3 has id None"),
        ('{"id": 3, "title": "C", "text": 5}', "line 3 has a title or text that is not a string"),
    ],
)
def test_bad_jsonl_line(tmp_path: Path, line: str, expected: str) -> None:
    good = jsonl([{"id": 1, "title": "A", "text": "a"}, {"id": 2, "title": "B", "text": "b"}])
    path = write(tmp_path / "rows.jsonl", good + line + "\n")
    read: list[Article] = []
    with pytest.raises(InputFormatError) as exc:
        read.extend(read_articles(path))
    assert [a.id for a in read] == ["1", "2"]
    assert expected in one_line_error(path, exc)


@pytest.mark.reliability
def test_parquet_without_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "wiki.parquet"
    pq.write_table(pa.table({"id": [1], "content": ["x"]}), path)
    with pytest.raises(InputFormatError) as exc:
        list(read_articles(path))
    assert "lacks column(s) title, text" in one_line_error(path, exc)


@pytest.mark.reliability
def test_parquet_that_is_not_parquet(tmp_path: Path) -> None:
    path = write(tmp_path / "wiki.parquet", b"PAR1 this is not really parquet")
    with pytest.raises(InputFormatError) as exc:
        list(read_articles(path))
    assert "not a readable parquet file" in one_line_error(path, exc)


@pytest.mark.reliability
@pytest.mark.parametrize(
    "content, expected",
    [
        (
            doc("1", "A", "a") + '<doc id="2" url="u" title="B">\nB\n\nb\n',
            "the <doc> of line 6 is never closed",
        ),
        ('<doc id="1" url="u" title="A">\n<doc id="2" url="u" title="B">\n', "line 2 opens a <doc> inside"),
        (doc("1", "A", "a") + "stray text\n", "line 6 is outside any <doc>"),
    ],
)
def test_broken_wikiextractor_file(tmp_path: Path, content: str, expected: str) -> None:
    path = write(tmp_path / "wiki_00", content)
    with pytest.raises(InputFormatError) as exc:
        list(read_articles(path))
    assert expected in one_line_error(path, exc)


# --- articles over the size limit ------------------------------------------------------------------


def read_skipping(path: Path, max_bytes: int) -> tuple[list[str], list[str]]:
    """The ids read with ``max_bytes`` as the limit, and the messages of the articles skipped."""
    skipped: list[str] = []
    ids = [a.id for a in read_articles(path, max_bytes=max_bytes, on_skip=skipped.append)]
    return ids, skipped


def too_large(path: Path, where: str, size: int, max_bytes: int) -> str:
    return (
        f"{path}: {where} holds {size:,} bytes, more than the {max_bytes:,} one article may hold"
        " (--max-article-bytes): skipped"
    )


@pytest.mark.reliability
def test_a_jsonl_line_is_held_up_to_the_limit_and_no_further(tmp_path: Path) -> None:
    rows = [{"id": 1, "title": "A", "text": "a"}, {"id": 2, "title": "Big", "text": "ü" * 100_000}]
    lines = [json.dumps(row, ensure_ascii=False).encode() + b"\n" for row in [*rows, {**rows[0], "id": 3}]]
    path = write(tmp_path / "rows.jsonl.gz", b"".join(lines), gzip.open)
    longest = len(lines[1]) - 1  # the line without its end; longer than a piece read at a time
    assert read_skipping(path, longest) == (["1", "2", "3"], [])
    assert read_skipping(path, longest - 1) == (
        ["1", "3"],
        [too_large(path, "line 2", len(lines[1]), longest - 1)],
    )
    # Lines and offsets are still counted right after a skipped line.
    bad = write(tmp_path / "bad.jsonl", b"".join(lines) + '{"id": 4, "title": "Zürich"}\n'.encode("latin-1"))
    with pytest.raises(InputFormatError) as exc:
        read_skipping(bad, 100)
    offset = sum(map(len, lines)) + len(b'{"id": 4, "title": "Z')
    assert f"line 4 is not UTF-8 (byte 0xfc at offset {offset})" in one_line_error(bad, exc)


@pytest.mark.reliability
def test_an_xml_page_over_the_limit_is_skipped_by_its_wikitext_bytes(tmp_path: Path) -> None:
    big = "ü" * 600  # 600 characters, 1,200 bytes
    path = write(
        tmp_path / "dump.xml.bz2",
        dump(
            page(1, "Small", "Fine."),
            page(2, "Big", "old revision", big),
            page(3, "Talk:Big", big, ns=1),  # not an article: skipped without a word, as before
            page(4, "Redirect", "#REDIRECT [[Big]] " + big),
            page(5, "Later", big, "Short again."),  # only the last revision counts
            page(6, "Tail", "Fine too."),
        ),
        bz2.open,
    )
    assert read_skipping(path, 1200) == (["1", "2", "5", "6"], [])
    assert read_skipping(path, 1199) == (["1", "5", "6"], [too_large(path, "page 2 ('Big')", 1200, 1199)])


def test_xml_fed_in_tiny_pieces_reads_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "dump.xml", dump(*WIKI_PAGES))
    monkeypatch.setattr(xml_dump, "_PIECE", 7)  # pages, tags and entities split across reads
    assert list(read_articles(path)) == WIKI_ARTICLES


@pytest.mark.reliability
def test_an_xml_tag_longer_than_the_limit_refuses_the_file_after_the_pages_before_it(tmp_path: Path) -> None:
    # Expat holds a tag until it ends, so no page can be skipped: this is not a dump.
    tag = f'<page><title lang="{"a" * 300_000}">Bomb</title></page>'
    path = write(tmp_path / "dump.xml", dump(page(1, "Small", "Fine."), tag))
    articles = read_articles(path, max_bytes=1000)
    assert next(articles).id == "1"
    with pytest.raises(InputFormatError) as exc:
        next(articles)
    assert re.search(
        r"the [\d,]+ bytes of XML before byte [\d,]+ hold no element or text, more than the 1,000 an article"
        r" may hold: one tag, comment or declaration that long is not a MediaWiki dump",
        one_line_error(path, exc),
    )


@pytest.mark.reliability
def test_xml_nested_past_any_dump_refuses_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "dump.xml.gz", dump(page(1, "Small", "Fine."), "<a>" * 100_000), gzip.open)
    articles = read_articles(path)
    assert next(articles).id == "1"
    with pytest.raises(InputFormatError) as exc:
        next(articles)
    assert "elements nested more than 100 deep at line 4; not a MediaWiki dump" in one_line_error(path, exc)


@pytest.mark.reliability
def test_a_wikiextractor_doc_over_the_limit_is_skipped_line_by_line(tmp_path: Path) -> None:
    many = [f"Line {i} of a long article." for i in range(100)]
    docs = [
        doc("1", "Small", "Fine."),
        doc("2", "Long", *many),
        doc("3", "Huge", "x" * 5000),
        doc("4", "Tail", "Ok."),
    ]
    path = write(tmp_path / "wiki_00.xz", "".join(docs), lzma.open)

    def body(d: str) -> int:  # bytes between the <doc> line and </doc>
        return len(d.split("\n", 1)[1].rsplit("</doc>", 1)[0].encode())

    assert read_skipping(path, 2000) == (
        ["1", "4"],
        [
            too_large(path, "the <doc> of line 6 (id 2, 'Long')", body(docs[1]), 2000),
            too_large(path, "the <doc> of line 110 (id 3, 'Huge')", body(docs[2]), 2000),
        ],
    )
    assert read_skipping(path, body(docs[1]))[0] == ["1", "2", "4"]


@pytest.mark.reliability
def test_a_parquet_text_over_the_limit_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "wiki.parquet"
    pq.write_table(
        pa.table({"id": [1, 2, 3], "title": ["A", "Big", "C"], "text": ["a", "ü" * 600, "c"]}), path
    )
    assert read_skipping(path, 1199) == (["1", "3"], [too_large(path, "row 2 (id 2, 'Big')", 1200, 1199)])


@pytest.mark.reliability
def test_a_parquet_row_group_over_its_bound_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "wiki.parquet"
    texts = ["short"] * 5 + ["x" * 30_000]  # 30,000 bytes: more than 256 articles of 100 bytes
    table = pa.table({"id": list(range(6)), "title": [f"T{i}" for i in range(6)], "text": texts})
    pq.write_table(table, path, row_group_size=5, compression="zstd")
    articles = read_articles(path, max_bytes=100)
    assert [next(articles).id for _ in range(5)] == ["0", "1", "2", "3", "4"]
    with pytest.raises(InputFormatError) as exc:
        next(articles)
    message = one_line_error(path, exc)
    assert (
        "row group 2 holds" in message and "more than 25,600 (256 articles of --max-article-bytes)" in message
    )
    assert message.endswith("write the file with smaller row groups (row_group_size=1000)")


def test_the_limit_must_be_positive(tmp_path: Path) -> None:
    path = write(tmp_path / "rows.jsonl", jsonl([{"id": 1, "title": "A", "text": "a"}]))
    with pytest.raises(ConfigError, match="max_bytes must be 1 or more, not 0"):
        read_articles(path, max_bytes=0)


# --- the shared Wikipedia samples ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"shared Wikipedia samples not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="module")
def gensim_articles(shared: Path) -> list[Article]:
    return list(read_articles(GENSIM_DUMP))


def test_gensim_fragment_yields_every_non_redirect_article(gensim_articles: list[Article]) -> None:
    # Counted independently of the reader: plain regexes over the decompressed XML.
    pages = re.findall(r"<page>.*?</page>", bz2.decompress(GENSIM_DUMP.read_bytes()).decode(), re.S)
    articles = [p for p in pages if "<ns>0</ns>" in p and "<redirect" not in p]
    ids = [re.search(r"<id>(\d+)</id>", p).group(1) for p in articles]  # type: ignore[union-attr]
    assert len(pages) == 206
    assert [a.id for a in gensim_articles] == ids
    assert len(gensim_articles) == 106


def test_gensim_fragment_has_clean_prose(gensim_articles: list[Article]) -> None:
    einstein = next(a for a in gensim_articles if a.title == "Albert Einstein")
    assert einstein.id == "736"
    assert einstein.text.startswith(
        "Albert Einstein (14 March 1879 – 18 April 1955) was a German-born theoretical physicist."
    )
    text = "\n".join(a.text for a in gensim_articles)
    for junk in ("{{", "}}", "[[Category:", "<ref", "&nbsp;", "|-", "thumb|"):
        assert junk not in text
    assert sum(1 for a in gensim_articles if a.text) == 105  # "List of anthropologists" is only a list


def test_table_markup_sample_reads_as_prose(shared: Path) -> None:
    articles = list(read_articles(shared / "enwiki-table-markup.xml.bz2"))
    assert [a.title for a in articles] == [
        "Constructive vote of no confidence",
        "List of Prison Break characters",
        "Academy Award for Best Production Design",
        "Economy of Estonia",
        "Brahui language",
    ]
    lines = [line for a in articles for line in a.text.split("\n")]
    assert not [line for line in lines if re.match(r"[|!{}]", line) or "||" in line or "wikitable" in line]
    assert articles[0].text.startswith("The constructive vote of no confidence (in German: konstruktives")


def test_wikiextractor_featured_sample(shared: Path) -> None:
    files = sorted(EXTRACTED.iterdir())
    expected = sum(len(re.findall(r'^<doc id="', f.read_text("utf-8"), re.M)) for f in files)
    articles = list(read_articles(EXTRACTED))
    assert len(files) == 6 and expected == 156 and len(articles) == 156
    jackson = next(a for a in articles if a.title == "Andrew Jackson")
    assert not jackson.text.startswith("Andrew Jackson\n")
    assert "seventh president of the United States" in jackson.text
    assert all(a.text for a in articles)


def test_mwxml_synthetic_dump(shared: Path) -> None:
    # export-0.8, two revisions of page 1 (the latest wins), page 2 is in the Talk namespace.
    assert list(read_articles(shared / "mwxml-dump.xml")) == [Article("1", "Foo", "Revision 2 text")]


def test_an_optional_popularity_column_is_read_from_jsonl_and_parquet(tmp_path: Path) -> None:
    rows = [
        {"id": "1", "title": "Zorblat", "text": "Zorblat was born in Quenton.", "popularity": 1234},
        {"id": "2", "title": "Mirvane", "text": "Mirvane was born in Oskavel.", "popularity": None},
    ]
    jsonl = tmp_path / "pop.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    table = tmp_path / "pop.parquet"
    pq.write_table(pa.Table.from_pylist(rows), table)
    for path in (jsonl, table):
        assert [a.popularity for a in read_articles(path)] == [1234.0, None]
    jsonl.write_text(json.dumps({**rows[0], "popularity": "many"}) + "\n", encoding="utf-8")
    with pytest.raises(InputFormatError, match=r"line 1 has popularity 'many'; use a number >= 0"):
        list(read_articles(jsonl))
