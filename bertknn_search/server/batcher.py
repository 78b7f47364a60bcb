"""MicroBatcher: one worker thread owns the model; questions arriving together share one encoder pass.

Requests put their questions on a queue and wait on futures. The worker takes the first question, waits
up to ``window_s`` for more (at most ``max_batch``), and answers them with ``Searcher.answer_batch``: one
pass for a batch, where separate requests would each pay for their own. While a batch runs, the next
questions queue up, so under load batches fill without waiting.

Clients that each wait for their answer before asking again come back a little after their batch ends,
spread over more than a short window on a busy machine. Taking whoever has come back by then splits them
into a small batch and a large one that then alternate, each paying a whole pass (on a CPU a pass of one
question costs most of what a pass of eight does). So a batch waits longer, up to a quarter of the last
pass, while it holds fewer questions than the last batch had or than were queued when it began.

A cold question on a lazy index encodes contexts first, seconds of model time on a CPU. The encoder works
in short steps, and between steps the worker answers the questions that arrived meanwhile, so a warm
question never waits behind a cold encode. When no question waits, the worker goes on encoding partly
encoded articles in the same short steps (``Backend.encode_more``), so their next questions find more.
On shutdown a cold encode stops at its next step, storing what it encoded, and its question gets a 503.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from bertknn_search.config import Config
from bertknn_search.errors import BertKnnError
from bertknn_search.records import Answer, EncodeHooks, EncodePlan, EncodeProgress, Question
from bertknn_search.search import Searcher

log = logging.getLogger("bertknn_search.server")


class NotReady(Exception):
    """The model is still loading (or failed to load): the request is refused, not queued."""


class Busy(Exception):
    """The queue is full: the server is answering as fast as it can; the client should retry later."""


class Stopping(BertKnnError):
    """The server is shutting down: a cold encode stopped (what it encoded is stored); retry later."""


@dataclass(frozen=True)
class _Job:
    question: Question
    config: Config
    future: Future[Answer]


@dataclass
class BatchStats:
    questions: int = 0
    batches: int = 0
    largest_batch: int = 0

    def as_dict(self) -> dict[str, float]:
        mean = self.questions / self.batches if self.batches else 0.0
        return {
            "questions": self.questions,
            "batches": self.batches,
            "mean_batch": round(mean, 2),
            "largest_batch": self.largest_batch,
        }


_STOP = object()
# How long a batch may wait for the questions it expects: a fraction of the last pass (a bounded share
# of the latency), and never more than MAX_PATIENCE_S.
PATIENCE_FRACTION = 0.25
MAX_PATIENCE_S = 0.25
# Idle work: contexts of partly encoded articles encoded per call, between looks at the queue.
IDLE_CONTEXTS = 64
LOG_EVERY_S = 10.0


class MicroBatcher:
    """Loads the model on its own thread, then answers queued questions in batches.

    Args:
        open_searcher: loads the index and the model (called once, on the worker thread).
        max_batch: questions per encoder pass at most; None: the Config's batch size for the device.
        window_s: how long the first question of a batch waits for others.
        max_queue: questions waiting at most; more are refused with ``Busy``.
        patience_s: how long a batch may wait for the questions it expects (see the module's docstring);
            None: ``PATIENCE_FRACTION`` of the last pass, at most ``MAX_PATIENCE_S``.
    """

    def __init__(
        self,
        open_searcher: Callable[[], Searcher],
        max_batch: int | None,
        window_s: float,
        max_queue: int,
        patience_s: float | None = None,
    ) -> None:
        self._open = open_searcher
        self.max_batch = max_batch
        self.window_s = window_s
        self.patience_s = patience_s
        self._last_batch = 0
        self._last_pass_s = 0.0
        self._queue: queue.Queue[_Job | object] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="batcher", daemon=True)
        self.ready = threading.Event()
        self.done = threading.Event()  # loading finished, well or not
        self.error: BaseException | None = None
        self.stats = BatchStats()
        self._searchers: dict[Config, Searcher] = {}
        self._stopping = threading.Event()
        self._nested = False  # answering questions between the steps of a cold encode
        self._idle_work = True  # partly encoded articles may be left: look when the queue is empty
        self._hooks = EncodeHooks(between=self._between, progress=self._log_encoding)
        self._logged = (0.0, 0)  # when the encoding log was last written, and of which call
        self.encoded_idle = 0  # contexts encoded while no question waited
        # What the loaded model turned out to be, for the defaults /stats reports; None until it loads.
        self.device_type: str | None = None
        self.has_head: bool | None = None

    # -- the request side ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, questions: Sequence[Question], config: Config) -> list[Future[Answer]]:
        """Queue ``questions`` to be answered with ``config``; all of them or none.

        Raises:
            NotReady: the model is not loaded (yet).
            Busy: the queue cannot take them all.
        """
        if not self.ready.is_set() or self.error is not None:
            raise NotReady(self.status()[1])
        if self._queue.maxsize - self._queue.qsize() < len(questions):
            raise Busy(f"{self._queue.qsize():,} questions are waiting; retry shortly")
        jobs = [_Job(q, config, Future()) for q in questions]
        for job in jobs:
            self._queue.put_nowait(job)
        return [job.future for job in jobs]

    def status(self) -> tuple[str, str]:
        """("ready" | "loading" | "failed", a one-line description)."""
        if self.error is not None:
            return "failed", f"the model failed to load: {self.error}"
        if self.ready.is_set():
            return "ready", "the model is loaded"
        return "loading", "the model is loading; retry shortly"

    def interrupt(self) -> None:
        """Stop cold encodes and idle work at their next step (SIGTERM): what they encoded is stored."""
        self._stopping.set()

    def stop(self) -> None:
        """Answer what is queued, then end the worker and close the index."""
        self._stopping.set()
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    # -- the worker ---------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            searcher = self._open()
            searcher.encoder.mlm  # noqa: B018  loading the weights now is what makes the server ready
            searcher.encoder.vocab  # noqa: B018
        except BaseException as exc:
            self.error = exc
            self.done.set()
            log.error("cannot load the model: %s", exc)
            self._drain(exc)
            return
        searcher.hooks = self._hooks
        self._searchers[searcher.config] = searcher
        self.device_type = searcher.encoder.placement.device.type
        self.has_head = searcher.encoder.has_head
        if self.max_batch is None:
            self.max_batch = searcher.config.batch_for(searcher.encoder.placement.device.type)
        self.ready.set()
        self.done.set()
        try:
            while (batch := self._next_batch()) is not None:
                self._answer(batch)
        finally:
            searcher.close()

    def _next_batch(self) -> list[_Job] | None:
        first = self._first()
        if first is _STOP:
            return None
        batch = [first]
        started = time.monotonic()
        deadline = started + self.window_s
        limit = self.max_batch or 1
        expected = min(max(self._queue.qsize() + 1, self._last_batch), limit)
        patience = self.patience_s
        if patience is None:
            patience = min(PATIENCE_FRACTION * self._last_pass_s, MAX_PATIENCE_S)
        patient = max(deadline, started + patience)
        while len(batch) < limit:
            until = deadline if len(batch) >= expected else patient
            try:
                job = self._queue.get(timeout=max(until - time.monotonic(), 0.0))
            except queue.Empty:
                break
            if job is _STOP:
                self._queue.put(_STOP)  # answer this batch first, then stop
                break
            batch.append(job)
        return [job for job in batch if isinstance(job, _Job) and job.future.set_running_or_notify_cancel()]

    def _first(self) -> _Job | object:
        """The next job; while none is queued, go on encoding partly encoded articles."""
        while self._idle_work and not self._stopping.is_set():
            try:
                return self._queue.get_nowait()
            except queue.Empty:
                pass
            self._idle_work = self._encode_idle() > 0
        job = self._queue.get()
        self._idle_work = True  # questions may have left articles partly encoded
        return job

    def _encode_idle(self) -> int:
        searcher = next(iter(self._searchers.values()))
        try:
            done = searcher.backend.encode_more(IDLE_CONTEXTS, EncodePlan(hooks=self._hooks))
        except Stopping:
            return 0
        except Exception:
            log.exception("encoding partly encoded articles failed; left for later questions")
            return 0
        self.encoded_idle += done
        return done

    def _log_encoding(self, progress: EncodeProgress) -> None:
        """What the model is encoding, in the log: once as a call starts, then every ``LOG_EVERY_S``."""
        now = time.monotonic()
        call = hash(progress.titles)  # idle work on one article is one story, told every LOG_EVERY_S
        if call == self._logged[1] and now - self._logged[0] < LOG_EVERY_S and progress.done < progress.todo:
            return
        self._logged = (now, call)
        names = ", ".join(repr(t) for t in progress.titles[:3]) + (" ..." if len(progress.titles) > 3 else "")
        log.info(
            "encoding %s of %s contexts of %s: %s done in %.0f s",
            f"{progress.todo:,}",
            f"{progress.total:,}",
            names,
            f"{progress.done:,}",
            progress.seconds,
        )

    def _between(self) -> None:
        """Between two encoder steps: stop if the server is stopping, else answer who is waiting."""
        if self._stopping.is_set():
            raise Stopping("the server is shutting down; what was encoded is kept, ask again shortly")
        if self._nested or self._queue.empty():
            return
        waiting: list[_Job] = []
        while len(waiting) < (self.max_batch or 1):
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                self._queue.put(_STOP)
                break
            if isinstance(job, _Job) and job.future.set_running_or_notify_cancel():
                waiting.append(job)
        if waiting:
            self._nested = True
            try:
                self._answer(waiting)
            finally:
                self._nested = False

    def _answer(self, batch: list[_Job]) -> None:
        started = time.monotonic()
        try:
            self._answer_groups(batch)
        finally:
            self._last_batch = len(batch)
            self._last_pass_s = time.monotonic() - started

    def _answer_groups(self, batch: list[_Job]) -> None:
        self.stats.batches += 1
        self.stats.questions += len(batch)
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
        groups: dict[Config, list[_Job]] = {}
        for job in batch:
            groups.setdefault(job.config, []).append(job)
        # Requests with other method settings get their own pass: a Searcher holds one Config.
        for config, jobs in groups.items():
            searcher = self._searcher(config)
            valid = []
            for job in jobs:
                try:
                    searcher.encoder.prepare(job.question.text)  # one bad question must not fail the rest
                    valid.append(job)
                except BertKnnError as exc:
                    job.future.set_exception(exc)
            if not valid:
                continue
            try:
                answers = searcher.answer_batch([job.question for job in valid])
            except Exception as exc:
                if not isinstance(exc, BertKnnError):
                    log.exception("answering a batch of %d failed", len(valid))
                for job in valid:
                    job.future.set_exception(exc)
                continue
            for job, answer in zip(valid, answers):
                job.future.set_result(answer)

    def _searcher(self, config: Config) -> Searcher:
        """A Searcher with ``config``'s method settings over the one loaded index and model."""
        found = self._searchers.get(config)
        if found is None:
            base = next(iter(self._searchers.values()))
            found = Searcher(config, base.backend, base.encoder)
            found.hooks = self._hooks
            if len(self._searchers) < 64:  # a few distinct settings are common; a client varying k is not
                self._searchers[config] = found
        return found

    def _drain(self, exc: BaseException) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(job, _Job) and job.future.set_running_or_notify_cancel():
                job.future.set_exception(NotReady(f"the model failed to load: {exc}"))
