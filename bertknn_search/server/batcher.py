"""MicroBatcher: one worker owns the model; questions arriving together share one encoder pass, and cold
encodes take turns with them.

Requests put their questions on a queue and wait on futures. The worker takes the first question, waits
up to ``window_s`` for more (at most ``max_batch``), and answers them with ``Searcher.answer_batch``: one
pass for a batch, where separate requests would each pay for their own. While a batch runs, the next
questions queue up, so under load batches fill without waiting.

Clients that each wait for their answer before asking again come back a little after their batch ends,
spread over more than a short window on a busy machine. Taking whoever has come back by then splits them
into a small batch and a large one that then alternate, each paying a whole pass (on a CPU a pass of one
question costs most of what a pass of eight does). So a batch waits longer, up to a quarter of the last
pass, while it holds fewer questions than the last batch had or than were queued when it began.

Fairness. A cold question on a lazy index encodes contexts first, seconds to minutes of model time on a
CPU. Each batch therefore runs as a task on a thread of its own, and only one task runs at a time: the
worker hands the model to a task and waits until the task gives it back, which a cold encode does
between two transformer blocks (``Encoder.between_blocks``) and between the slices of a long article's
preparation, whenever someone else waits. The worker then runs, in this order: new questions (a warm one
is answered at once; a cold one starts its encode and waits for its turn like the others), the cold
tasks in turn (round robin, a block each, so no client waits for another's whole article; a batch of
several clients' questions that turns out cold is split, before it encodes, into a task per client), and last,
when nobody waits, the completion of partly encoded articles (``Backend.encode_more``). A task whose
every question was given up on (its client disconnected: its futures cancelled) stops at its next turn;
what it encoded is stored and the idle completion finishes it. On shutdown every task stops at its next
turn, storing what it encoded, and its questions get a 503.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from bertknn_search.config import Config
from bertknn_search.errors import BertKnnError
from bertknn_search.query.search import Searcher
from bertknn_search.records import Answer, EncodeHooks, EncodePlan, EncodeProgress, Question
from bertknn_search.server.encode_log import EncodeLog

log = logging.getLogger("bertknn_search.server")


class NotReady(Exception):
    """The model is still loading (or failed to load): the request is refused, not queued."""


class Busy(Exception):
    """The queue is full: the server is answering as fast as it can; the client should retry later."""


class Stopping(BertKnnError):
    """The server is shutting down: a cold encode stopped (what it encoded is stored); retry later."""


class Abandoned(BertKnnError):
    """Every question of a batch was given up on (its client left): its encode stopped, what it encoded
    is stored, and the server's idle time completes the rest."""


class _Answer(Future[Answer]):
    """A question's future that remembers being given up on: once its question runs, ``cancel`` can no
    longer cancel it, so the worker reads ``abandoned`` to stop encoding for nobody."""

    abandoned = False

    def cancel(self) -> bool:
        self.abandoned = True
        return super().cancel()


@dataclass(frozen=True)
class _Job:
    question: Question
    config: Config
    future: _Answer
    client: int  # the request that asked it (one ``submit`` call)


class _Split(BaseException):
    """Raised in a batch of several clients' questions that turned out cold, before it encodes: each
    client's questions then run as a task of their own, in turn (a BaseException: nothing on the way
    catches it, as nothing catches a KeyboardInterrupt)."""


@dataclass
class BatchStats:
    questions: int = 0
    batches: int = 0
    largest_batch: int = 0
    encoded: int = 0  # contexts encoded since the server started (questions and idle work)
    encoded_idle: int = 0  # of them, by the idle completion

    def as_dict(self) -> dict[str, float]:
        mean = self.questions / self.batches if self.batches else 0.0
        return {
            "questions": self.questions,
            "batches": self.batches,
            "mean_batch": round(mean, 2),
            "largest_batch": self.largest_batch,
            "encoded": self.encoded,
            "encoded_idle": self.encoded_idle,
        }


class _Task:
    """A batch of questions (or, without questions, the idle completion) run on a thread of its own,
    which holds the model only while the worker has handed it its turn."""

    def __init__(self, jobs: list[_Job]) -> None:
        self.jobs = jobs
        self.turn = threading.Event()
        self.thread: threading.Thread | None = None
        self.finished = False
        self.split = False  # cold with several clients' questions: ended, to run as one task each
        self.clients = len({job.client for job in jobs})
        self.encoded_before = 0  # the server's contexts encoded when the task started

    def abandoned(self) -> bool:
        return bool(self.jobs) and all(job.future.abandoned for job in self.jobs)


_STOP = object()
# How long a batch may wait for the questions it expects: a fraction of the last pass (a bounded share
# of the latency), and never more than MAX_PATIENCE_S.
PATIENCE_FRACTION = 0.25
MAX_PATIENCE_S = 0.25
# Idle work: contexts of partly encoded articles asked for per call. Large, so that a call finishes an
# article (each call costs a look at what is stored); it still gives way at every block to questions.
IDLE_CONTEXTS = 100_000
# The idle completion starts once no question came for this long: a client that got a partial answer
# often asks again at once (the page does, every half second), and its own question encodes more.
IDLE_AFTER_S = 1.0


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
        self._cold: deque[_Task] = deque()  # tasks that gave the model back mid-encode, in turn order
        self._split: deque[_Task] = deque()  # a split batch's clients, each to start as its own task
        self._clients = 0  # requests submitted
        self._idle: _Task | None = None  # the idle completion, while it has work
        self._idle_work = True  # partly encoded articles may be left: look when nobody waits
        self._answered = 0.0  # when the last batch of questions ended
        self._back = threading.Event()  # the running task gave the model back (or ended)
        self._local = threading.local()  # which task a thread runs
        self._hooks = EncodeHooks(between=self._between, progress=self._log_encoding)
        self._encode_log = EncodeLog()
        # What the loaded model turned out to be, for the defaults /stats reports; None until it loads.
        self.device_type: str | None = None
        self.has_head: bool | None = None

    @property
    def encoded(self) -> int:
        """Contexts encoded since the server started (questions and idle work)."""
        return self.stats.encoded

    @property
    def encoded_idle(self) -> int:
        """Of them, those the idle completion encoded."""
        return self.stats.encoded_idle

    # -- the request side ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, questions: Sequence[Question], config: Config) -> list[Future[Answer]]:
        """Queue ``questions`` to be answered with ``config``; all of them or none.

        Cancelling a returned future gives its question up, even once it is being answered.

        Raises:
            NotReady: the model is not loaded (yet).
            Busy: the queue cannot take them all.
        """
        if not self.ready.is_set() or self.error is not None:
            raise NotReady(self.status()[1])
        if self._queue.maxsize - self._queue.qsize() < len(questions):
            raise Busy(f"{self._queue.qsize():,} questions are waiting; retry shortly")
        self._clients += 1
        jobs = [_Job(q, config, _Answer(), self._clients) for q in questions]
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
        """Stop cold encodes and idle work at their next turn (SIGTERM): what they encoded is stored."""
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
            self._schedule()
        finally:
            searcher.close()

    def _schedule(self) -> None:
        """Turns, until told to stop and every task has ended: new questions, cold tasks, idle work."""
        stop = False
        while not (stop and not self._cold and not self._split and self._idle is None):
            # Parked cold tasks take the queue as it is; otherwise a batch waits for the questions it
            # expects (the idle completion does not run meanwhile, as no encode would).
            turns = bool(self._cold) or bool(self._split) or stop
            idle_in = self._idle_in()
            wait = not turns and idle_in != 0
            batch, stopped = self._next_batch(wait, window=not turns, timeout=idle_in)
            stop = stop or stopped
            if batch:
                self._turn(_Task(batch))
            elif self._split:
                self._turn(self._split.popleft())
            elif self._cold:
                self._turn(self._cold.popleft())
            elif self._idle_in() == 0:
                self._idle = self._idle or _Task([])
                self._turn(self._idle)

    def _idle_in(self) -> float | None:
        """Seconds until the idle completion may run (0: now); None when it has nothing to do."""
        if self._idle is not None:
            return 0.0
        if not self._idle_work or self._stopping.is_set():
            return None
        return max(self._answered + IDLE_AFTER_S - time.monotonic(), 0.0)

    def _turn(self, task: _Task) -> None:
        """Hand the model to ``task`` until it gives it back (between two blocks) or ends."""
        self._back.clear()
        if task.thread is None:
            task.encoded_before = self.stats.encoded
            body = self._answer_task if task.jobs else self._complete
            task.thread = threading.Thread(target=self._task_main, args=(task, body), daemon=True)
            task.thread.name = "question" if task.jobs else "idle"
            task.thread.start()
        else:
            task.turn.set()
        self._back.wait()
        if task.finished:
            task.thread.join()
            if task.split:
                by_client: dict[int, list[_Job]] = {}
                for job in task.jobs:
                    if not job.future.done():  # a group of other settings may have been answered
                        by_client.setdefault(job.client, []).append(job)
                self._split.extend(_Task(jobs) for jobs in by_client.values())
                self.stats.batches -= 1  # counted again as its clients' own batches
                self.stats.questions -= sum(map(len, by_client.values()))
            elif task is self._idle:
                self._idle, self._idle_work = None, False
            else:
                # Questions that encoded may have left articles partly encoded; warm ones (nothing
                # encoded) did not, and owe no look for them (a search request on an engine).
                self._idle_work = self._idle_work or self.stats.encoded != task.encoded_before
                self._answered = time.monotonic()
        elif task is not self._idle:
            self._cold.append(task)

    def _task_main(self, task: _Task, body: Callable[[_Task], None]) -> None:
        self._local.task = task
        try:
            body(task)
        finally:
            self._encode_log.forget()
            task.finished = True
            self._back.set()

    def _between(self) -> None:
        """Between two encoder blocks (or preparation slices): give the model back if anyone waits; stop
        if the server is stopping or nobody wants the answers any more."""
        task: _Task | None = getattr(self._local, "task", None)
        self._check(task)
        if task is not None and task.clients > 1:
            # Several clients' questions and one of them cold: had they been asked one by one, each
            # would have its turn; so they do (warm ones are answered at once, again).
            raise _Split
        if task is None or (self._queue.empty() and not self._split and not self._cold):
            return  # nobody waits: go on without the cost of two thread switches
        task.turn.clear()
        self._back.set()
        task.turn.wait()
        self._check(task)

    def _check(self, task: _Task | None) -> None:
        if self._stopping.is_set():
            raise Stopping("the server is shutting down; what was encoded is kept, ask again shortly")
        if task is not None and task.abandoned():
            raise Abandoned("every client of this encode left; what was encoded is kept")

    def _next_batch(self, wait: bool, window: bool, timeout: float | None = None) -> tuple[list[_Job], bool]:
        """The next batch of questions, and whether the worker was told to stop.

        Args:
            wait: nothing else to do: wait for a first question, at most ``timeout`` seconds (else none
                may be queued).
            window: after the first, wait up to the window (and the patience) for more; else take only
                what is queued.
        """
        limit = self.max_batch or 1
        try:
            first = self._queue.get(timeout=timeout) if wait else self._queue.get_nowait()
        except queue.Empty:
            return [], False
        if first is _STOP:
            return [], True
        batch: list[object] = [first]
        started = time.monotonic()
        deadline = started + self.window_s
        expected = min(max(self._queue.qsize() + 1, self._last_batch), limit)
        patience = self.patience_s
        if patience is None:
            patience = min(PATIENCE_FRACTION * self._last_pass_s, MAX_PATIENCE_S)
        patient = max(deadline, started + patience)
        stopped = False
        while len(batch) < limit:
            until = deadline if len(batch) >= expected else patient
            try:
                if window:
                    job = self._queue.get(timeout=max(until - time.monotonic(), 0.0))
                else:
                    job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                stopped = True  # answer this batch first, then stop
                break
            batch.append(job)
        jobs = [job for job in batch if isinstance(job, _Job) and job.future.set_running_or_notify_cancel()]
        return jobs, stopped

    def _answer_task(self, task: _Task) -> None:
        started = time.monotonic()
        try:
            self._answer_groups(task.jobs)
        except _Split:
            task.split = True
        finally:
            self._last_batch = len(task.jobs)
            self._last_pass_s = time.monotonic() - started

    def _complete(self, task: _Task) -> None:
        """The idle completion: partly encoded articles, until none is left or someone stops it."""
        searcher = next(iter(self._searchers.values()))
        while True:
            try:
                done = searcher.backend.encode_more(IDLE_CONTEXTS, EncodePlan(hooks=self._hooks))
            except Stopping:
                return
            except Exception:
                log.exception("encoding partly encoded articles failed; left for later questions")
                return
            if done == 0:
                return

    def _log_encoding(self, progress: EncodeProgress) -> None:
        encoded = self._encode_log.told(progress)
        self.stats.encoded += encoded
        if self._idle is not None and getattr(self._local, "task", None) is self._idle:
            self.stats.encoded_idle += encoded

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


async def gather_answers(
    futures: Sequence[Future[Answer]], gone: Callable[[], Awaitable[bool]], every_s: float = 0.5
) -> list[Answer | BaseException]:
    """The answers (or errors) of ``futures``, in order; if the client leaves first, its questions are
    given up (the futures cancelled), so that nobody's encode goes on for it.

    Args:
        futures: what ``MicroBatcher.submit`` returned.
        gone: whether the client has disconnected (Starlette's ``Request.is_disconnected``).
        every_s: how often to ask ``gone`` while waiting.

    Raises:
        Abandoned: the client left before every answer was ready.
    """
    waiting = [asyncio.wrap_future(f) for f in futures]
    try:
        while True:
            _, pending = await asyncio.wait(waiting, timeout=every_s)
            if not pending:
                break
            if await gone():
                raise Abandoned("the client disconnected before its answers were ready")
    except BaseException:
        for f in futures:
            f.cancel()
        for w in waiting:
            w.cancel()
        raise
    return [w.exception() or w.result() for w in waiting]
