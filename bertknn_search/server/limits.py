"""Request limits: a body larger than the bound is refused before it is read whole."""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException

Scope = dict[str, Any]


def one_line(text: str, limit: int = 500) -> str:
    """``text`` on one line, cut at ``limit`` characters (a message must never carry a whole body)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class BodyLimit:
    """ASGI middleware: 413 for a body over ``max_bytes``, whether Content-Length says so or not."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:  # a chunked body has no Content-Length to check up front
                    raise HTTPException(413, self._message())
            return message

        await self.app(scope, counted, send)

    def _message(self) -> str:
        return f"the body is larger than the server's limit of {self.max_bytes:,} bytes (--max-body-mb)"

    async def _refuse(self, send: Any) -> None:
        await refuse(send, 413, self._message())


async def refuse(send: Any, status: int, detail: str) -> None:
    """Answer ``{"detail": "one line"}`` from a middleware, before the app (and its handlers) sees it."""
    body = json.dumps({"detail": one_line(detail)}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
