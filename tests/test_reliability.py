"""Reliability: killed ingests resume, adds under live queries, faults leave no half-written state."""

from __future__ import annotations

import bz2
import contextlib
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bertknn_search.backends.embedded.backend import EmbeddedBackend
from bertknn_search.backends.embedded.sqlite_file import BUILD_PREFIX
from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.demo import CITIES, FILLER, PEOPLE
from bertknn_search.errors import BackendError

pytestmark = pytest.mark.reliability
WAIT = 120.0  # upper bound for any subprocess step; the steps take seconds


def write_big_corpus(path: Path, n: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    words = FILLER + PEOPLE + CITIES
    with path.open("w", encoding="utf-8") as out:
        for i in range(n):
            sentences = [
                " ".join(rng.choice(words) for _ in range(rng.randint(6, 14))).capitalize() + "."
                for _ in range(4)
            ]
            out.write(json.dumps({"id": str(i), "title": f"Article {i}", "text": " ".join(sentences)}) + "\n")


def cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "bertknn_search", *map(str, args)]


def stored_articles(index: Path) -> int:
    db = index / "index.sqlite"
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute("SELECT COUNT(*) FROM articles").fetchone()[0]
    except sqlite3.Error:
        return 0  # the schema may not be there yet


def counts(index: Path) -> tuple[int, int, int]:
    backend = EmbeddedBackend.open(index)
    s = backend.stats()
    backend.close()
    return s.articles, s.sentences, s.contexts


def ingest_args(corpus: Path, index: Path, model: str) -> list[str]:
    """``ingest wiki`` of ``corpus`` into ``index`` on the CPU, eager, without a progress bar."""
    return [
        *("ingest", "wiki", str(corpus), "--index", str(index), "--model", model),
        *("--device", "cpu", "--max-length", "64", "--no-progress"),
        *("--contexts", "eager"),  # what is killed is the encoding; a lazy ingest is a short text pass
    ]


def start_ingest(corpus: Path, index: Path, model: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cli(*ingest_args(corpus, index, model)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        # A shell starts background jobs with SIGINT ignored, and a child inherits that: Ctrl-C must reach
        # the ingest as it would from a terminal, wherever the suite runs.
        preexec_fn=_sigint_default,
    )


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}


def wait_for_articles(proc: subprocess.Popen[str], index: Path, at_least: int) -> None:
    """Poll (bounded) until the running ingest has committed some articles."""
    for _ in range(int(WAIT / 0.05)):
        if stored_articles(index) >= at_least:
            return
        try:
            proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            continue
        pytest.fail(f"ingest ended before it was interrupted: {proc.stderr.read() if proc.stderr else ''}")
    pytest.fail("ingest committed nothing in time")


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / "big.jsonl"
    write_big_corpus(path, 260)
    return path


@pytest.fixture(scope="module")
def clean_counts(big_corpus: Path, base_config: Config, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    from bertknn_search.ingest.pipeline import ingest

    index = tmp_path_factory.mktemp("clean") / "index"
    ingest(big_corpus, base_config.replace(index=index), progress=False)
    return counts(index)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_interrupted_ingest_resumes_to_exactly_one_copy(
    big_corpus: Path, base_config: Config, clean_counts: tuple, tmp_path: Path, sig: signal.Signals
) -> None:
    index = tmp_path / "index"
    proc = start_ingest(big_corpus, index, base_config.model)
    wait_for_articles(proc, index, at_least=64)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=WAIT)
    done = stored_articles(index)
    if sig in (signal.SIGINT, signal.SIGTERM):
        how = "interrupted" if sig == signal.SIGINT else "terminated"
        assert proc.returncode == (130 if sig == signal.SIGINT else 143)
        # What was kept is said, as the index holds it, and nothing else: no traceback, no warning.
        assert err.strip().splitlines()[-1] == (
            f"{how}; kept {done:,} articles already written; nothing half-written is kept: run the same"
            " command again to resume"
        )
        assert "Traceback" not in err and "resource_tracker" not in err and "leaked" not in err
    else:
        assert proc.returncode == -signal.SIGKILL
    assert 0 < done < 260

    rerun = start_ingest(big_corpus, index, base_config.model)
    out, err = rerun.communicate(timeout=WAIT)
    assert rerun.returncode == 0, err
    assert f" {done:,} already stored," in out  # the finished part is reused, not redone
    assert counts(index) == clean_counts


def _query_worker(config: Config, question: str, subject: str, started, done, results) -> None:
    from bertknn_search.query.search import Searcher
    from bertknn_search.records import Question

    searcher = Searcher.open(config)
    after_done = 0
    for _ in range(400):  # bounded: the adds take a few seconds
        try:
            a = searcher.answer(Question(question, subject))
            results.put(("ok", a.n_neighbors, a.knn[0].word if a.knn else None))
        except Exception as exc:
            results.put(("error", repr(exc), None))
        started.set()
        if done.is_set():
            after_done += 1
            if after_done >= 3:
                break
    searcher.close()


def test_adds_while_other_processes_query(index_copy: Config, tmp_path: Path) -> None:
    from bertknn_search.ingest.pipeline import add_articles

    config = index_copy.replace(temperature=1.0)
    versions = {
        "v1": {"id": "555", "title": "Vesplin", "text": "Vesplin was born in Yentil. Vesplin was a poet."},
        "v2": {
            "id": "555",
            "title": "Vesplin",
            "text": "Vesplin was born in Gorrash. Vesplin lived in the north. The river is near Gorrash.",
        },
    }
    files = {}
    for name, row in versions.items():
        files[name] = tmp_path / f"{name}.jsonl"
        files[name].write_text(json.dumps(row) + "\n", encoding="utf-8")
    sizes = {}
    for name in ("v2", "v1"):
        add_articles(files[name], config, progress=False)
        sizes[name] = (
            EmbeddedBackend.open(config.index).knn(np.zeros(64, np.float32), 1000, ["555"]).distances.size
        )

    ctx = mp.get_context("spawn")
    started, done, results = ctx.Event(), ctx.Event(), ctx.Queue()
    workers = [
        ctx.Process(
            target=_query_worker,
            args=(config, "Vesplin was born in [MASK].", "Vesplin", started, done, results),
        )
        for _ in range(2)
    ]
    for w in workers:
        w.start()
    assert started.wait(WAIT)
    for name in ("v2", "v1", "v2"):
        add_articles(files[name], config, progress=False)
    done.set()
    seen = []
    for w in workers:
        w.join(WAIT)
        assert w.exitcode == 0
    while not results.empty():
        seen.append(results.get())
    assert seen and not [s for s in seen if s[0] == "error"]
    # Every answer saw one whole version, never a mix or a part.
    assert sizes["v1"] != sizes["v2"]
    assert {(n, top) for _, n, top in seen} <= {(sizes["v1"], "yentil"), (sizes["v2"], "gorrash")}
    from bertknn_search.query.search import Searcher
    from bertknn_search.records import Question

    s = Searcher.open(config)
    assert s.answer(Question("Vesplin was born in [MASK].", "Vesplin")).knn[0].word == "gorrash"
    s.close()


def test_disk_full_mid_write_keeps_nothing_half_written(
    index_copy: Config, tmp_path: Path, monkeypatch
) -> None:
    rows = [
        {"id": str(800 + i), "title": f"New {i}", "text": f"Zorblat met poet {i} in Quenton."}
        for i in range(3)
    ]
    path = tmp_path / "new.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    before = counts(index_copy.index)
    real = EmbeddedBackend._write_one
    calls = []

    def failing(self, cur, item, *args):
        calls.append(item.article.id)
        if len(calls) == 2:
            raise sqlite3.OperationalError("database or disk is full")
        return real(self, cur, item, *args)

    monkeypatch.setattr(EmbeddedBackend, "_write_one", failing)
    result = CliRunner().invoke(main, ["add", str(path), "--index", str(index_copy.index), "--no-progress"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip() == (
        f"Error: cannot write to index at {index_copy.index}: database or disk is full; nothing was written"
    )
    assert counts(index_copy.index) == before
    with pytest.raises(BackendError):
        backend = EmbeddedBackend.open(index_copy.index)
        try:
            calls.clear()
            from bertknn_search.records import Article, ContextBlock, EncodedArticle

            empty = ContextBlock.empty(backend.meta().dim, ["x"])
            backend.add_articles([EncodedArticle(Article(str(i), "t", "x"), empty, "f") for i in (1, 2)])
        finally:
            assert backend.fingerprints(["1", "2"]) == {}
            backend.close()


def test_add_with_an_empty_article_writes_nothing(index_copy: Config, tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    rows = [
        {"id": "700", "title": "Good", "text": "Zorblat was a poet."},
        {"id": "701", "title": "Blank", "text": "  "},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    before = counts(index_copy.index)
    result = CliRunner().invoke(main, ["add", str(path), "--index", str(index_copy.index)])
    assert result.exit_code == 1
    assert (
        result.output.strip() == f"Error: {path}: article 'Blank' (id 701) has no text; add text or drop it"
    )
    assert counts(index_copy.index) == before


@pytest.mark.parametrize("case", ["truncated-bz2", "not-utf8", "unknown-format", "bad-json"])
def test_bad_dumps_are_one_line_errors(base_config: Config, tmp_path: Path, case: str) -> None:
    good = b'{"id": 1, "title": "A", "text": "Zorblat was a poet."}\n'
    if case == "truncated-bz2":
        path = tmp_path / "dump.xml.bz2"
        path.write_bytes(bz2.compress(b"<mediawiki>" + b"<page><title>x</title></page>" * 500)[:200])
    elif case == "not-utf8":
        path = tmp_path / "dump.jsonl"
        path.write_bytes(good + b'{"id": 2, "title": "B", "text": "caf\xe9"}\n')
    elif case == "unknown-format":
        path = tmp_path / "dump.docx"
        path.write_bytes(b"PK\x03\x04 not a dump")
    else:
        path = tmp_path / "dump.jsonl"
        path.write_bytes(good + b"{not json\n")
    index = tmp_path / "index"
    args = ["ingest", "wiki", str(path), "--index", str(index), "--model", base_config.model, "--no-progress"]
    result = CliRunner().invoke(main, [*args, "--device", "cpu", "--max-length", "64"])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and str(path) in lines[0]
    # Whatever was read before the bad part is complete: each stored article has all its contexts.
    if index.exists():
        arts, sents, _ = counts(index)
        assert arts in (0, 1) and sents == arts


# --- creating an index -------------------------------------------------------------------------------


def wait_for_first_file(proc: subprocess.Popen[str], index: Path) -> None:
    """Poll (bounded) until the index directory holds a file, the moment an ingest starts creating it."""
    for _ in range(int(WAIT / 0.001)):
        if index.is_dir() and any(index.iterdir()):
            return
        try:
            proc.wait(timeout=0.001)
        except subprocess.TimeoutExpired:
            continue
        pytest.fail(f"ingest ended before it created the index: {proc.stderr.read() if proc.stderr else ''}")
    pytest.fail("ingest created no index file in time")


@pytest.mark.parametrize("delay", [0.0, 0.005, 0.05])
def test_kill_while_the_index_is_created_then_the_same_command_resumes(
    corpus: Path, built_index: Config, tmp_path: Path, delay: float
) -> None:
    index = tmp_path / "index"
    proc = start_ingest(corpus, index, built_index.model)
    wait_for_first_file(proc, index)
    if delay:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=delay)
    proc.kill()
    proc.communicate(timeout=WAIT)

    rerun = start_ingest(corpus, index, built_index.model)
    _, err = rerun.communicate(timeout=WAIT)
    assert rerun.returncode == 0, err
    assert "Traceback" not in err
    assert counts(index) == counts(built_index.index)
    assert not [p.name for p in index.iterdir() if p.name.startswith(BUILD_PREFIX)]


def half_created_by_an_older_version(index: Path, kind: str) -> None:
    """What older versions left when killed (or out of space) while creating: no complete meta."""
    index.mkdir()
    db = index / "index.sqlite"
    if kind == "empty-file":
        db.write_bytes(b"")
        return
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        if kind == "meta-without-version":
            conn.execute("INSERT INTO meta VALUES ('model', 'x')")


@pytest.mark.parametrize("kind", ["empty-file", "tables-only", "meta-without-version"])
def test_an_index_whose_creation_was_interrupted_is_created_by_the_next_ingest(
    corpus: Path, built_index: Config, tmp_path: Path, kind: str
) -> None:
    index = tmp_path / "index"
    half_created_by_an_older_version(index, kind)
    result = CliRunner().invoke(main, ["stats", "--index", str(index)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip() == (
        f"Error: index at {index} was never completely created (an ingest stopped while creating it);"
        " run 'bertknn-search ingest wiki' again to create it"
    )
    result = CliRunner().invoke(main, ingest_args(corpus, index, built_index.model))
    assert result.exit_code == 0, result.output
    assert counts(index) == counts(built_index.index)


class _FullDisk:
    """A connection on a full disk: creating the schema fails, as SQLite reports it."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def executescript(self, script: str) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    def __getattr__(self, name: str):
        return getattr(self._conn, name)


def test_a_create_that_fails_on_a_full_disk_leaves_nothing_and_the_rerun_creates(
    corpus: Path, built_index: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = tmp_path / "index"
    args = ingest_args(corpus, index, built_index.model)
    real = sqlite3.connect
    with monkeypatch.context() as patch:
        patch.setattr(sqlite3, "connect", lambda *a, **k: _FullDisk(real(*a, **k)))
        result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip() == (
        f"Error: cannot create index at {index}: database or disk is full; nothing was created, run the"
        " command again once the cause is fixed"
    )
    assert not index.exists()
    result = CliRunner().invoke(main, args)  # space freed
    assert result.exit_code == 0, result.output
    assert counts(index) == counts(built_index.index)


def test_a_failed_write_after_committed_batches_says_what_was_kept(
    big_corpus: Path,
    base_config: Config,
    clean_counts: tuple,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    index = tmp_path / "index"
    args = ingest_args(big_corpus, index, base_config.model)
    real = EmbeddedBackend._write_one
    written = []

    def failing(self, cur, item, ir_version):
        written.append(item.article.id)
        if len(written) > 64:  # the second batch: the first one (64 articles) is committed
            raise sqlite3.OperationalError("database or disk is full")
        return real(self, cur, item, ir_version)

    with monkeypatch.context() as patch:
        patch.setattr(EmbeddedBackend, "_write_one", failing)
        result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip() == (
        f"Error: cannot write to index at {index}: database or disk is full; the 64 articles written"
        " before it are kept and the rest is not: run the same command again to resume"
    )
    assert stored_articles(index) == 64
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert counts(index) == clean_counts


# --- read-only volumes -------------------------------------------------------------------------------

READ_ONLY_RUN = """
import json, sys
from click.testing import CliRunner
from bertknn_search.cli import main
index, *commands = sys.argv[1:]
out = []
for command in commands:
    result = CliRunner().invoke(main, [*json.loads(command), "--index", index])
    out.append([result.exit_code, result.output])
print(json.dumps(out))
"""


def run_on_read_only_mount(index: Path, *commands: list[str]) -> list[tuple[int, str]]:
    """Run CLI commands in a process that sees ``index`` through a read-only bind mount."""
    if os.name != "posix" or os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("a read-only mount needs root and unshare (Linux); the read-only code path is")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=WAIT)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a mount namespace here: {probe.stderr.decode(errors='replace').strip()}")
    script = index.parent / "read_only_run.py"
    script.write_text(READ_ONLY_RUN, encoding="utf-8")
    shell = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
    argv = ["unshare", "-m", "sh", "-c", shell, "sh", str(index), sys.executable, str(script), str(index)]
    proc = subprocess.run(
        [*argv, *map(json.dumps, commands)], capture_output=True, text=True, timeout=WAIT, env=_env()
    )
    assert proc.returncode == 0, proc.stderr
    return [tuple(r) for r in json.loads(proc.stdout)]


def test_an_index_on_a_read_only_volume_answers_queries_and_stats(index_copy: Config, tmp_path: Path) -> None:
    index = index_copy.index
    new = tmp_path / "new.jsonl"
    new.write_text(json.dumps({"id": "900", "title": "New", "text": "Zorblat met a poet."}) + "\n")
    question = [
        "query",
        "Zorblat was born in [MASK].",
        "--subject",
        "Zorblat",
        "--temperature",
        "1",
        "--json",
    ]
    stats, answer, add = run_on_read_only_mount(index, ["stats", "--json"], question, ["add", str(new)])
    assert stats[0] == 0, stats[1]
    assert json.loads(stats[1])["contexts"] == counts(index)[2]
    assert answer[0] == 0, answer[1]
    writable = CliRunner().invoke(main, [*question, "--index", str(index)])
    assert json.loads(answer[1]) == json.loads(writable.output)
    assert add[0] == 1 and add[1].strip() == (
        f"Error: index at {index} is read-only here (a read-only volume); ingest and add need write access"
        " to it and its directory"
    )


def test_a_read_only_index_with_unmerged_writes_says_so_and_not_corrupt(index_copy: Config) -> None:
    index = index_copy.index
    # A writer that died leaves its log (-wal) unmerged; without -shm, SQLite cannot read it read-only.
    leave_wal = (
        "import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None);"
        " c.execute('PRAGMA wal_autocheckpoint=0');"
        " c.execute(\"UPDATE meta SET value = value + 1 WHERE key = 'generation'\"); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", leave_wal, str(index / "index.sqlite")], check=True, timeout=WAIT)
    assert (index / "index.sqlite-wal").stat().st_size > 0
    (index / "index.sqlite-shm").unlink()
    ((code, output),) = run_on_read_only_mount(index, ["stats"])
    assert code == 1 and output.strip() == (
        f"Error: the index at {index} is on a read-only volume with writes still in index.sqlite-wal but no"
        " index.sqlite-shm to read them with; open it once where it is writable (for example"
        " 'bertknn-search stats'), then copy it again"
    )


def test_a_killed_lazy_ingest_resumes_to_one_copy_in_both_stores(base_config: Config, tmp_path: Path) -> None:
    """A lazy ingest holds one tantivy writer across its writes (``Backend.bulk``); killed mid-run, the
    next run repairs what the dead writer left and ends with one document per article."""
    corpus, index = tmp_path / "corpus.jsonl", tmp_path / "index"
    write_big_corpus(corpus, 1_500, seed=3)
    script = f"""
from pathlib import Path
from bertknn_search.config import Config
from bertknn_search.ingest import pipeline

pipeline.TEXT_CHUNK_ARTICLES = 20  # many writes in one run
config = Config(model={base_config.model!r}, device="cpu", index=Path({str(index)!r}), contexts="lazy")
print(pipeline.ingest(Path({str(corpus)!r}), config, progress=False, workers=0).already_stored)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=_env())
    wait_for_articles(proc, index, at_least=100)
    proc.kill()
    proc.wait(timeout=WAIT)
    done = stored_articles(index)
    assert 0 < done < 1_500
    rerun = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=WAIT
    )
    assert rerun.returncode == 0, rerun.stderr
    assert int(rerun.stdout.split()[-1]) == done  # what the killed run committed is kept, not redone
    backend = EmbeddedBackend.open(index)
    try:
        assert backend.stats().articles == 1_500
        assert backend._ir.documents() == 1_500
        assert not (index / "articles.pending.json").exists()
        assert [h.id for h in backend.search_articles("article 777", 1)] == ["777"]
    finally:
        backend.close()
