"""Text preparation for ingest, in worker processes that never import torch.

Each article's own CPU work (JSON decoding, markup stripping, the checks of ``readers``, its
fingerprint, sentence splitting for an eager index, the IR field texts of the embedded backend) needs
nothing from other articles, so ``TextPool`` spreads chunks of records over processes and hands them
back in input order; the ingest's writer then only writes. Workers are started with ``spawn`` (a fresh
interpreter that imports this module, not the model code of the parent), ignore Ctrl-C (the parent
decides what an interrupt means) and exit when the parent dies, even by SIGKILL.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from bertknn_search.errors import InputFormatError
from bertknn_search.ingest.readers import Record, finish_noted, record_size
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.records import Article

# A worker's unit of work: a chunk (what one write holds, up to 48M characters in a lazy ingest) is
# prepared in parts of about this much text, so that all workers share a chunk, a corpus of one chunk is
# prepared in parallel too, and no worker idles while the last chunk is prepared by one.
PART_CHARS = 2_000_000


@dataclass(frozen=True)
class TextSpec:
    """What preparation makes of each article (sent to the workers with every chunk)."""

    settings: tuple[str, ...]  # what fingerprints hash besides the article (``fingerprint_settings``)
    split: bool  # split into sentences (an eager index encodes them now; a lazy one on demand)
    ir_fields: bool  # the embedded backend's unigram and bigram field texts


@dataclass(frozen=True)
class PreparedArticle:
    """One article read and prepared: what the writer and the encoder need of it."""

    article: Article
    fingerprint: str
    sentences: list[str] | None  # None unless ``TextSpec.split``
    ir_fields: tuple[str, str] | None  # None unless ``TextSpec.ir_fields``
    note: str | None = None  # a line to say about it: its markup was stripped by the fallback (``finish``)


def fingerprint_settings(model: str, layer: int, mask_policy: str, max_length: int) -> tuple[str, ...]:
    """The encoding settings an article's fingerprint covers."""
    return (model, str(layer), mask_policy, str(max_length))


def article_fingerprint(article: Article, settings: Sequence[str]) -> str:
    """Hash of what decides an article's contexts: equal fingerprints mean nothing to redo."""
    parts = (*settings, article.title, article.text)
    if article.popularity is not None:  # only then: fingerprints of articles without one stay as they were
        parts += (str(article.popularity),)
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:20]


def prepare(records: Sequence[Record], spec: TextSpec) -> list[PreparedArticle]:
    """Finish and prepare one chunk of records, in order.

    Raises:
        InputFormatError: a record is malformed (the articles before it in the chunk are not returned).
    """
    if spec.ir_fields:
        # Imported here: the article index module needs tantivy, which only this option uses.
        from bertknn_search.backends.embedded.article_index import field_texts
    out = []
    for record in records:
        article, note = finish_noted(record)
        text = article.text.strip()
        out.append(
            PreparedArticle(
                article,
                article_fingerprint(article, spec.settings),
                split_sentences(article.text) if spec.split and text else None,
                field_texts(article.title, article.text) if spec.ir_fields and text else None,
                note,
            )
        )
    return out


def default_workers() -> int:
    """Worker processes when none are asked for: a third of this process's cores, at least one.

    The writer's side needs cores too: tantivy indexes a write on one thread per four cores and
    merges segments on others, each thread at about a third of the speed a worker prepares text
    (``benchmarks/README.md``).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // 3)


class TextPool:
    """Prepares chunks of records in ``workers`` processes, a bounded number ahead, in input order.

    With ``workers`` 0 the chunks are prepared in this process, one at a time, as they are asked for.
    The processes start with the second part, so a corpus of one part never pays for starting them.
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._executor: ProcessPoolExecutor | None = None
        self._broken = False

    def map(self, chunks: Iterable[Sequence[Record]], spec: TextSpec) -> Iterator[list[PreparedArticle]]:
        """The prepared chunks, in order; a chunk's error is raised where that chunk would come.

        Reading (``chunks``) happens on the calling thread, at most ``2 * workers`` chunks ahead; each
        chunk goes to the workers in parts (``PART_CHARS``).
        """
        source = iter(chunks)
        first = next(source, None)
        if first is None:
            return
        second = next(source, None)
        if self.workers <= 0 or (second is None and len(_parts(first)) == 1):
            for chunk in [first] if second is None else _chain(first, second, source):
                yield prepare(chunk, spec)
            return
        executor = self._start()
        ahead: deque[list[tuple[Sequence[Record], Future[list[PreparedArticle]] | None]]] = deque()
        for chunk in [first] if second is None else _chain(first, second, source):
            ahead.append([(part, self._submit(executor, part, spec)) for part in _parts(chunk)])
            while len(ahead) >= 2 * self.workers or (ahead and self._broken):
                yield self._chunk(ahead.popleft(), spec)
        while ahead:
            yield self._chunk(ahead.popleft(), spec)

    def _chunk(
        self, parts: list[tuple[Sequence[Record], Future[list[PreparedArticle]] | None]], spec: TextSpec
    ) -> list[PreparedArticle]:
        """A chunk's prepared articles, once its parts are; the first part's error in order is raised.

        Parts no worker has started yet are prepared here, last first, while the workers go on from
        the first: this thread would only wait for them (the writer has nothing to write until this
        chunk is ready, in a lazy ingest the longest wait: one write is up to 48M characters).
        """
        here: dict[int, list[PreparedArticle] | InputFormatError] = {}
        for k in range(len(parts) - 1, 0, -1):
            part, future = parts[k]
            if future is None or not future.cancel():
                break  # started (workers take parts in order): so are all before it
            try:
                here[k] = prepare(part, spec)
            except InputFormatError as exc:
                here[k] = exc
        out: list[PreparedArticle] = []
        for k, (part, future) in enumerate(parts):
            done = here[k] if k in here else self._result(part, future, spec)
            if isinstance(done, InputFormatError):
                raise done
            out.extend(done)
        return out

    def _submit(
        self, executor: ProcessPoolExecutor, part: Sequence[Record], spec: TextSpec
    ) -> Future[list[PreparedArticle]] | None:
        if self._broken:
            return None
        try:
            return executor.submit(prepare, part, spec)
        except BrokenProcessPool:
            self._broke()
            return None

    def _result(
        self, part: Sequence[Record], future: Future[list[PreparedArticle]] | None, spec: TextSpec
    ) -> list[PreparedArticle]:
        if future is not None and not self._broken:
            try:
                return future.result()
            except BrokenProcessPool:
                self._broke()
        return prepare(part, spec)

    def _broke(self) -> None:
        # A worker died: out of memory, or, most often, it could not start because it ran the parent's
        # script (spawn does) and that script calls ingest without an ``if __name__ == "__main__":``
        # guard. Input errors are not this: they come back as exceptions. The chunks are redone here.
        self._broken = True
        print(
            "ingest: text preparation workers stopped (a script that calls ingest needs an"
            " 'if __name__ == \"__main__\":' guard); preparing text in this process instead",
            file=sys.stderr,
        )

    def _start(self) -> ProcessPoolExecutor:
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_start
            )
        return self._executor

    def close(self) -> None:
        """Stop the workers at once; chunks not yet prepared are dropped."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def __enter__(self) -> TextPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parts(chunk: Sequence[Record]) -> list[Sequence[Record]]:
    """The chunk cut, in order, into parts of about ``PART_CHARS`` characters (at least one record each)."""
    parts: list[Sequence[Record]] = []
    start = size = 0
    for i, record in enumerate(chunk):
        size += record_size(record)
        if size >= PART_CHARS:
            parts.append(chunk[start : i + 1])
            start, size = i + 1, 0
    if start < len(chunk) or not parts:
        parts.append(chunk[start:])
    return parts


def _chain(first: Sequence[Record], second: Sequence[Record], rest: Iterator[Sequence[Record]]) -> Iterator:
    yield first
    yield second
    yield from rest


def _worker_start() -> None:
    # A Ctrl-C in a terminal reaches the whole process group: the parent alone handles it, so a
    # worker prints no traceback and is stopped by the parent's shutdown.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()


def _exit_with(sentinel: int) -> None:
    """Exit as soon as the parent has (a SIGKILLed ingest would otherwise leave its workers waiting)."""
    multiprocessing.connection.wait([sentinel])
    os._exit(0)
