"""Servers on 127.0.0.1 for tests: a stand-in HTTP server for the project's HTTP clients, and an ASGI
app on uvicorn in a thread for the server's own tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing (a test's output is its assertions)."""

    def log_message(self, *args: Any) -> None:
        pass


class LoopbackServer:
    """Serves ``handler`` on a free port of 127.0.0.1 from a thread until ``close``."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@contextmanager
def uvicorn_thread(config: Any, wait_s: float) -> Iterator[tuple[int, Any]]:
    """``config`` (a ``uvicorn.Config``) served from a thread on a free port of 127.0.0.1 until the block
    ends; (port, server). Waits up to ``wait_s`` for it to start, and as long for it to stop."""
    import uvicorn

    from bertknn_search.server.run import listen

    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + wait_s
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.started, "the server did not start"
        yield sock.getsockname()[1], server
    finally:
        server.should_exit = True
        thread.join(wait_s)
        sock.close()
