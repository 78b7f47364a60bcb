"""The server's encoder is shared fairly: warm questions first, cold encodes in turn, idle work last."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from bertknn_search.backends import article_rows, lazy
from bertknn_search.config import Config
from bertknn_search.demo import FILLER
from bertknn_search.query.search import Searcher
from bertknn_search.records import Answer, Article, EncodeHooks, EncodeProgress, Question
from bertknn_search.server.batcher import Abandoned, MicroBatcher, gather_answers

TOWNS = ("Alpha Town", "Beta Town", "Gamma Town")
SHORT = "Short Town"


def prose(rng: random.Random, paragraphs: int) -> str:
    sentence = lambda: " ".join(rng.choices(FILLER, k=14)).capitalize() + "."  # noqa: E731
    return "\n".join(" ".join(sentence() for _ in range(8)) for _ in range(paragraphs))


def towns_index(base_config: Config, index: Path, paragraphs: int) -> Config:
    """A lazy index of three long articles (TOWNS) and a short one (SHORT) whose contexts are encoded."""
    from bertknn_search.ingest.pipeline import ingest

    rng = random.Random(7)
    articles = [Article(f"t{i}", town, prose(rng, paragraphs)) for i, town in enumerate(TOWNS)]
    articles.append(Article("short", SHORT, f"{SHORT} lies on the river. {SHORT} is a small town."))
    config = base_config.replace(index=index, contexts="lazy", exact=True)
    ingest(articles, config, progress=False)
    searcher = Searcher.open(config)
    try:
        searcher.answer(ask(SHORT))  # warm from now on
    finally:
        searcher.close()
    return config


def ask(town: str) -> Question:
    return Question(f"{town} lies on the [MASK].", town)


class Watch:
    """What the batcher's encodes report, in order: (thread name, titles) per encoded batch of rows."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, tuple[str, ...]]] = []
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def progress(self, forward: Callable[[EncodeProgress], None]) -> Callable[[EncodeProgress], None]:
        def told(progress: EncodeProgress) -> None:
            with self._lock:
                self.seen.append((threading.current_thread().name, progress.titles))
                for title in progress.titles:
                    self._events.setdefault(title, threading.Event()).set()
            forward(progress)

        return told

    def encoding(self, title: str, timeout: float = 60) -> bool:
        with self._lock:
            event = self._events.setdefault(title, threading.Event())
        return event.wait(timeout)

    def titles(self) -> list[str]:
        with self._lock:
            return [t for _, titles in self.seen for t in titles]


@pytest.fixture
def slow_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each encoder step of the tiny model takes as long as a BERT-base step on a CPU."""
    from bertknn_search.ingest import contexts

    real = contexts.encode_rows

    def slow(rows, encoder, batch_size, on_batch=None):  # type: ignore[no-untyped-def]
        time.sleep(0.02)
        return real(rows, encoder, batch_size, on_batch)

    monkeypatch.setattr(contexts, "encode_rows", slow)
    monkeypatch.setattr(lazy, "STEP_S", 0.5)  # up to 32 rows a step: a hundred steps an article


@pytest.fixture
def towns(base_config: Config, tmp_path: Path) -> Config:
    return towns_index(base_config, tmp_path / "index", paragraphs=40)


@pytest.fixture
def running(towns: Config, slow_steps: None) -> Iterator[tuple[MicroBatcher, Watch]]:
    watch = Watch()
    batcher = MicroBatcher(lambda: Searcher.open(towns), max_batch=8, window_s=0.001, max_queue=64)
    batcher._hooks = EncodeHooks(between=batcher._between, progress=watch.progress(batcher._log_encoding))
    batcher.start()
    assert batcher.ready.wait(60), batcher.error
    try:
        yield batcher, watch
    finally:
        batcher.interrupt()
        batcher.stop()


def submit(batcher: MicroBatcher, town: str, config: Config) -> Future[Answer]:
    (future,) = batcher.submit([ask(town)], config)
    return future


def test_a_warm_question_is_answered_while_a_second_cold_question_encodes(
    running: tuple[MicroBatcher, Watch], towns: Config
) -> None:
    batcher, watch = running
    first = submit(batcher, TOWNS[0], towns)
    assert watch.encoding(TOWNS[0])
    second = submit(batcher, TOWNS[1], towns)  # used to be answered inside the first's encode, alone
    assert watch.encoding(TOWNS[1])
    warm = submit(batcher, SHORT, towns)
    assert warm.result(timeout=60).articles[0].title == SHORT
    assert not second.done() and not first.done()  # answered between their steps


def test_a_warm_question_is_answered_while_idle_completion_runs_and_an_exact_question_encodes(
    running: tuple[MicroBatcher, Watch], towns: Config
) -> None:
    batcher, watch = running
    # A budget leaves the article partly encoded: the idle completion takes it up.
    budget = towns.replace(exact=False, budget=4)
    assert submit(batcher, TOWNS[2], budget).result(timeout=60).partial
    asked = watch.titles().count(TOWNS[2])  # the question's own encode
    deadline = time.monotonic() + 60
    while watch.titles().count(TOWNS[2]) <= asked:  # the idle completion is under way
        assert time.monotonic() < deadline
        time.sleep(0.01)
    exact = submit(batcher, TOWNS[0], towns)
    assert watch.encoding(TOWNS[0])
    warm = submit(batcher, SHORT, towns)
    assert warm.result(timeout=60).articles[0].title == SHORT
    assert not exact.done()
    # The exact question went first: idle work waited while it encoded.
    at = watch.titles().index(TOWNS[0])
    assert TOWNS[2] not in watch.titles()[at:]


def test_two_cold_clients_take_turns(running: tuple[MicroBatcher, Watch], towns: Config) -> None:
    batcher, watch = running
    first = submit(batcher, TOWNS[0], towns)
    assert watch.encoding(TOWNS[0])
    second = submit(batcher, TOWNS[1], towns)
    assert watch.encoding(TOWNS[1])
    deadline = time.monotonic() + 60
    # After the second began, the first goes on before the second ends: neither waits for the other's
    # whole article.
    while True:
        titles = watch.titles()
        began = titles.index(TOWNS[1])
        if TOWNS[0] in titles[began:]:
            break
        assert not second.done(), "the second encoded its whole article while the first waited"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not first.done() and not second.done()


def test_two_clients_cold_questions_batched_together_take_turns(towns: Config, slow_steps: None) -> None:
    watch = Watch()
    # A long window: both requests land in one batch, as clients asking at once do.
    batcher = MicroBatcher(lambda: Searcher.open(towns), max_batch=8, window_s=0.5, max_queue=64)
    batcher._hooks = EncodeHooks(between=batcher._between, progress=watch.progress(batcher._log_encoding))
    batcher.start()
    assert batcher.ready.wait(60), batcher.error
    try:
        first, second = submit(batcher, TOWNS[0], towns), submit(batcher, TOWNS[1], towns)
        assert watch.encoding(TOWNS[0]) and watch.encoding(TOWNS[1])
        deadline = time.monotonic() + 60
        while len(watch.seen) < 20:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        calls = {titles for _, titles in watch.seen}
        # Each client's article encoded by its own task, in turn; not one call for both, in which
        # each waits for the other's whole article.
        assert calls == {(TOWNS[0],), (TOWNS[1],)}
        assert not first.done() and not second.done()
    finally:
        batcher.interrupt()
        batcher.stop()


def test_an_encode_whose_client_left_stops_and_the_idle_work_finishes_it(
    running: tuple[MicroBatcher, Watch], towns: Config
) -> None:
    batcher, watch = running
    gone = submit(batcher, TOWNS[0], towns)
    assert watch.encoding(TOWNS[0])
    gone.cancel()  # what a disconnected request does to its futures (see gather_answers)
    deadline = time.monotonic() + 120
    while not any(name == "idle" for name, _ in watch.seen):
        assert time.monotonic() < deadline, "the encode went on for a client that left"
        time.sleep(0.01)
    while batcher.encoded_idle == 0 or batcher._idle is not None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    check = Searcher.open(towns.replace(exact=False, budget=1))
    try:
        (aid,) = [h.id for h in check.retrieve(ask(TOWNS[0]))]
        coverage = check.backend.coverage([aid])[aid]
        assert coverage.encoded == coverage.total  # completed by the idle work, not by the question
    finally:
        check.close()


def test_gather_answers_gives_up_the_questions_of_a_client_that_left() -> None:
    from bertknn_search.server.batcher import _Answer

    future = _Answer()
    assert future.set_running_or_notify_cancel()  # being answered: cancel() alone cannot stop it

    async def left() -> bool:
        return True

    with pytest.raises(Abandoned):
        asyncio.run(gather_answers([future], left, every_s=0.01))
    assert future.abandoned


def test_a_long_article_is_prepared_in_slices_between_which_a_warm_question_is_answered(
    running: tuple[MicroBatcher, Watch], towns: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bertknn_search.ingest import contexts

    batcher, watch = running
    monkeypatch.setattr(article_rows, "PREPARE_SENTENCES", 16)
    real = contexts.make_row_table
    warm: list[Future[Answer]] = []
    answered_during: list[bool] = []

    def slice_of_rows(sentences, encoder, policy, max_length):  # type: ignore[no-untyped-def]
        if not warm:
            warm.append(submit(batcher, SHORT, towns))  # arrives as the article's preparation begins
        else:
            answered_during.append(warm[0].done())
        return real(sentences, encoder, policy, max_length)

    monkeypatch.setattr(contexts, "make_row_table", slice_of_rows)
    cold = submit(batcher, TOWNS[1], towns)
    deadline = time.monotonic() + 60
    while not warm:
        assert time.monotonic() < deadline, "the article's rows were never made"
        time.sleep(0.01)
    assert warm[0].result(timeout=60).articles[0].title == SHORT
    assert watch.encoding(TOWNS[1])  # its rows are made: it encodes
    assert len(answered_during) > 1 and any(answered_during)  # answered before a slice was made
    batcher.interrupt()
    with pytest.raises(Exception):  # noqa: B017  Stopping: the test is over
        cold.result(timeout=30)


def test_sliced_preparation_makes_the_rows_of_the_whole_article(
    towns: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bertknn_search.ingest.contexts import make_row_table
    from bertknn_search.ingest.sentences import split_sentences

    monkeypatch.setattr(article_rows, "PREPARE_CHARS", 2_000)
    monkeypatch.setattr(article_rows, "PREPARE_SENTENCES", 100)
    searcher = Searcher.open(towns)
    try:
        meta = searcher.backend.meta()
        text = prose(random.Random(3), 60) + "\n\n" + prose(random.Random(4), 3)
        calls: list[int] = []
        whole = split_sentences(text)
        assert article_rows.split_in_slices(text, lambda: calls.append(1)) == whole
        assert calls.count(1) > 5
        encoder = searcher.encoder
        table = make_row_table([whole], encoder, meta.mask_policy, meta.max_length)
        sliced = article_rows.rows_in_slices(whole, encoder, meta, lambda: calls.append(2))
        assert calls.count(2) == -(-len(whole) // article_rows.PREPARE_SENTENCES) - 1 > 0
        columns = ("sentence_index", "article", "sentence", "position", "length", "token_id", "start", "end")
        for name in columns:
            assert np.array_equal(getattr(sliced, name), getattr(table, name)), name
        assert [t.tolist() for t in sliced.tokens] == [t.tolist() for t in table.tokens]
        assert len(sliced.rows(range(len(sliced)))) == len(table)
    finally:
        searcher.close()


@contextlib.contextmanager
def served(config: Config) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """``bertknn-search serve`` on ``config``'s index: the process, its URL and what it logs."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BERTKNN_SERVE_LIMITS": "exact=yes"}
    serve = [sys.executable, "-m", "bertknn_search", "serve", "--index", str(config.index)]
    serve += ["--port", "0", "--device", "cpu"]
    proc = subprocess.Popen(serve, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = ""
        assert proc.stderr is not None
        for line in proc.stderr:
            if "ready: " in line:
                url = line.split("ready: ")[1].split()[0]
                break
        assert url, "the server did not start"
        said: list[str] = []

        def read_log() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                said.append(f"{time.monotonic():.2f} {line}")

        threading.Thread(target=read_log, daemon=True).start()
        yield proc, url, said
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.reliability
def test_a_client_that_disconnects_stops_its_encode_in_a_server_process(
    base_config: Config, tmp_path: Path
) -> None:
    import httpx

    config = towns_index(base_config, tmp_path / "index", paragraphs=300)
    with served(config) as (proc, url, _):
        body = {"questions": [{"question": ask(TOWNS[0]).text, "subject": TOWNS[0]}], "exact": True}
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{url}/query", json=body, timeout=3)  # then the client is gone
        deadline = time.monotonic() + 60
        # The idle completion takes up the article once the question's encode has stopped (it never
        # encodes an article another encode holds).
        while httpx.get(f"{url}/stats", timeout=30).json()["server"]["encoded_idle"] == 0:
            assert time.monotonic() < deadline, "the encode went on for a client that left"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.reliability
def test_sigterm_stops_a_server_with_two_cold_encodes_within_five_seconds(
    base_config: Config, tmp_path: Path
) -> None:
    from bertknn_search.backends import open_backend

    config = towns_index(base_config, tmp_path / "index", paragraphs=1500)
    with served(config) as (proc, url, said):

        def coverage(article_id: str) -> tuple[int, int]:
            backend = open_backend(config)
            try:
                found = backend.coverage([article_id]).get(article_id)
                return (0, 1) if found is None else (found.encoded, found.total)
            finally:
                backend.close()

        def encoded(article_id: str) -> int:
            return coverage(article_id)[0]

        def ask_in_background(town: str) -> None:
            import httpx

            body = {"questions": [{"question": ask(town).text, "subject": town}], "exact": True}

            def post() -> None:
                # The server stops: the test looks at how fast, not at this answer.
                with contextlib.suppress(httpx.HTTPError):
                    httpx.post(f"{url}/query", json=body, timeout=600)

            threading.Thread(target=post, daemon=True).start()

        deadline = time.monotonic() + 120
        ask_in_background(TOWNS[0])
        while encoded("t0") == 0:  # its first stored part (every lazy.FLUSH_S)
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        ask_in_background(TOWNS[1])  # the old server answered it inside the first's encode, alone
        while encoded("t1") == 0:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        done, total = coverage("t1")
        assert done < total  # still encoding when the signal comes
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert time.monotonic() - sent <= 5, f"sent at {sent:.2f}; the server said:\n" + "".join(said[-20:])
