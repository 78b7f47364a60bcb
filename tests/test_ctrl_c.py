"""Ctrl-C (issue 51.7): a SIGINT at any moment of ``ingest wiki``, ``add`` and ``eval`` ends with the one
clean line, never a native library's abort; a re-run resumes to exactly one copy; a late SIGINT is not
ignored. The signal is noted and raised at the next safe point (``bertknn_search.interrupts``)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bertknn_search import interrupts
from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.errors import Terminated
from bertknn_search.eval.datasets import Fact
from tests.test_cli_eval import write_questions
from tests.test_reliability import WAIT, cli, counts, write_big_corpus

pytestmark = [pytest.mark.reliability, pytest.mark.skipif(os.name != "posix", reason="POSIX signals")]

CLEAN_END = "nothing half-written is kept: run the same command again to resume"
ABORTS = ("terminate called", "pybind11", "Traceback", "Aborted", "core dumped", "panicked", "Fatal Python")


# -- the mechanism ------------------------------------------------------------------------------------
def test_a_signal_is_noted_and_raised_at_the_next_check() -> None:
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here, between bytecodes: no exception yet
        reached = True
        interrupts.check()
        reached = False
    assert reached
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_sigterm_is_raised_as_terminated() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated), interrupts.deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        interrupts.check()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_late_signal_is_raised_as_the_block_ends() -> None:
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
    with interrupts.deferred():  # and nothing is left over for the next run
        interrupts.check()


def test_a_wait_on_another_thread_is_cut_short() -> None:
    slow: Future[int] = Future()
    threading.Timer(30, lambda: slow.done() or slow.set_result(1)).start()  # bounded
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        interrupts.result(slow)
    assert time.monotonic() - started < 5
    slow.set_result(1)


def test_checks_off_the_main_thread_raise_nothing() -> None:
    raised: list[BaseException] = []

    def look() -> None:
        try:
            interrupts.check()
        except BaseException as exc:
            raised.append(exc)

    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        thread = threading.Thread(target=look)
        thread.start()
        thread.join()
        assert not raised
        interrupts.check()


def test_the_third_ctrl_c_stops_at_once() -> None:
    code = (
        "import os, signal, time\n"
        "from bertknn_search import interrupts\n"
        "with interrupts.deferred():\n"
        "    for _ in range(3):\n"
        "        os.kill(os.getpid(), signal.SIGINT); time.sleep(0.05)\n"
        "    time.sleep(30)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130 and "stopped at once" in done.stderr and "Traceback" not in done.stderr


def test_a_late_ctrl_c_in_add_exits_130(
    index_copy: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bertknn_search.output as output

    source = tmp_path / "new.jsonl"
    write_big_corpus(source, 3, seed=7)
    real = output.render_summary

    def late(*args: Any, **kwargs: Any) -> str:  # after the last safe point of the run
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        return real(*args, **kwargs)

    monkeypatch.setattr(output, "render_summary", late)
    args = ["add", str(source), "--index", str(index_copy.index), "--no-progress"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 130, result.output
    assert result.output.strip().splitlines()[-1].startswith("interrupted;")


# -- signals at random moments of real runs -----------------------------------------------------------
def run(args: list[str], delay: float | None) -> tuple[int, str]:
    """``args`` in a child process, sent SIGINT after ``delay`` seconds (None: not at all)."""
    proc = subprocess.Popen(
        cli(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
    )
    if delay is not None:
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=WAIT)
    return proc.returncode, err


def assert_clean(code: int, err: str) -> None:
    if code not in (0, 130):
        # Only inside the interpreter's own start-up (its site module), before the program's first line:
        # nothing of the package ran yet, so there is nothing to say.
        assert code in (1, -signal.SIGINT) and "bertknn_search/" not in err, err
        return
    assert not [a for a in ABORTS if a in err], err
    if code == 130:
        assert err.strip().splitlines()[-1].endswith(CLEAN_END), err


def timed(args: list[str]) -> float:
    start = time.monotonic()
    code, err = run(args, None)
    assert code == 0, err
    return time.monotonic() - start


def test_ctrl_c_at_random_moments_of_ingest_wiki_and_add(base_config: Config, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    write_big_corpus(corpus, 120)
    common = ["--model", base_config.model, "--device", "cpu", "--max-length", "64", "--no-progress"]

    def ingest(index: Path) -> list[str]:
        return ["ingest", "wiki", str(corpus), "--index", str(index), *common, "--contexts", "eager"]

    whole = timed(ingest(tmp_path / "clean"))
    clean = counts(tmp_path / "clean")
    rng = random.Random(51)
    interrupted = 0
    for i in range(5):  # bounded: five runs, each at a moment drawn over the whole run, start-up included
        index = tmp_path / f"index-{i}"
        code, err = run(ingest(index), rng.uniform(0.0, whole))
        assert_clean(code, err)
        interrupted += code == 130
        code, err = run(ingest(index), None)  # the re-run resumes
        assert code == 0, err
        assert counts(index) == clean  # exactly one copy of each context
    # add: the file's articles into a copy of the clean index, interrupted, then added again
    extra = tmp_path / "extra.jsonl"
    write_big_corpus(extra, 40, seed=9)
    rows = [json.loads(line) for line in extra.read_text().splitlines()]
    extra.write_text("".join(json.dumps({**r, "id": f"x{r['id']}"}) + "\n" for r in rows))  # new ids
    add = ["add", str(extra), "--index", str(tmp_path / "clean"), "--no-progress"]
    for _ in range(2):
        code, err = run(add, rng.uniform(0.0, whole / 2))
        assert_clean(code, err)
        interrupted += code == 130
    code, err = run(add, None)
    assert code == 0, err
    assert counts(tmp_path / "clean")[0] == clean[0] + 40
    assert interrupted >= 1  # the moments drawn did stop some runs


def lines(out: Path) -> list[dict[str, Any]]:
    """An eval run's lines in key order, less their timing (which differs from run to run)."""
    rows = [json.loads(line) for line in (out / "facts.jsonl").read_text().splitlines()]
    return sorted(({k: v for k, v in row.items() if k != "seconds"} for row in rows), key=lambda r: r["key"])


def test_ctrl_c_at_random_moments_of_eval(built_index: Config, facts: list[Fact], tmp_path: Path) -> None:
    questions = tmp_path / "q.jsonl"
    write_questions(questions, facts)
    asked = ["eval", "run", "--questions", str(questions), "--index", str(built_index.index), "--no-progress"]
    whole = timed([*asked, "--out", str(tmp_path / "clean")])
    clean = lines(tmp_path / "clean")
    rng = random.Random(7)
    for i in range(3):
        out = tmp_path / f"run-{i}"
        code, err = run([*asked, "--out", str(out)], rng.uniform(0.0, whole))
        assert_clean(code, err)
        code, err = run([*asked, "--out", str(out)], None)  # resumes
        assert code == 0, err
        assert lines(out) == clean  # one line per fact, as an uninterrupted run writes it
