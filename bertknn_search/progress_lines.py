"""Progress bars where stderr is a terminal; elsewhere (a pipe, a log file) a plain line every
``EVERY_S`` seconds, as ``engine start`` says how far it is, instead of tqdm's frames joined by ``\\r``.

Every tqdm bar of the package takes its ``file`` from ``stream()``: tqdm redraws a frame on each update
(``\\r`` and the frame again), which on a terminal is one line in place and in a file is thousands glued
together. ``Lines`` keeps tqdm's own text (counts, rates, time left) and writes the latest frame as a line
at most every ``EVERY_S`` seconds, and the last one when the bar closes.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

EVERY_S = 10.0  # as engine start and the jar fetch: often enough to see it move, rare enough to read


class Lines:
    """A file for tqdm that turns its frames into a line every ``every_s`` seconds (the first at once)."""

    def __init__(self, stream: TextIO, every_s: float = EVERY_S) -> None:
        self._stream = stream
        self._every_s = every_s
        self._last = -float("inf")
        self._pending = ""  # the latest frame not yet written

    def write(self, text: str) -> int:
        frames = [f.strip() for f in text.replace("\x1b[A", "").split("\r")]
        frame = next((f for f in reversed(frames) if f), "")
        if frame:
            self._pending = frame
            now = time.monotonic()
            if now - self._last >= self._every_s:
                self._emit(now)
        elif "\n" in text and self._pending:
            self._emit(time.monotonic())  # the bar closes: its last frame, whatever the time
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return False

    def _emit(self, now: float) -> None:
        self._stream.write(self._pending + "\n")
        self._stream.flush()
        self._pending, self._last = "", now

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)  # encoding, fileno...: what tqdm may ask of a file


def stream() -> Any:
    """The file a progress bar draws on: stderr on a terminal, else ``Lines`` over it."""
    err = sys.stderr
    try:
        tty = err.isatty()
    except (AttributeError, ValueError):
        tty = False
    return err if tty else Lines(err)
