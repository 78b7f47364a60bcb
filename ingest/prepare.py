"""Prepare stage of ingest: article texts -> sentences -> masked rows, on this process or on workers.

Splitting (pysbd) and row building are pure Python and hold the GIL. On a GPU one core of them cannot
keep the encoder busy, so ``RowMaker`` can spread a chunk's articles over worker processes; each worker
loads only the tokenizer (an ``Encoder`` never loads its weights until asked to encode).
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import pairwise
from types import TracebackType

import numpy as np

from bertknn_search.encoder import Encoder
from bertknn_search.errors import WorkerError
from bertknn_search.ingest.contexts import MaskedRow, make_rows
from bertknn_search.ingest.sentences import split_sentences

SentencesAndRows = tuple[list[list[str]], list[MaskedRow]]

_worker: tuple[Encoder, str] | None = None  # set in each worker process by _start_worker


def split_and_mask(texts: Sequence[str], encoder: Encoder, policy: str, first: int = 0) -> SentencesAndRows:
    """Sentences of each text, and every masked row of them (article indices start at ``first``)."""
    sentences = [split_sentences(text) for text in texts]
    return sentences, make_rows(sentences, encoder, policy, encoder.max_length, first)


class RowMaker:
    """``split_and_mask`` for a chunk of articles, in this process or spread over ``workers`` processes.

    Use as a context manager; the workers start on first use and stop on exit.
    """

    def __init__(self, encoder: Encoder, policy: str, workers: int) -> None:
        self.encoder = encoder
        self.policy = policy
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> RowMaker:
        if self.workers > 0:
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                # spawn, not fork: the parent holds CUDA state and tokenizer threads that fork would copy.
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(self.encoder.model_name, self.encoder.layer, self.encoder.max_length, self.policy),
            )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __call__(self, texts: Sequence[str]) -> SentencesAndRows:
        if self._pool is None or len(texts) < 2:
            return split_and_mask(texts, self.encoder, self.policy)
        # Contiguous slices keep the article order (each worker numbers its articles from its offset);
        # cut by characters, not articles, because article lengths vary by orders of magnitude.
        cumulative = np.cumsum([len(text) for text in texts])
        targets = cumulative[-1] * np.arange(1, self.workers) / self.workers
        bounds = [0, *(np.searchsorted(cumulative, targets) + 1).tolist(), len(texts)]
        futures = [self._pool.submit(_work, list(texts[lo:hi]), lo) for lo, hi in pairwise(bounds) if hi > lo]
        sentences: list[list[str]] = []
        rows: list[MaskedRow] = []
        try:
            for future in futures:
                part_sentences, part_rows = future.result()
                sentences.extend(part_sentences)
                rows.extend(part_rows)
        except BrokenProcessPool as exc:
            raise WorkerError(
                "an ingest worker process died (out of memory?); run the same command again, with"
                " fewer --workers or --workers 0"
            ) from exc
        return sentences, rows


def _start_worker(model: str, layer: int, max_length: int, policy: str) -> None:
    global _worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle, once
    _worker = (Encoder(model, layer, "cpu", max_length), policy)


def _work(texts: list[str], first: int) -> SentencesAndRows:
    assert _worker is not None, "worker not started"
    encoder, policy = _worker
    return split_and_mask(texts, encoder, policy, first)
