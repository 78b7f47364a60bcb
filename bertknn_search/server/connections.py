"""Slow clients: every connection sends a whole request in bounded time, and open connections stay under
the process's file limit.

uvicorn bounds an idle keep-alive connection (``timeout_keep_alive``) and a request's head (h11's largest
incomplete event, 16 KiB), but not the time a client takes to send it: a client that sends a header line
every few seconds holds its connection, and a file descriptor, for ever. Thousands of them reached the
file limit, where every ``accept`` failed with a traceback and a warm question took seconds. Here, on
uvicorn's own h11 protocol:

- a connection must send a request's head within ``head_s`` of its start (or of the previous response)
  and the whole request, body included, within ``request_s``; else it is closed;
- at most ``cap`` connections are open, below the file limit: a new one past the cap closes the oldest
  connection that has not yet sent a whole request (a slow client makes room for a prompt one, so a burst
  of slow clients cannot keep a question out); when every open connection has a request in progress, the
  new one is closed instead;
- at the cap, one log line a minute says how many were closed, not a line per connection; the event loop's
  own "out of system resource" accept errors, should the limit be met anyway, are logged the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("bertknn_search.server")

HEAD_S = 10.0  # a request's head (request line and headers) must arrive within this
REQUEST_S = 60.0  # and the whole request, body included (16 MiB at 0.3 MB/s)
CAP_CEILING = 4096  # open connections at most, whatever the file limit (each costs memory)
FILES_RESERVED = 256  # descriptors left to the model, the index, engine connections and the logs
LOG_EVERY_S = 60.0

_RECEIVING = (h11.IDLE, h11.SEND_BODY)  # their states while a request is still arriving


def connection_cap(ceiling: int = CAP_CEILING) -> int:
    """How many connections may be open: under the soft file limit by ``FILES_RESERVED`` (a quarter of a
    small limit), at most ``ceiling``, at least 16."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return ceiling
    if soft == resource.RLIM_INFINITY:
        return ceiling
    return max(16, min(ceiling, soft - min(FILES_RESERVED, soft // 4)))


class RateLimitedLog:
    """One warning per ``every_s`` at most, saying how many events it stands for."""

    def __init__(self, every_s: float = LOG_EVERY_S) -> None:
        self.every_s = every_s
        self._last: float | None = None
        self._count = 0

    def __call__(self, message: str) -> None:
        self._count += 1
        now = time.monotonic()
        if self._last is not None and now - self._last < self.every_s:
            return
        log.warning("%s (%d since the last such line)", message, self._count)
        self._last, self._count = now, 0


class Guard:
    """What the connections of one server share: the cap, the deadlines, and who is still sending."""

    def __init__(self, cap: int, head_s: float = HEAD_S, request_s: float = REQUEST_S) -> None:
        self.cap = cap
        self.head_s = head_s
        self.request_s = request_s
        self.sending: OrderedDict[GuardedH11, None] = OrderedDict()  # oldest first
        self.at_cap = RateLimitedLog()
        self.accept_errors = RateLimitedLog()
        self.closed_slow = 0  # connections closed at a deadline
        self.closed_at_cap = 0  # connections closed to stay at the cap

    def protocol(self) -> type[GuardedH11]:
        """The protocol class uvicorn is given (``uvicorn.Config(http=...)``), bound to this guard."""
        return type("GuardedH11", (GuardedH11,), {"guard": self})

    def admit(self, new: GuardedH11, open_now: int) -> bool:
        """Whether ``new`` may stay; past the cap, the oldest connection still sending goes instead."""
        if open_now <= self.cap:
            return True
        self.closed_at_cap += 1
        self.at_cap(
            f"{open_now - 1} connections open, the cap ({self.cap}, under the file limit): closing the"
            " oldest that has not sent a whole request"
        )
        for old in self.sending:
            if old is not new:
                old.close_slow()
                return True
        return False

    def exception_handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The event loop's: a failed accept (no descriptor left) is one line a minute, not a traceback
        each time; anything else goes to the default handler."""
        if "out of system resource" in str(context.get("message", "")):
            why = context.get("exception")
            self.accept_errors(f"cannot accept a connection: {why}; waiting for one to close")
            return
        loop.default_exception_handler(context)


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's arrival and a place under the cap."""

    guard: Guard

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        if not self.guard.admit(self, len(self.connections)):
            transport.abort()
            return
        self._expect(self.guard.head_s)

    def _expect(self, head_s: float) -> None:
        """A new request is due: its head within ``head_s``, all of it within the guard's ``request_s``."""
        self._cancel()
        self._started = self.loop.time()
        self._head_done = False
        self.guard.sending[self] = None
        self.guard.sending.move_to_end(self)
        self._deadline = self.loop.call_later(head_s, self._expire)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if self.conn.their_state in _RECEIVING and not self.transport.is_closing():
            self.guard.closed_slow += 1
            self.close_slow()

    def close_slow(self) -> None:
        """Close a connection whose request has not all arrived (its app, if started, sees a disconnect)."""
        self.guard.sending.pop(self, None)
        self._cancel()
        self.transport.abort()

    def handle_events(self) -> None:
        super().handle_events()
        if self._deadline is None and self not in self.guard.sending:
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY and not self._head_done:
            # The head is in: the body has what is left of the whole request's time.
            self._head_done = True
            self._cancel()
            left = self.guard.request_s - (self.loop.time() - self._started)
            self._deadline = self.loop.call_later(max(0.0, left), self._expire)
        elif state not in _RECEIVING:
            self.guard.sending.pop(self, None)
            self._cancel()

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            # The next request on this connection is due as the first was (uvicorn's keep-alive timer
            # closes a connection that sends nothing at all sooner).
            self._expect(self.guard.head_s)
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.sending.pop(self, None)
        with contextlib.suppress(AttributeError):  # lost before connection_made finished
            self._cancel()
        super().connection_lost(exc)
