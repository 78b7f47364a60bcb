"""The server's log of what it encodes: a line per encode call as it ends, and every ``LOG_EVERY_S`` of
a long one, with the rate and the running total (an idle call is an article: a line per article)."""

from __future__ import annotations

import logging
import threading
import time

from bertknn_search.records import EncodeProgress

log = logging.getLogger("bertknn_search.server")
LOG_EVERY_S = 10.0


class EncodeLog:
    """Told each encoded batch's progress, on the thread of the encode (one call at a time per thread)."""

    def __init__(self) -> None:
        self.encoded = 0  # contexts told in all
        self._calls: dict[int, tuple[int, float]] = {}  # thread -> contexts told, when last logged

    def told(self, progress: EncodeProgress) -> int:
        """Log what is due; returns the contexts encoded since this thread's last report."""
        now = time.monotonic()
        thread = threading.get_ident()
        told, logged = self._calls.get(thread, (0, now))
        if progress.done < told:  # a new call on this thread
            told, logged = 0, now
        new = progress.done - told
        self.encoded += new
        ended = progress.done >= progress.todo
        if ended:
            self._calls.pop(thread, None)
        else:
            self._calls[thread] = (progress.done, logged if now - logged < LOG_EVERY_S else now)
            if now - logged < LOG_EVERY_S:
                return new
        names = ", ".join(repr(t) for t in progress.titles[:3]) + (" ..." if len(progress.titles) > 3 else "")
        rate = progress.done / progress.seconds if progress.seconds > 0 else 0.0
        log.info(
            "%s %s of %s contexts (%s in all) of %s in %.1f s, %.1f contexts/s; %s encoded since start",
            "encoded" if ended else "encoding",
            f"{progress.done:,}",
            f"{progress.todo:,}",
            f"{progress.total:,}",
            names,
            progress.seconds,
            rate,
            f"{self.encoded:,}",
        )
        return new

    def forget(self) -> None:
        """This thread's encode call ended without a last report (stopped, failed)."""
        self._calls.pop(threading.get_ident(), None)
