"""Reliability, input side: what users type or feed (devices, bytes, huge or repeated articles, damaged rows)
ends in one line, and what an ingest reports (counts, progress) is right."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import pytest
from click.testing import CliRunner, Result

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.errors import ConfigError
from bertknn_search.ingest import readers
from bertknn_search.ingest.pipeline import add_articles, ingest

pytestmark = pytest.mark.reliability
WAIT = 120.0


def one_line_error(result: Result) -> str:
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


def ingest_args(source: Path, index: Path, model: str, *extra: str) -> list[str]:
    args = ["ingest", "wiki", str(source), "--index", str(index), "--model", model, "--max-length", "64"]
    return [*args, "--no-progress", *extra]


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# --- input files ---------------------------------------------------------------------------------------


def test_an_escaped_lone_surrogate_is_one_line_and_creates_no_index(
    base_config: Config, tmp_path: Path
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 1, "title": "A", "text": "Zorblat \\ud800 was a poet."}\n', encoding="utf-8")
    index = tmp_path / "index"
    line = one_line_error(
        CliRunner().invoke(main, ingest_args(path, index, base_config.model, "--device", "cpu"))
    )
    assert line == (
        f"Error: {path}: line 1 has a text that is not valid Unicode: character 9 is a lone surrogate"
        " (U+D800), not text (an escape such as \\ud800 without its pair); fix or drop that article"
    )
    assert not index.exists()  # the first articles failed: no empty index is left behind


def test_an_empty_title_is_refused(base_config: Config, tmp_path: Path) -> None:
    path = jsonl(tmp_path / "a.jsonl", [{"id": 5, "title": "  ", "text": "Zorblat was a poet."}])
    line = one_line_error(
        CliRunner().invoke(main, ingest_args(path, tmp_path / "i", base_config.model, "--device", "cpu"))
    )
    assert line == (
        f"Error: {path}: line 1 (id 5) has an empty title; give every article a title (a subject finds its"
        " article by title)"
    )


def test_an_article_past_the_size_limit_is_skipped_with_one_line(base_config: Config, tmp_path: Path) -> None:
    rows = [
        {"id": 1, "title": "Before", "text": "Zorblat was a poet."},
        {"id": 2, "title": "Huge", "text": "Zorblat was a poet. " * 600},  # 12,000 characters
        {"id": 3, "title": "After", "text": "Mirvane was a poet."},
    ]
    path = jsonl(tmp_path / "huge.jsonl", rows)
    args = ingest_args(path, tmp_path / "i", base_config.model, "--device", "cpu", "--json")
    result = CliRunner().invoke(main, [*args, "--max-article-bytes", "10000"])
    assert result.exit_code == 0, result.output
    size = len(json.dumps(rows[1])) + 1  # the line as read, with its end
    assert result.stderr.splitlines() == [
        f"warning: {path}: line 2 holds {size:,} bytes, more than the 10,000 one article may hold"
        " (--max-article-bytes): skipped"
    ]
    summary = json.loads(result.stdout)
    assert (summary["articles"], summary["too_large"]) == (2, 1)


@pytest.mark.parametrize(
    ("size", "why"),
    [("0", "must be more than 0 bytes"), ("lots", "is not a size; write e.g. 20GB, 500MB or 1.5GiB")],
)
def test_a_bad_max_article_bytes_is_refused(base_config: Config, tmp_path: Path, size: str, why: str) -> None:
    path = jsonl(tmp_path / "a.jsonl", [{"id": 1, "title": "A", "text": "Zorblat was a poet."}])
    result = CliRunner().invoke(
        main, [*ingest_args(path, tmp_path / "i", base_config.model), "--max-article-bytes", size]
    )
    assert result.exit_code == 2  # a bad flag, as any other
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: Invalid value for '--max-article-bytes': {size!r} {why}"]
    with pytest.raises(ConfigError, match="--max-article-bytes must be more than 0 bytes, got 0"):
        base_config.replace(max_article_bytes=0)


def test_the_size_limit_is_wikipedias_and_is_checked_before_markup_is_parsed(tmp_path: Path) -> None:
    assert readers.MAX_ARTICLE_BYTES == Config().max_article_bytes == 2 * 1024 * 1024
    wikitext = "{{a}}" * (readers.MAX_ARTICLE_BYTES // 5 + 1)  # all markup: nothing left once parsed
    dump = tmp_path / "dump.xml"
    dump.write_text(
        f"<mediawiki><page><title>Big</title><ns>0</ns><id>7</id><revision><text>{wikitext}</text>"
        "</revision></page></mediawiki>",
        encoding="utf-8",
    )
    skipped: list[str] = []
    assert list(readers.read_articles(dump, on_skip=skipped.append)) == []
    assert skipped == [
        f"{dump}: page 7 ('Big') holds 2,097,155 bytes, more than the 2,097,152 one article may hold"
        " (--max-article-bytes): skipped"
    ]


# --- what the user types -------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["garbage", "meta", "cpu:99", "cuda:x"])
@pytest.mark.parametrize("given", ["flag", "environment"])
def test_a_bad_device_is_one_line_before_any_work(
    built_index: Config, base_config: Config, corpus: Path, tmp_path: Path, device: str, given: str
) -> None:
    message = f"Error: device {device!r} (--device or BERTKNN_DEVICE) is not one of auto, cpu, cuda or cuda:N"
    flag = ["--device", device] if given == "flag" else []
    env = {"BERTKNN_DEVICE": device} if given == "environment" else {}
    query = ["query", "Zorblat was born in [MASK].", "--index", str(built_index.index), *flag]
    assert one_line_error(CliRunner().invoke(main, query, env=env)) == message
    index = tmp_path / "index"
    result = CliRunner().invoke(main, ingest_args(corpus, index, base_config.model, *flag), env=env)
    assert one_line_error(result) == message
    assert not index.exists()


def test_a_gpu_that_is_not_there_is_one_line(built_index: Config) -> None:
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    query = ["query", "Zorblat was born in [MASK].", "--index", str(built_index.index), "--device", "cuda:99"]
    line = one_line_error(CliRunner().invoke(main, query))
    if count:
        assert line == (
            f"Error: device 'cuda:99' asked for, but this machine has {count} GPU(s):"
            f" cuda:0 to cuda:{count - 1}"
        )
    else:
        assert line == "Error: --device cuda:99 asked for, but no CUDA GPU is available; use --device cpu"


def test_question_bytes_that_are_not_utf8_are_one_line(built_index: Config) -> None:
    # Real argv bytes: Python keeps the invalid byte as a surrogate (PEP 383), which the tokenizer rejects.
    argv = [sys.executable, "-m", "bertknn_search", "query", b"Zorblat was born in \xff [MASK]."]
    argv += ["--index", str(built_index.index)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(argv, capture_output=True, timeout=WAIT, env=env)
    assert proc.returncode == 1
    assert proc.stderr.decode().strip() == (
        "Error: the question is not valid text: byte 0xff at character 21 is not UTF-8"
    )


def test_a_subject_that_is_not_utf8_is_one_line(built_index: Config) -> None:
    # What click receives from argv holding the bytes b"Zorbl\xe4t" (Latin-1, not UTF-8).
    query = [
        "query",
        "Zorblat was born in [MASK].",
        "--subject",
        "Zorbl\udce4t",
        "--index",
        str(built_index.index),
    ]
    line = one_line_error(CliRunner().invoke(main, query))
    assert line == "Error: the subject is not valid text: byte 0xe4 at character 6 is not UTF-8"


# --- damaged rows inside the store ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("damage", "flags", "message"),
    [
        (
            "UPDATE contexts SET sentences = 'not json' WHERE article ="
            " (SELECT rowid FROM articles WHERE id = '100')",
            ["--subject", "Zorblat", "--temperature", "1"],  # kNN answers first: their evidence is read
            "the stored sentences of article '100' are damaged (Expecting value: line 1 column 1 (char 0));",
        ),
        (
            "UPDATE contexts SET sentences = x'28b52ffd0058' WHERE article ="  # a zstd frame cut short
            " (SELECT rowid FROM articles WHERE id = '100')",
            ["--subject", "Zorblat", "--temperature", "1"],
            "the stored sentences of article '100' are damaged (not a zstd frame of UTF-8 text:",
        ),
        (
            "UPDATE contexts SET token_ids = x'0102' WHERE article ="
            " (SELECT rowid FROM articles WHERE id = '100')",
            ["--subject", "Zorblat"],
            "the stored contexts of article '100' are damaged (",
        ),
        (
            "UPDATE meta SET value = 'x' WHERE key = 'generation'",
            ["--no-ir"],
            "its generation counter is damaged ('x'); rebuild it with ingest",
        ),
    ],
)
def test_damaged_rows_are_one_line(index_copy: Config, damage: str, flags: list[str], message: str) -> None:
    with sqlite3.connect(index_copy.index / "index.sqlite") as conn:
        conn.execute(damage)
    query = ["query", "Zorblat was born in [MASK].", "--index", str(index_copy.index), *flags]
    line = one_line_error(CliRunner().invoke(main, query))
    assert line.startswith(f"Error: index at {index_copy.index}: {message}")


# --- what an ingest reports --------------------------------------------------------------------------------


def test_duplicate_ids_are_counted_and_the_later_one_wins(index_copy: Config, tmp_path: Path) -> None:
    rows = [
        {"id": "700", "title": "Pell", "text": "Pell was born in Quenton."},
        {"id": "701", "title": "Orrin", "text": "Orrin was a poet."},
        {"id": "700", "title": "Pell", "text": "Pell was born in Gorrash."},
        {"id": "100", "title": "Zorblat", "text": "Zorblat was born in Yentil."},  # stored with other text
    ]
    result = CliRunner().invoke(
        main,
        [
            "add",
            str(jsonl(tmp_path / "a.jsonl", rows)),
            "--index",
            str(index_copy.index),
            "--json",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert (summary["articles"], summary["duplicates"], summary["replaced"]) == (3, 1, 1)
    from bertknn_search.backends.embedded.backend import EmbeddedBackend

    backend = EmbeddedBackend.open(index_copy.index)
    try:
        assert backend.sentences([("700", 0)]) == ["Pell was born in Gorrash."]
    finally:
        backend.close()


def test_repeated_ids_across_chunks_of_a_streamed_dump_are_counted(
    base_config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bertknn_search.ingest import pipeline

    monkeypatch.setattr(pipeline, "CHUNK_ARTICLES", 2)
    rows = [{"id": str(i % 3), "title": f"T{i % 3}", "text": f"Zorblat met poet {i}."} for i in range(7)]
    summary = ingest(
        jsonl(tmp_path / "r.jsonl", rows), base_config.replace(index=tmp_path / "i"), progress=False
    )
    # ids 0 1 | 2 0 | 1 2 | 0: four records come again later; each later one replaced what was written.
    assert (summary.articles, summary.duplicates, summary.replaced) == (7, 4, 4)


def test_add_shows_its_own_label_and_a_total(
    index_copy: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {"id": str(800 + i), "title": f"New {i}", "text": f"Zorblat met poet {i} in Quenton."}
        for i in range(3)
    ]
    add_articles(jsonl(tmp_path / "n.jsonl", rows), index_copy, progress=True)
    err = capsys.readouterr().err
    assert "add: 100%" in err and "3/3 articles" in err and "ingest" not in err


def test_ingest_progress_counts_articles_of_the_limit_and_contexts_per_batch(
    base_config: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bertknn_search import progress_lines
    from bertknn_search.demo import FILLER

    monkeypatch.setattr(progress_lines, "stream", lambda: sys.stderr)  # every frame, as a terminal sees

    rows = [
        {"id": str(i), "title": f"Article {i}", "text": " ".join(FILLER[i % 7 :][:12]).capitalize() + "."}
        for i in range(200)
    ]
    config = base_config.replace(index=tmp_path / "i", batch_size=16)
    summary = ingest(jsonl(tmp_path / "c.jsonl", rows), config, limit=150, progress=True)
    err = capsys.readouterr().err
    screens = err.replace("\r", "\n").splitlines()
    assert any(line.startswith("ingest: 100%") and "150/150 articles" in line for line in screens)
    assert " articles/s" in err and " contexts/s" in err and "s/ articles" not in err
    # The bar moves with every encoder batch inside a chunk, not only once a chunk is done.
    first_chunk = [line for line in screens if "encoding" in line and "| 0/150 articles" in line]
    assert any("encoding 16/" in line for line in first_chunk)
    estimates = [line for line in screens if line.startswith("~")]
    assert len(estimates) == 1
    assert estimates[0].endswith(f"for the remaining {150 - 2 * 64} articles")
    assert " contexts/s on cpu; about " in estimates[0]
    assert summary.articles == 150


def test_without_progress_nothing_is_printed(
    base_config: Config, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ingest(corpus, base_config.replace(index=tmp_path / "i"), progress=False)
    assert capsys.readouterr().err == ""


# --- decompression bombs ---------------------------------------------------------------------------------

BOMB = 256 * 1024 * 1024  # bytes that one article of a bomb expands to, from a few KB
# Above the same command on a small file: room for the 2 MiB limit, the pieces read and noise. A reader that
# held the bomb's article even once would need its 256 MiB more.
HEADROOM = 96 * 1024 * 1024
A_BLOCK = b"a" * (8 * 1024 * 1024)
LINES_BLOCK = (b"a" * 127 + b"\n") * 65_536  # 8 MiB too
COMPRESS = {".bz2": bz2.compress, ".gz": gzip.compress, ".xz": lzma.compress}
MEDIAWIKI = b'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">\n'


def _row(i: int, title: str) -> bytes:
    return json.dumps({"id": i, "title": title, "text": f"{title} was a poet."}).encode() + b"\n"


def _page(i: int, title: str) -> bytes:
    body = f"<revision><id>{i}0</id><text>{title} was a poet.</text></revision>"
    return f"<page><title>{title}</title><ns>0</ns><id>{i}</id>{body}</page>\n".encode()


def _doc(i: int, title: str) -> bytes:
    return f'<doc id="{i}" url="u" title="{title}">\n{title}\n\n{title} was a poet.\n</doc>\n'.encode()


# Up to the bomb's <text>, whose start tag is left open.
XML_HEAD = MEDIAWIKI + _page(1, "B") + b"<page><title>Bomb</title><ns>0</ns><id>2</id><revision><text"
JSONL_BOMB = (_row(1, "B") + b'{"id": 2, "title": "Bomb", "text": "', A_BLOCK, b'"}\n' + _row(3, "A"))
XML_BOMB = (XML_HEAD + b">", A_BLOCK, b"</text></revision></page>\n" + _page(3, "A") + b"</mediawiki>\n")
DOC_HEAD = _doc(1, "B") + b'<doc id="2" url="u" title="Bomb">\nBomb\n\n'
# name -> what comes before the bomb's article's text, the block repeated to BOMB bytes, what comes after.
BOMBS = {
    "rows.jsonl.bz2": JSONL_BOMB,
    "rows.jsonl.gz": JSONL_BOMB,
    "dump.xml.bz2": XML_BOMB,
    "dump.xml.xz": XML_BOMB,
    "wiki_00.bz2": (DOC_HEAD, A_BLOCK, b"\n</doc>\n" + _doc(3, "A")),  # one line
    "wiki_01.xz": (DOC_HEAD, LINES_BLOCK, b"</doc>\n" + _doc(3, "A")),  # many lines
}


def bomb(path: Path, head: bytes, block: bytes, tail: bytes) -> Path:
    """``head``, ``block`` repeated to BOMB bytes, then ``tail``, each compressed on its own: bz2, gzip
    and xz read streams one after another as one file, so the block is compressed once."""
    compress = COMPRESS[path.suffix]
    body = compress(block)
    with path.open("wb") as out:
        out.write(compress(head))
        for _ in range(BOMB // len(block)):
            out.write(body)
        out.write(compress(tail))
    return path


class Run(NamedTuple):
    returncode: int
    stdout: str
    stderr: str
    peak: int  # the process's peak resident memory, in bytes


def run_bounded(args: list[str], ceiling: int, work: Path) -> Run:
    """Run the CLI; it is killed once its resident memory passes ``ceiling`` bytes (or after WAIT
    seconds), so a reader that holds what a bomb expands to fails the test without taking the machine."""
    out, err = work / "stdout", work / "stderr"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bertknn_search", *args], stdout=stdout, stderr=stderr, env=env
        )
    done, peak = threading.Event(), [0]
    watcher = threading.Thread(target=_watch, args=(proc.pid, ceiling, done, peak))
    watcher.start()
    # Not reaped until the watcher stops: till then its pid cannot be another process's.
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    done.set()
    watcher.join()
    return Run(proc.wait(), out.read_text(), err.read_text(), peak[0])


def _watch(pid: int, ceiling: int, done: threading.Event, peak: list[int]) -> None:
    """Follow the peak resident memory of ``pid`` in ``peak[0]``; kill it past ``ceiling`` or WAIT seconds.

    Read from /proc rather than wait4's ru_maxrss, which starts a child at the resident memory of its
    parent when forked: this test process, torch loaded.
    """
    deadline = time.monotonic() + WAIT
    while not done.wait(0.01):
        peak[0] = max(peak[0], _high_water(pid))
        if peak[0] > ceiling or time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return


def _high_water(pid: int) -> int:
    """Peak resident bytes of the running process ``pid`` (VmHWM); 0 once it has exited."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.fixture(scope="module")
def small_peak(base_config: Config, tmp_path_factory: pytest.TempPathFactory) -> int:
    """Peak resident bytes of the bomb tests' command on a small file: the model, torch, the index."""
    work = tmp_path_factory.mktemp("small")
    path = work / "rows.jsonl"
    path.write_bytes(_row(1, "B") + _row(3, "A"))
    run = run_bounded(ingest_args(path, work / "index", base_config.model, "--device", "cpu"), 8 << 30, work)
    assert run.returncode == 0, run.stderr
    return run.peak


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for memory")


@linux_only
@pytest.mark.parametrize(
    ("name", "where"),
    [
        ("rows.jsonl.bz2", "line 2"),
        ("rows.jsonl.gz", "line 2"),
        ("dump.xml.bz2", "page 2 ('Bomb')"),
        ("dump.xml.xz", "page 2 ('Bomb')"),
        ("wiki_00.bz2", "the <doc> of line 6 (id 2, 'Bomb')"),
        ("wiki_01.xz", "the <doc> of line 6 (id 2, 'Bomb')"),
    ],
)
def test_a_decompression_bomb_is_skipped_in_bounded_memory(
    base_config: Config, tmp_path: Path, small_peak: int, name: str, where: str
) -> None:
    path = bomb(tmp_path / name, *BOMBS[name])
    assert path.stat().st_size < 400_000
    index = tmp_path / "index"
    args = ingest_args(path, index, base_config.model, "--device", "cpu", "--json")
    run = run_bounded(args, small_peak + HEADROOM, tmp_path)
    assert run.peak <= small_peak + HEADROOM, f"peak {run.peak:,} bytes, {small_peak:,} on a small file"
    assert run.returncode == 0, run.stderr
    [warning] = run.stderr.splitlines()
    found = re.fullmatch(
        rf"warning: {re.escape(str(path))}: {re.escape(where)} holds ([\d,]+) bytes, more than the"
        r" 2,097,152 one article may hold \(--max-article-bytes\): skipped",
        warning,
    )
    assert found and int(found[1].replace(",", "")) >= BOMB, warning
    summary = json.loads(run.stdout)
    assert (summary["articles"], summary["too_large"]) == (2, 1)
    from bertknn_search.backends.embedded.backend import EmbeddedBackend

    backend = EmbeddedBackend.open(index)
    try:
        assert set(backend.fingerprints(["1", "2", "3"])) == {"1", "3"}  # the articles around it are kept
    finally:
        backend.close()


@linux_only
def test_an_xml_tag_that_expands_past_the_limit_refuses_the_file_in_bounded_memory(
    base_config: Config, tmp_path: Path, small_peak: int
) -> None:
    # Expat holds a tag whole until it ends: no article to skip, a file that is not a dump.
    tail = b'">x</text></revision></page></mediawiki>\n'
    path = bomb(tmp_path / "dump.xml.bz2", XML_HEAD + b' a="', A_BLOCK, tail)
    args = ingest_args(path, tmp_path / "index", base_config.model, "--device", "cpu")
    run = run_bounded(args, small_peak + HEADROOM, tmp_path)
    assert run.peak <= small_peak + HEADROOM, f"peak {run.peak:,} bytes, {small_peak:,} on a small file"
    assert run.returncode == 1, run.stderr
    [error] = run.stderr.splitlines()
    assert re.fullmatch(
        rf"Error: {re.escape(str(path))}: the [\d,]+ bytes of XML before byte [\d,]+ hold no element or text,"
        r" more than the 2,097,152 an article may hold: one tag, comment or declaration that long is not a"
        r" MediaWiki dump",
        error,
    ), error
