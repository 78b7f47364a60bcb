"""Issue 34: input built to hurt. Wikitext that crashes or stalls mwparserfromhell's C tokenizer, an XML
namespace-prefix bomb, and stored text rows that are zstd bombs, another article's text or not text."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from xml.sax.saxutils import escape

import pytest
import zstandard
from click.testing import CliRunner

from bertknn_search.backends.embedded.backend import EmbeddedBackend
from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.errors import IndexCorruptError, InputFormatError
from bertknn_search.ingest import page_parse, wikitext
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.readers import read_articles
from tests.test_wikitext import REAL_PAGES, _pages

pytestmark = pytest.mark.reliability

# A heading line of 100,000 "=" runs: the C tokenizer recurses once per run and overflows its stack.
CRASH = "===x" * 100_000
# Constructs that never close, each many times: the tokenizer's time grows with the square of the page
# (or faster). Parsed whole, each of these took 21 to 41 s of CPU on this project's VM, 5 to 12 times its
# bound (``page_parse.parse_bound``: 3.3 to 4.6 s at these sizes), so each still runs past it on a faster one.
QUADRATIC = {
    "template": "{{a|b=" * 5_000,
    "table": "{|\n" * 20_000,
    "link": "[[a|" * 22_000,
    "bold": "<b>" * 20_000,
    "html-table": "<table>" * 14_000,
    "nowiki": "<nowiki>" * 20_000,
}
ORDINARY = [
    "'''Zorblat''' was a [[painter]] born in {{convert|3|km}} of [[Quenton|the town of Quenton]].",
    "Mirvane is a river.<ref>A source.</ref>\n== Course ==\nIt runs through [[Farrow]]. {{Infobox|x=1}}",
    "{{nowrap|Ada}} was a poet.\n* a list item\n{| class=wikitable\n| cell\n|}\nShe lived in Ulm.",
]


def dump(path: Path, pages: list[tuple[str, str]]) -> Path:
    """A MediaWiki export of ``pages`` (title, wikitext), ids 1, 2, ..."""
    body = "".join(
        f"<page><title>{escape(title)}</title><ns>0</ns><id>{i}</id>"
        f"<revision><text>{escape(text)}</text></revision></page>"
        for i, (title, text) in enumerate(pages, 1)
    )
    path.write_text(f'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">{body}</mediawiki>')
    return path


def run_ingest(source: Path, index: Path, model: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``bertknn-search ingest wiki`` in its own process: a crash of the parser shows as its exit status."""
    args = ["ingest", "wiki", str(source), "--index", str(index), "--model", str(model), "--max-length", "64"]
    return subprocess.run(
        [sys.executable, "-m", "bertknn_search", *args, "--no-progress", "--json", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def warnings_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


# --- 1. wikitext that crashes or stalls the parser ----------------------------------------------------------


@pytest.mark.slow  # an ingest process, model load included
def test_pages_that_crash_or_stall_the_parser_are_named_and_the_ingest_finishes(
    tiny_model: Path, tmp_path: Path
) -> None:
    # Before: the crash page killed the ingest (exit 139, and every re-run on the same page), and the
    # others held it for minutes.
    bad = [("Crash", "Zorblat was a poet.\n" + CRASH)]
    bad += [
        (name.title(), f"{name.title()} was a poet of Quenton.\n{text}") for name, text in QUADRATIC.items()
    ]
    pages = [(f"Ordinary {i}", text) for i, text in enumerate(ORDINARY)]
    pages = [pages[0], *bad[:4], pages[1], *bad[4:], pages[2]]
    source = dump(tmp_path / "hostile.xml", pages)
    started = time.perf_counter()
    done = run_ingest(source, tmp_path / "index", tiny_model, timeout=300)
    seconds = time.perf_counter() - started
    assert done.returncode == 0, done.stderr[-2000:]
    assert seconds < 120, f"the ingest took {seconds:.0f} s"
    summary = json.loads(done.stdout)
    ids = {title: str(i) for i, (title, _) in enumerate(pages, 1)}
    assert (summary["articles"], summary["unparsed"]) == (len(pages), len(bad))
    said = warnings_of(done.stderr)
    assert len(said) == len(bad), done.stderr
    for (title, _), line in zip(bad, said):
        assert line.startswith(f"warning: {source}: page {ids[title]} ({title!r}): the wikitext parser "), (
            line
        )
        assert line.endswith("; its markup was stripped by the plain fallback"), line
    assert "crashed on it (SIGSEGV)" in said[0]
    assert all(" ran past its bound of " in line for line in said[1:]), said
    backend = EmbeddedBackend.open(tmp_path / "index")
    try:
        stored = {p.article.title: p.article.text for p in backend.unencoded(list(ids.values()))}
    finally:
        backend.close()
    for title, text in pages:
        expected = wikitext.plain_text(text) if (title, text) in bad else wikitext.wikitext_to_text(text)
        assert stored[title] == expected, title
    assert stored["Crash"] == "Zorblat was a poet."
    assert stored["Template"] == "Template was a poet of Quenton."


@pytest.mark.slow
def test_a_rerun_goes_on_past_a_page_that_crashes_the_parser(tiny_model: Path, tmp_path: Path) -> None:
    source = dump(tmp_path / "crash.xml", [("A", ORDINARY[0]), ("Crash", "Zorblat was a poet.\n" + CRASH)])
    for run in range(2):
        done = run_ingest(source, tmp_path / "index", tiny_model, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        summary = json.loads(done.stdout)
        assert (summary["articles"], summary["already_stored"], summary["unparsed"]) == (
            (2, 0, 1) if run == 0 else (0, 2, 1)
        )
        assert len(warnings_of(done.stderr)) == 1, done.stderr


def test_a_page_past_its_time_bound_gets_the_fallback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(page_parse, "PARSE_SECONDS", 0.5)
    monkeypatch.setattr(page_parse, "PARSE_SECONDS_PER_MB", 0.0)
    page = "Zorblat was a poet.\n" + QUADRATIC["template"]  # 41 s of CPU, parsed whole
    source = dump(tmp_path / "slow.xml", [("Slow", page), ("After", "Mirvane was a poet.")])
    said: list[str] = []
    started = time.perf_counter()
    articles = list(read_articles(source, on_unparsed=said.append))
    assert time.perf_counter() - started < 30  # the CPU-time bound plus a new child, on a busy VM
    assert [(a.title, a.text) for a in articles] == [
        ("Slow", "Zorblat was a poet."),
        ("After", "Mirvane was a poet."),
    ]
    assert said == [
        f"{source}: page 1 ('Slow'): the wikitext parser ran past its bound of 0.5 s for {len(page):,}"
        " characters; its markup was stripped by the plain fallback"
    ]


@pytest.mark.parametrize("name", sorted(REAL_PAGES))
def test_ordinary_pages_parsed_in_the_child_give_the_text_they_gave_before(
    shared_data: Path, name: str
) -> None:
    pages = _pages(shared_data / "wiki-sample" / name)
    digest = REAL_PAGES[name][1]
    parsed = [page_parse.page_text(p) for p in pages]
    assert {why for _, why in parsed} == {None}
    assert hashlib.sha256("\x1e".join(text for text, _ in parsed).encode()).hexdigest() == digest


@pytest.mark.parametrize(
    ("markup", "prose"),
    [
        (ORDINARY[0], "Zorblat was a painter born in of the town of Quenton."),  # no template is rendered
        (ORDINARY[1], "Mirvane is a river.\nIt runs through Farrow."),
        (ORDINARY[2], "was a poet.\nShe lived in Ulm."),
        (
            "[[File:a.jpg|thumb|A [[b|c]]]] d [[Category:X]] [[de:Y]] e&amp;f <!-- c --> [http://x.org g]",
            "d e&f g",
        ),
        ("See <nowiki>[[n]]</nowiki> <math>x</math> <gallery>a</gallery> a<br/>b __NOTOC__", "See [[n]] a b"),
        (
            "* a list item that is no sentence\n# but this one is a whole sentence of words.",
            "but this one is a whole sentence of words.",
        ),
        (CRASH, ""),
        ("Before.\n" + QUADRATIC["template"], "Before."),
        ("Before.\n" + QUADRATIC["nowiki"] + "\nAfter.", "Before.\nAfter."),
    ],
)
def test_the_fallback_keeps_the_prose(markup: str, prose: str) -> None:
    assert wikitext.plain_text(markup) == prose


# --- 2. the XML namespace-prefix bomb -----------------------------------------------------------------------


def namespace_bomb(path: Path, depth: int, prefixes: int) -> Path:
    """Elements nested ``depth`` deep, each declaring ``prefixes`` namespace prefixes of its own."""
    xml = ['<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">']
    xml += ["<e" + "".join(f' xmlns:p{d}_{i}="u{i}"' for i in range(prefixes)) + ">" for d in range(depth)]
    path.write_text("".join([*xml, "</e>" * depth, "</mediawiki>"]))
    return path


def test_a_namespace_prefix_bomb_is_refused_in_one_line_holding_little(tmp_path: Path) -> None:
    # Before: expat kept every declaration (95 elements of 70,000 prefixes, a 16 MB .bz2: 1.3 GB held).
    bomb = namespace_bomb(tmp_path / "bomb.xml", 20, 5_000)  # 2.2 MB: 29 MB held by expat before
    list(read_articles(dump(tmp_path / "warm.xml", [("A", "a")])))  # imports and caches, before measuring
    tracemalloc.start()  # expat allocates through Python's allocator, so its memory is counted here
    try:
        with pytest.raises(InputFormatError) as raised:
            list(read_articles(bomb))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(raised.value) == (
        f"{bomb}: more than 100 XML namespace prefixes declared (in scope at once or in the file) at line 1;"
        " a MediaWiki dump declares 2: not a dump"
    )
    assert peak < 8 << 20, f"{peak:,} bytes held"


def test_namespaces_a_dump_declares_are_read_and_many_prefixes_in_a_file_refused(tmp_path: Path) -> None:
    page = '<page xmlns="http://www.mediawiki.org/xml/export-0.10/"><title>{}</title><ns>0</ns><id>{}</id>'
    page += "<revision><text>Zorblat was a poet.</text></revision></page>"
    root = '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" xmlns:xsi="http://x/xsi">'
    pages = "".join(page.format(f"T{i}", i) for i in range(1, 301))  # the default namespace, 300 times
    ok = tmp_path / "ok.xml"
    ok.write_text(f"{root}{pages}</mediawiki>")
    assert len(list(read_articles(ok))) == 300
    siblings = "".join(f'<e xmlns:q{i}="u"/>' for i in range(200))  # one each, never more than 3 in scope
    many = tmp_path / "many.xml"
    many.write_text(f"{root}{siblings}</mediawiki>")
    with pytest.raises(InputFormatError, match="more than 100 XML namespace prefixes declared"):
        list(read_articles(many))


# --- 3. stored text rows ------------------------------------------------------------------------------------

TEXTS = {
    "1": ("Zorblat", "Zorblat was born in Quenton. He painted rivers."),
    "2": ("Mirvane", "Mirvane was born in Farrowe. She painted hills."),  # as long as article 1's
    "3": ("Ada", "Ada was a poet of Ulm."),
}


@pytest.fixture(scope="module")
def lazy_index(base_config: Config, tmp_path_factory: pytest.TempPathFactory) -> Config:
    """A lazy index of ``TEXTS`` made by ingest (article 3 with a popularity); copy it before damaging it."""
    root = tmp_path_factory.mktemp("lazy34")
    rows = [{"id": k, "title": t, "text": x} for k, (t, x) in TEXTS.items()]
    rows[2]["popularity"] = 1234.5
    corpus = root / "texts.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = base_config.replace(index=root / "index", contexts="lazy")
    ingest(corpus, config, progress=False)
    return config


@pytest.fixture
def lazy_copy(lazy_index: Config, tmp_path: Path) -> Config:
    import shutil

    shutil.copytree(lazy_index.index, tmp_path / "index")
    return lazy_index.replace(index=tmp_path / "index")


def damage(config: Config, sql: str, *args: object) -> None:
    with sqlite3.connect(config.index / "index.sqlite") as conn:
        conn.execute(sql, args)


def read_text(config: Config, article_id: str) -> str:
    backend = EmbeddedBackend.open(config.index)
    try:
        (pending,) = backend.unencoded([article_id])
        return pending.article.text
    finally:
        backend.close()


ROW = "(SELECT rowid FROM articles WHERE id = ?)"
BOMB = zstandard.ZstdCompressor(level=3).compress(b"a" * (64 << 20))  # 2 KB that holds 64 MiB


def test_stored_texts_that_are_their_articles_read_as_they_are(lazy_index: Config) -> None:
    assert [read_text(lazy_index, k) for k in TEXTS] == [x for _, x in TEXTS.values()]


def test_a_zstd_bomb_in_a_text_row_is_refused_before_it_is_decompressed(lazy_copy: Config) -> None:
    # Before: the 64 MiB were decompressed (a 22 KB frame of 256 MiB: 2.7 GB RSS), and read as the text.
    damage(lazy_copy, f"UPDATE texts SET text = ? WHERE article = {ROW}", BOMB, "1")
    read_text(lazy_copy, "3")  # imports and caches, before measuring
    tracemalloc.start()  # zstandard allocates its output through Python's allocator: counted here
    try:
        with pytest.raises(IndexCorruptError) as raised:
            read_text(lazy_copy, "1")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    chars = len(TEXTS["1"][1])
    assert str(raised.value) == (
        f"index at {lazy_copy.index}: the stored text of article '1' is damaged (its zstd frame holds"
        f" 67,108,864 bytes, more than the {4 * chars:,} its recorded length allows); add that article"
        " again or rebuild the index with ingest"
    )
    assert peak < 8 << 20, f"{peak:,} bytes held"


def test_a_bomb_is_one_line_from_the_cli(lazy_copy: Config) -> None:
    damage(lazy_copy, f"UPDATE texts SET text = ? WHERE article = {ROW}", BOMB, "1")
    query = ["query", "Zorblat was born in [MASK].", "--index", str(lazy_copy.index), "--subject", "Zorblat"]
    result = CliRunner().invoke(main, query)
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        f"Error: index at {lazy_copy.index}: the stored text of article '1' is damaged (its zstd frame holds"
    ), result.output


def test_an_integer_in_a_text_row_is_not_read_as_text(lazy_copy: Config) -> None:
    damage(lazy_copy, f"UPDATE texts SET text = 42 WHERE article = {ROW}", "3")  # SQLite stores it as '42'
    with pytest.raises(IndexCorruptError) as raised:
        read_text(lazy_copy, "3")
    assert str(raised.value) == (
        f"index at {lazy_copy.index}: the stored text of article '3' is damaged (2 characters where the"
        f" article records {len(TEXTS['3'][1])}); add that article again or rebuild the index with ingest"
    )


@pytest.mark.parametrize(
    ("target", "source", "why"),
    [
        ("3", "1", f"{len(TEXTS['1'][1])} characters where the article records {len(TEXTS['3'][1])}"),
        ("1", "2", "not the text its article's fingerprint was made from"),  # as long: the fingerprint tells
    ],
)
def test_another_articles_text_does_not_answer_for_it(
    lazy_copy: Config, target: str, source: str, why: str
) -> None:
    damage(
        lazy_copy,
        f"UPDATE texts SET text = (SELECT text FROM texts WHERE article = {ROW}) WHERE article = {ROW}",
        source,
        target,
    )
    with pytest.raises(IndexCorruptError) as raised:
        read_text(lazy_copy, target)
    assert str(raised.value) == (
        f"index at {lazy_copy.index}: the stored text of article {target!r} is damaged ({why}); add that"
        " article again or rebuild the index with ingest"
    )


def test_a_zstd_bomb_in_a_sentences_row_is_refused_before_it_is_decompressed(index_copy: Config) -> None:
    # Before: decompressed whole (64 MiB, and its text), then found not to be JSON.
    damage(index_copy, f"UPDATE contexts SET sentences = ? WHERE article = {ROW}", BOMB, "100")
    backend = EmbeddedBackend.open(index_copy.index)
    try:
        backend.sentences([("101", 0)])  # imports and caches, before measuring
        tracemalloc.start()
        try:
            with pytest.raises(
                IndexCorruptError,
                match="the stored sentences of article '100' are damaged"
                r" \(its zstd frame holds 67,108,864 bytes, more than the ",
            ):
                backend.sentences([("100", 0)])
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        backend.close()
    assert peak < 8 << 20, f"{peak:,} bytes held"


def test_the_summary_line_counts_the_pages_stripped_plainly() -> None:
    from types import SimpleNamespace

    from bertknn_search.output import render_summary

    summary = SimpleNamespace(
        articles=3, replaced=0, already_stored=0, empty=0, duplicates=0, contexts_mode="eager",
        sentences=5, contexts=40, seconds=1.0, contexts_per_second=40.0, location="x", unparsed=2,
    )  # fmt: skip
    assert render_summary(summary, "ingested").endswith(
        "; 2 pages the wiki parser could not take stripped plainly (named above)"
    )
