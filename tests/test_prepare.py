"""Text preparation in worker processes, large text-only writes, and the splitter an index records."""

from __future__ import annotations

import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bertknn_search.backends.embedded.article_index import field_texts
from bertknn_search.backends.embedded.backend import EmbeddedBackend
from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.errors import IndexMismatchError, InputFormatError
from bertknn_search.ingest import pipeline
from bertknn_search.ingest import prepare as prepare_module
from bertknn_search.ingest.prepare import TextPool, TextSpec, prepare
from bertknn_search.ingest.readers import finish, read_articles, read_records
from bertknn_search.ingest.sentences import SPLITTER
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question
from tests.test_reliability import WAIT, start_ingest, stored_articles, wait_for_articles, write_big_corpus

SPEC = TextSpec(("model", "11", "single-wordpiece", "512"), split=True, ir_fields=True)


def jsonl(path: Path, n: int, bad_line: int | None = None) -> Path:
    lines = [
        json.dumps(
            {"id": str(i), "title": f"Zorblat {i}", "text": f"Zorblat {i} was a poet. He met Ada {i}."}
        )
        for i in range(n)
    ]
    if bad_line is not None:
        lines[bad_line - 1] = "{not json"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def chunks(path: Path, size: int) -> list[list]:
    records = list(read_records(path))
    return [records[i : i + size] for i in range(0, len(records), size)]


def test_workers_prepare_what_this_process_does_in_order_and_never_import_torch(tmp_path: Path) -> None:
    parts = chunks(jsonl(tmp_path / "c.jsonl", 50), 7)
    here = [prepare(chunk, SPEC) for chunk in parts]
    with TextPool(2) as pool:
        assert list(pool.map(parts, SPEC)) == here
        # A worker is a fresh interpreter that imports the preparation code only, not the model's.
        assert not pool._start().submit(eval, "'torch' in __import__('sys').modules").result()
    assert [p.article.id for chunk in here for p in chunk] == [str(i) for i in range(50)]
    assert here[0][0].sentences == ["Zorblat 0 was a poet.", "He met Ada 0."]
    assert here[0][0].ir_fields == field_texts("Zorblat 0", "Zorblat 0 was a poet. He met Ada 0.")


def test_xml_records_leave_the_markup_stripping_to_the_workers(tmp_path: Path) -> None:
    dump = tmp_path / "dump.xml"
    page = "<page><title>{}</title><ns>0</ns><id>{}</id><revision><text>{}</text></revision></page>"
    body = "'''Ada''' was a [[poet]].{{cite|x}} She lived in [[Quenton|the town]]."
    pages = page.format("Ada", 7, body) + page.format("R", 8, "#REDIRECT [[Ada]]")
    dump.write_text(f"<mediawiki>{pages}</mediawiki>", encoding="utf-8")
    records = list(read_records(dump))
    assert len(records) == 1 and "[[poet]]" in records[0][1][-1]  # read, not yet stripped
    assert [finish(r) for r in records] == list(read_articles(dump))
    assert finish(records[0]).text == "Ada was a poet. She lived in the town."


def test_a_bad_record_fails_where_its_chunk_comes(tmp_path: Path) -> None:
    parts = chunks(jsonl(tmp_path / "c.jsonl", 40, bad_line=23), 10)
    with TextPool(2) as pool:
        done = []
        with pytest.raises(InputFormatError, match=r"line 23 is not JSON"):
            for chunk in pool.map(parts, SPEC):
                done.append(chunk)
    assert [len(c) for c in done] == [10, 10]  # the chunks before the bad one, whole


def test_a_chunk_is_prepared_by_the_workers_in_parts_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One chunk (a lazy ingest's write) of many parts: the workers share it, even when it is the only one.
    monkeypatch.setattr(prepare_module, "PART_CHARS", 100)
    parts = chunks(jsonl(tmp_path / "c.jsonl", 30), 30)
    assert len(prepare_module._parts(parts[0])) > 5
    with TextPool(2) as pool:
        assert list(pool.map(parts, SPEC)) == [prepare(parts[0], SPEC)]
        assert pool._executor is not None  # the workers did it
    bad = chunks(jsonl(tmp_path / "bad.jsonl", 30, bad_line=23), 15)
    with TextPool(2) as pool:
        done = []
        with pytest.raises(InputFormatError, match=r"line 23 is not JSON"):
            for chunk in pool.map(bad, SPEC):
                done.append(chunk)
    assert [len(c) for c in done] == [15]  # the chunk before the bad one, whole; none of the bad one's


def test_a_lazy_ingest_writes_its_text_in_large_transactions_with_workers(
    base_config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = jsonl(tmp_path / "c.jsonl", 300)
    writes: list[int] = []
    real = EmbeddedBackend.add_articles

    def counted(self, items, ir_fields=None):
        writes.append(len(items))
        return real(self, items, ir_fields)

    monkeypatch.setattr(EmbeddedBackend, "add_articles", counted)
    monkeypatch.setattr(pipeline, "TEXT_CHUNK_ARTICLES", 120)  # a test-sized "large": 3 writes
    lazy = base_config.replace(contexts="lazy")
    for workers in (0, 2):
        config = lazy.replace(index=tmp_path / f"index-{workers}")
        summary = pipeline.ingest(corpus, config, progress=False, workers=workers)
        assert summary.articles == 300
    # main's pipeline wrote a lazy index 64 articles at a time (each write a tantivy commit).
    assert writes == [120, 120, 60] * 2
    found = []
    for workers in (0, 2):
        backend = EmbeddedBackend.open(tmp_path / f"index-{workers}")
        hits = [[h.id for h in backend.search_articles(f"Ada {i} poet", 3)] for i in range(0, 300, 37)]
        found.append((hits, backend.fingerprints([str(i) for i in range(300)])))
        backend.close()
    assert found[0] == found[1] and len(found[0][1]) == 300
    assert [ids[0] for ids in found[0][0]] == [str(i) for i in range(0, 300, 37)]


def test_a_bad_line_in_a_later_chunk_keeps_the_chunks_before_and_is_one_line(
    base_config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = jsonl(tmp_path / "c.jsonl", 300, bad_line=250)
    monkeypatch.setattr(pipeline, "TEXT_CHUNK_ARTICLES", 100)
    index = tmp_path / "index"
    args = ["ingest", "wiki", str(corpus), "--index", str(index), "--model", base_config.model]
    result = CliRunner().invoke(main, [*args, "--device", "cpu", "--no-progress", "--workers", "2"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().startswith(f"Error: {corpus}: line 250 is not JSON")
    assert stored_articles(index) == 200


def test_workers_exit_when_a_killed_ingest_leaves_them(base_config: Config, tmp_path: Path) -> None:
    corpus = tmp_path / "big.jsonl"
    write_big_corpus(corpus, 260)
    index = tmp_path / "index"
    proc = start_ingest(corpus, index, base_config.model)  # eager: chunks of 64, so workers start
    wait_for_articles(proc, index, at_least=64)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    if not children.exists():
        proc.kill()
        pytest.skip("no /proc/PID/task/PID/children here to find the workers by")
    workers = [int(pid) for pid in children.read_text().split()]
    assert workers, "the ingest started no worker process"
    fds = [os.pidfd_open(pid) for pid in workers]
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=WAIT)
    for fd in fds:  # a pidfd becomes readable when its process has exited
        assert select.select([fd], [], [], WAIT)[0], "a worker outlived the killed ingest"
        os.close(fd)
    rerun = start_ingest(corpus, index, base_config.model)
    _, err = rerun.communicate(timeout=WAIT)
    assert rerun.returncode == 0, err
    assert stored_articles(index) == 260


# --- the splitter an index records --------------------------------------------------------------------


def set_splitter(index: Path, value: str | None) -> None:
    with sqlite3.connect(index / "index.sqlite") as conn:
        if value is None:
            conn.execute("DELETE FROM meta WHERE key = 'splitter'")
        else:
            conn.execute("UPDATE meta SET value = ? WHERE key = 'splitter'", (value,))


@pytest.fixture
def lazy_small(base_config: Config, tmp_path: Path) -> Config:
    config = base_config.replace(index=tmp_path / "index", contexts="lazy")
    pipeline.ingest(jsonl(tmp_path / "c.jsonl", 5), config, progress=False)
    return config


def test_an_index_records_its_splitter_and_refuses_to_mix_in_another(
    lazy_small: Config, tmp_path: Path
) -> None:
    backend = EmbeddedBackend.open(lazy_small.index)
    assert backend.meta().splitter == SPLITTER and SPLITTER.startswith("sentencex 1.")
    backend.close()
    set_splitter(lazy_small.index, "sentencex 0.9.0 en")
    with pytest.raises(IndexMismatchError, match=r"pip install 'sentencex==0\.9\.0'"):
        pipeline.ingest(jsonl(tmp_path / "more.jsonl", 8), lazy_small, progress=False)
    searcher = Searcher.open(lazy_small)  # opening and IR still work; encoding a new article does not
    try:
        with pytest.raises(IndexMismatchError, match=r"splits sentences with 'sentencex 0\.9\.0 en'"):
            searcher.answer(Question("Zorblat 3 was a [MASK].", "Zorblat 3"))
    finally:
        searcher.close()


def test_an_index_made_before_splitters_were_recorded_opens_and_encodes(
    lazy_small: Config, tmp_path: Path
) -> None:
    set_splitter(lazy_small.index, None)
    backend = EmbeddedBackend.open(lazy_small.index)
    assert backend.meta().splitter == ""
    backend.close()
    summary = pipeline.ingest(jsonl(tmp_path / "more.jsonl", 8), lazy_small, progress=False)
    assert (summary.articles, summary.already_stored) == (3, 5)
    searcher = Searcher.open(lazy_small)
    try:
        answer = searcher.answer(Question("Zorblat 6 was a [MASK].", "Zorblat 6"))
        assert answer.n_neighbors > 0  # its contexts were encoded with the installed splitter
    finally:
        searcher.close()
    with sqlite3.connect(lazy_small.index / "index.sqlite") as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'splitter'").fetchone() is None


def test_a_worker_of_the_cli_imports_no_model_code() -> None:
    # What a spawned worker of `python -m bertknn_search ingest wiki` imports: the parent's main module
    # (spawn runs it again, as __mp_main__) and the preparation code.
    imports = "import sys; import bertknn_search.__main__, bertknn_search.ingest.prepare"
    code = f"{imports}; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT, check=True
    )
    assert out.stdout.split() == ["False", "False"]
