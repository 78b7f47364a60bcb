"""Slow clients (``server.connections``): a connection that does not send a whole request in time is
closed, open connections stay under a cap with the oldest slow one making room, and the cap's log is one
line a minute. On real uvicorn over loopback, with small numbers."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bertknn_search.server import connections
from bertknn_search.server.connections import Guard, GuardedH11, RateLimitedLog, connection_cap
from tests.loopback import uvicorn_thread


async def echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole body, answers its length."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = str(size).encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]}
    )
    await send({"type": "http.response.body", "body": body})


@contextmanager
def serving(guard: Guard) -> Iterator[tuple[int, Any]]:
    """``echo_app`` on uvicorn with ``guard``'s protocol, on a free port of 127.0.0.1; (port, server)."""
    import uvicorn

    config = uvicorn.Config(
        echo_app, log_level="warning", access_log=False, lifespan="off", http=guard.protocol()
    )
    with uvicorn_thread(config, wait_s=30) as (port, server):
        yield port, server


def closed_after(conn: socket.socket, lines: list[bytes], every_s: float) -> float | None:
    """Sends ``lines`` one each ``every_s``; the seconds until the server closed the connection, or None
    if it stayed open through all of them."""
    start = time.monotonic()
    conn.settimeout(every_s)
    for line in lines:
        try:
            conn.sendall(line)
            if conn.recv(1024) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except OSError:  # reset: closed
            return time.monotonic() - start
    return None


def test_a_head_sent_slowly_is_closed_at_its_deadline() -> None:
    lines = [b"GET / HTTP/1.1\r\n", *[b"X-Slow: %d\r\n" % i for i in range(40)]]
    with (
        serving(Guard(cap=64, head_s=0.6, request_s=5.0)) as (port, _),
        socket.create_connection(("127.0.0.1", port)) as conn,
    ):
        seconds = closed_after(conn, lines, 0.1)  # 4 s of headers if never closed
    assert seconds is not None and 0.5 <= seconds < 1.6


def test_a_body_sent_slowly_is_closed_at_the_whole_request_deadline() -> None:
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
    with (
        serving(Guard(cap=64, head_s=0.5, request_s=1.2)) as (port, _),
        socket.create_connection(("127.0.0.1", port)) as conn,
    ):
        seconds = closed_after(conn, [head, *[b"x"] * 60], 0.1)  # 6 s of body if never closed
    assert seconds is not None and 1.0 <= seconds < 2.2


def test_prompt_requests_are_answered_and_keep_alive_requests_get_a_new_deadline() -> None:
    guard = Guard(cap=64, head_s=0.5, request_s=1.0)
    with serving(guard) as (port, _), socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(5)
        for _ in range(3):  # past the first request's deadline, on the same connection
            conn.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
            answer = conn.recv(4096)
            while not answer.endswith(b"\r\n\r\n5") and (more := conn.recv(4096)):
                answer += more
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"\r\n\r\n5")
            time.sleep(0.4)
    assert guard.closed_slow == 0 and guard.closed_at_cap == 0


def test_at_the_cap_the_oldest_slow_connection_makes_room_and_one_line_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    guard = Guard(cap=8, head_s=30.0, request_s=30.0)  # deadlines out of the way: the cap alone
    slow: list[socket.socket] = []
    with caplog.at_level(logging.WARNING, logger="bertknn_search.server"), serving(guard) as (port, server):
        try:
            most = 0
            for i in range(40):
                conn = socket.create_connection(("127.0.0.1", port))
                conn.sendall(b"GET / HTTP/1.1\r\nX-Slow: %d\r\n" % i)
                slow.append(conn)
                time.sleep(0.01)
                most = max(most, len(server.server_state.connections))
            with socket.create_connection(("127.0.0.1", port)) as prompt:
                prompt.settimeout(5)
                prompt.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                assert prompt.recv(4096).startswith(b"HTTP/1.1 200")
            time.sleep(0.1)
            assert most <= guard.cap + 1 and len(server.server_state.connections) <= guard.cap
        finally:
            for conn in slow:
                conn.close()
    assert guard.closed_at_cap >= 40 - guard.cap
    lines = [r.getMessage() for r in caplog.records if "the cap (8" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert not [r for r in caplog.records if r.exc_info]


def test_accept_errors_are_one_line_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    guard = Guard(cap=8)
    loop = asyncio.new_event_loop()
    others: list[dict[str, Any]] = []
    loop.default_exception_handler = others.append  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING, logger="bertknn_search.server"):
            for _ in range(1000):
                error = OSError(24, "Too many open files")
                guard.exception_handler(
                    loop, {"message": "socket.accept() out of system resource", "exception": error}
                )
            guard.exception_handler(loop, {"message": "something else"})
    finally:
        loop.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "Too many open files" in lines[0] and not caplog.records[0].exc_info
    assert others == [{"message": "something else"}]


def test_the_rate_limited_log_says_how_many_lines_it_stands_for(caplog: pytest.LogCaptureFixture) -> None:
    said = RateLimitedLog(every_s=0.2)
    with caplog.at_level(logging.WARNING, logger="bertknn_search.server"):
        for _ in range(5):
            said("full")
        time.sleep(0.25)
        said("full")
    assert [r.getMessage() for r in caplog.records] == [
        "full (1 since the last such line)",
        "full (5 since the last such line)",
    ]


@pytest.mark.parametrize(("soft", "cap"), [(1024, 768), (100, 75), (8, 16), (65536, 4096), (4300, 4044)])
def test_the_cap_stays_under_the_file_limit(monkeypatch: pytest.MonkeyPatch, soft: int, cap: int) -> None:
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (soft, 1 << 20))
    assert connection_cap() == cap


def test_serve_runs_on_the_guarded_protocol(
    monkeypatch: pytest.MonkeyPatch, built_index: Any, tmp_path: Path
) -> None:
    import uvicorn
    from click.testing import CliRunner

    from bertknn_search.cli import main

    used: list[Any] = []

    def run(self: Any, sockets: list[Any]) -> None:
        used.append(self.config.http)
        sockets[0].close()

    monkeypatch.setattr(uvicorn.Server, "run", run)
    result = CliRunner().invoke(main, ["serve", "--index", str(built_index.index), "--port", "0"])
    assert result.exit_code == 0, result.output
    assert len(used) == 1 and issubclass(used[0], GuardedH11)
    assert used[0].guard.cap == connections.connection_cap()
