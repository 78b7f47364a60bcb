"""Which names the server answers for: loopback ones, the address it binds and each ``--allowed-host``.

DNS rebinding: a page on attacker.example, once the name resolves to 127.0.0.1, sends requests the
browser treats as same-origin, with ``Host: attacker.example``, and may read the answers. So every
request is checked, reads too: answers and ``/stats`` show what the index holds (articles added for the
user alone), and questions cost the machine's CPU. A page may also send a "simple" cross-origin POST to
``http://127.0.0.1:8000`` itself (no preflight for a body without Content-Type, which FastAPI reads as
JSON unless its ``strict_content_type``, the default of recent versions only, is on): its Host is then a
loopback name, but the browser names the page in ``Origin``, which must be an allowed name as well.
Programs other than browsers send no Origin and are not affected.

Framing: a page of another site may put this server's page in a frame (its Host then is a loopback
name) and make the user click, or frame ``/?question=...``, which asks on load. Every response says
``X-Frame-Options: DENY`` and a ``Content-Security-Policy`` with ``frame-ancestors 'none'``, so a browser
draws it in no frame; the page and the API docs carry a policy that lets them load their own scripts and
styles and nothing else (``SecurityHeaders``).

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
        raw = scope.get("headers") or []
        hosts = [value for name, value in raw if name == b"host"]
        origins = [value for name, value in raw if name == b"origin"]
        # Two of either: no one browser sends that, and which one wins would differ between a proxy, this
        # check and the app (a dict keeps the last): refused, whatever they name.
        if len(hosts) > 1:
            await refuse(send, 400, "the request has more than one Host header; send one")
            return
        if len(origins) > 1:
            await refuse(
                send, 403, "the request has more than one Origin header, so which page sent it is unknown"
            )
            return
        host = hosts[0] if hosts else None
        origin = origins[0] if origins else None
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


# A response without a page of its own (JSON, a script, a style sheet, the favicon) allows nothing.
API_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
# The page: its own script, style sheet and favicon, and fetch() to this server; no inline code.
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self';"
    " base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


def docs_csp(html: str) -> str:
    """The API docs page's policy: Swagger UI from this server, the page's inline script by its hash
    (it starts Swagger UI), inline styles and ``data:`` images (Swagger UI draws with both)."""
    import base64
    import hashlib

    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.DOTALL)
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'" for s in scripts
    )
    return (
        f"default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline';"
        " img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self';"
        " frame-ancestors 'none'"
    )


class SecurityHeaders:
    """ASGI middleware around everything (refusals and 500s included): no response may be framed.

    Adds ``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff`` and, unless the route set its
    own (which must say ``frame-ancestors 'none'`` too), ``Content-Security-Policy: API_CSP``.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def marked(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                present = {name.lower() for name, _ in headers}
                for name, value in (
                    (b"content-security-policy", API_CSP.encode()),
                    (b"x-frame-options", b"DENY"),
                    (b"x-content-type-options", b"nosniff"),
                ):
                    if name not in present:
                        headers.append((name, value))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, marked)
