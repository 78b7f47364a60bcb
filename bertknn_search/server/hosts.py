"""Which names the server answers for: loopback ones, the address it binds and each ``--allowed-host``.

DNS rebinding: a page on attacker.example, once the name resolves to 127.0.0.1, sends requests the
browser treats as same-origin, with ``Host: attacker.example``, and may read the answers. So every
request is checked, reads too: answers and ``/stats`` show what the index holds (articles added for the
user alone), and questions cost the machine's CPU. A page may also send a "simple" cross-origin POST to
``http://127.0.0.1:8000`` itself (no preflight for a body without Content-Type, which FastAPI reads as
JSON unless its ``strict_content_type``, the default of recent versions only, is on): its Host is then a
loopback name, but the browser names the page in ``Origin``, which must be an allowed name as well.
Programs other than browsers send no Origin and are not affected.

Starlette's TrustedHostMiddleware is not used: it answers in plain text (this API answers
``{"detail": ...}``), matches exact names only (not 127.0.0.0/8 or ``[0:0:0:0:0:0:0:1]``), parses Host
with a private helper, and does not look at Origin.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from bertknn_search.errors import ConfigError
from bertknn_search.server.limits import Scope, refuse

# Letters, digits, '-' and '_' (seen in real host names), in dot-separated labels.
NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")


def normalise(name: str) -> str | None:
    """A host name or address as compared: lower case, no trailing dot, an IP address in its standard
    form (IPv6 without brackets, so ``[::1]`` and ``[0:0::1]`` are one); None when it is neither."""
    text = name.strip().lower()
    bracketed = text.startswith("[") and text.endswith("]")
    try:
        return str(ipaddress.IPv6Address(text[1:-1]) if bracketed else ipaddress.ip_address(text))
    except ValueError:
        pass
    text = text.removesuffix(".")
    return text if not bracketed and NAME.fullmatch(text) else None


def host_of(header: str) -> str | None:
    """The normalised name in a Host header (``name``, ``name:port``, ``[v6]`` or ``[v6]:port``), or
    None when it is none of these (an IPv6 address outside brackets is ambiguous with a port)."""
    text = header.strip()
    end = text.find("]") + 1 if text.startswith("[") else 0
    name, colon, port = (text[:end], text[end : end + 1], text[end + 1 :]) if end else text.partition(":")
    if (colon and colon != ":") or (port and not (port.isascii() and port.isdigit())):
        return None
    return normalise(name)


def origin_host(origin: str) -> str | None:
    """The normalised host of an Origin header (``scheme://host[:port]``); None for ``null`` or junk."""
    try:
        parts = urlsplit(origin)
    except ValueError:  # an unclosed IPv6 bracket
        return None
    return host_of(parts.netloc) if parts.scheme and parts.netloc else None


def is_loopback(name: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1 (normalised names): no other machine can send from them."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    """Whether binding ``host`` listens on every address (0.0.0.0, ::), which names no one host."""
    try:
        return host == "" or ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def allowed_names(names: Iterable[str]) -> frozenset[str]:
    """``--allowed-host`` values, normalised.

    Raises:
        ConfigError: one is not a host name or an IP address (a URL, or a name with a port).
    """
    out = set()
    for name in names:
        normal = normalise(name)
        if normal is None:
            raise ConfigError(
                f"--allowed-host {name!r} is not a host name or address; give it without scheme or port"
            )
        out.add(normal)
    return frozenset(out)


class HostCheck:
    """ASGI middleware: a request naming another host than the allowed ones is refused before the app.

    A Host header that cannot be parsed is a 400; a well-formed one naming another host a 421 (Misdirected
    Request: this server is not the one the name points at, for all it knows); an Origin naming another
    host a 403. A request without Host (HTTP/1.0, some health checks) passes: browsers always send one.
    """

    def __init__(self, app: Any, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    def permits(self, name: str) -> bool:
        return is_loopback(name) or name in self.allowed

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        host, origin = headers.get(b"host"), headers.get(b"origin")
        if host is not None:
            text = host.decode("latin-1")
            name = host_of(text)
            if name is None:
                await refuse(send, 400, f"the Host header {text!r} is not a host name or address")
                return
            if not self.permits(name):
                await refuse(
                    send,
                    421,
                    f"this server does not answer for Host {name!r} (only loopback names, its --host and"
                    " --allowed-host), so that web pages cannot reach it by DNS rebinding; if the name is"
                    f" the server's, start it with --allowed-host {name}",
                )
                return
        if origin is not None:
            text = origin.decode("latin-1")
            name = origin_host(text)
            if name is None or not self.permits(name):
                await refuse(
                    send,
                    403,
                    f"requests from web pages of {text!r} are refused: only the server's own names may"
                    " call it from a browser (loopback names, its --host and --allowed-host)",
                )
                return
        await self.app(scope, receive, send)
