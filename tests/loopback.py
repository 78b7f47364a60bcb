"""A stand-in HTTP server on 127.0.0.1 for tests of the project's HTTP clients."""

from __future__ import annotations

import threading
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
