"""Ctrl-C and SIGTERM during a run that writes (``ingest wiki``, ``add``, ``eval``): noted when they
come, raised at the next safe point.

Python raises ``KeyboardInterrupt`` wherever the main thread is when the signal comes. Inside a
callback that a native library runs (torch calls back into Python through pybind11, tokenizers and
tantivy through pyo3, pyarrow through Cython) it cannot unwind the native frames: one Ctrl-C in nine
ended ``ingest wiki`` with ``terminate called after throwing an instance of 'pybind11::error_already_set'``
and a C++ abort. Inside ``deferred()`` the handlers only note the signal; ``check()`` raises it, in the
main thread, between encoder batches and while the main thread waits on its helper threads, so a stop
still comes within a batch and the usual clean line and resume follow. A signal noted after the last
check is raised as ``deferred()`` ends: a late Ctrl-C is never ignored (exit 130). A third Ctrl-C
stops the process at once (as a ``kill -9`` would, which a re-run also resumes from).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

POLL_S = 0.2  # how often a wait on another thread looks for a noted signal
AT_ONCE = 3  # the Ctrl-C that stops without waiting for a safe point

_pending: int | None = None  # the first signal noted and not yet raised
_count = 0
_depth = 0
_at_start: dict[int, Any] = {}  # the handlers ``note_from_start`` replaced, until ``startup_over``


def _note(signum: int, frame: Any) -> None:
    global _pending, _count
    _count += 1
    if _pending is None:
        _pending = signum
    if _count >= AT_ONCE:
        # os.write, not print: a handler may run while sys.stderr's buffer is held.
        os.write(2, b"\nstopped at once; run the same command again to resume\n")
        os._exit(143 if signum == signal.SIGTERM else 130)


def started_as_cli() -> bool:
    """Whether this process is the CLI itself (``bertknn-search`` or ``python -m bertknn_search``), not a
    program or a test that imports the package."""
    argv = getattr(sys, "orig_argv", [])
    if "--multiprocessing-fork" in argv:  # a worker process, which is given the CLI's sys.argv
        return False
    if "-m" in argv[:-1] and argv[argv.index("-m") + 1] == "bertknn_search":
        return True
    return bool(sys.argv) and os.path.basename(sys.argv[0]) == "bertknn-search"


def note_from_start() -> None:
    """Note Ctrl-C and SIGTERM from the CLI's first line on: its imports take a second, and a Ctrl-C in
    them would end in a traceback instead of the clean line. ``startup_over`` raises what was noted."""
    if threading.current_thread() is threading.main_thread() and not _at_start:
        _at_start.update({sig: signal.signal(sig, _note) for sig in (signal.SIGINT, signal.SIGTERM)})


def startup_over() -> None:
    """The handlers ``note_from_start`` replaced are back; a signal noted meanwhile is raised now."""
    global _pending, _count
    if not _at_start:
        return
    for sig, handler in _at_start.items():
        signal.signal(sig, handler)
    _at_start.clear()
    signum, _pending, _count = _pending, None, 0
    if signum is not None:
        from bertknn_search.errors import Terminated

        raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


@contextmanager
def deferred() -> Iterator[None]:
    """SIGINT and SIGTERM are noted, not raised, until ``check()``; one noted when the block ends is
    raised then. Nested blocks share the outer one; off the main thread this does nothing."""
    global _depth, _pending, _count
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    if _depth == 0:
        _pending, _count = None, 0
        previous = {sig: signal.signal(sig, _note) for sig in (signal.SIGINT, signal.SIGTERM)}
    _depth += 1
    try:
        yield
        check()
    finally:
        _depth -= 1
        if _depth == 0:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            _pending, _count = None, 0


def check() -> None:
    """Raise a noted signal (``KeyboardInterrupt``, or ``Terminated`` for SIGTERM) in the main thread;
    elsewhere, or with none noted, nothing."""
    global _pending
    if _pending is None or threading.current_thread() is not threading.main_thread():
        return
    signum, _pending = _pending, None
    from bertknn_search.errors import Terminated

    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def result(future: Future[T]) -> T:
    """``future.result()``, looking for a noted signal while it waits (the main thread would otherwise
    sit out a whole chunk of another thread's work after Ctrl-C)."""
    if _depth == 0 or threading.current_thread() is not threading.main_thread():
        return future.result()
    while True:
        check()
        try:
            return future.result(timeout=POLL_S)
        except FutureTimeout:  # the builtin TimeoutError from Python 3.11 on
            continue
