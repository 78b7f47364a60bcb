"""Request limits: what one request may cost, and a guard that refuses a request before its body is read.

``RequestLimits`` bounds the work of one request from a client without the server's token (questions,
articles searched or added, cold-encode budget, exact answers, the bytes of a query); the operator sets
them in ``BERTKNN_SERVE_LIMITS`` and may let the token lift them. ``RequestGuard`` runs before the app:
a write without the token is a 401 and a body over its limit a 413, both before a byte of the body is
read, so that neither a tokenless client nor a large body can make the server buffer or parse anything.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException

from bertknn_search.config import Config
from bertknn_search.errors import ConfigError
from bertknn_search.server.wire import MAX_QUESTIONS

Scope = dict[str, Any]
ENV = "BERTKNN_SERVE_LIMITS"
MIB = 1024 * 1024
# Requests that read: answered without the token. Everything else (POST and DELETE /articles, and any
# method or path the app does not know) is a write and needs it when the server has one.
READS = {("POST", "/query")}
READ_METHODS = {"GET", "HEAD", "OPTIONS"}
TRUSTED = "bertknn_search.trusted"  # scope key: the request gave the server's token
# A body past LARGE bytes is read and held by at most LARGE_AT_ONCE requests at a time; the others wait,
# with what they sent so far, before reading more. A 16 MiB body costs the server about three times its
# size while it is joined, decoded and parsed: 8 at once grew a server's RSS by 365 MB, 2 at a time by
# 104 MB (docs/serving.md).
LARGE = MIB
LARGE_AT_ONCE = 2


def one_line(text: str, limit: int = 500) -> str:
    """``text`` on one line, cut at ``limit`` characters (a message must never carry a whole body)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask for unless it gives the server's token and ``lifted_by_token`` is on.

    The defaults keep one request to seconds of encoder time on a CPU (numbers in docs/serving.md): a
    cold question of a lazy index encodes at most ``budget`` contexts before it answers, so a request
    costs at most ``questions`` x ``budget`` contexts plus one pass over its questions.

    Attributes:
        questions: questions per ``POST /query``.
        n_articles: articles one question searches (``n-articles``).
        budget: contexts one question may encode before it answers, on a lazy index (``budget``).
        exact: whether a request may ask ``exact`` (encode every missing context of its articles first).
        articles: articles per ``POST /articles``.
        query_body: bytes of a ``POST /query`` body (the server's ``--max-body-mb`` bounds every body).
        lifted_by_token: a request with the server's token is held to none of these.
        budget_s: seconds one question may spend encoding before it answers, on a lazy index
            (``budget-s``); a request that bounds its seconds this way and gives no ``budget`` of
            contexts is bounded by the seconds alone.

    A value the server itself uses by default is never refused: with ``serve --n-articles 20``, a request
    may ask 20; a budget up to the device's default (1,024 with seconds on a CPU, 65,536 on a GPU) is
    always allowed, as are the device's default seconds (2.4 on a CPU).

    Each limit has a ceiling (``CEILINGS``): what a request could not ask for anyway.
    """

    questions: int = 4
    n_articles: int = 10
    budget: int = 64
    exact: bool = False
    articles: int = 100
    query_body: int = MIB
    lifted_by_token: bool = False
    # About what the default budget of 64 contexts takes on a 2-core CPU in fp32 (docs/serving.md).
    budget_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("questions", "n_articles", "budget", "articles", "query_body"):
            value, ceiling = getattr(self, name), CEILINGS[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{ENV}: {_key(name)} must be a whole number >= 1, got {_said(value)}")
            if value > ceiling:
                raise ConfigError(
                    f"{ENV}: {_key(name)} may be at most {_shown(name, ceiling)}, got {_said(value)}"
                )
        value = self.budget_s
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 < value <= CEILINGS["budget_s"]
        ):
            raise ConfigError(
                f"{ENV}: budget-s must be more than 0 and at most {CEILINGS['budget_s']:,.0f} seconds,"
                f" got {_said(value)}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RequestLimits:
        """The limits ``BERTKNN_SERVE_LIMITS`` sets over the defaults: ``name=value`` pairs separated by
        commas, e.g. ``questions=64,budget=512,exact=yes,lifted-by-token=yes``.

        Raises:
            ConfigError: an unknown name, a name given twice, or a value its limit cannot take.
        """
        env = os.environ if environ is None else environ
        text = env.get(ENV, "").strip()
        return cls.parse(text) if text else cls()

    @classmethod
    def parse(cls, text: str, source: str = ENV) -> RequestLimits:
        """See ``from_env``; ``source`` names where ``text`` came from in errors (``serve --limits``)."""
        fields = {_key(f.name): f for f in dataclasses.fields(cls)}
        names = ", ".join(fields)
        values: dict[str, Any] = {}
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            key, equals, raw = (s.strip() for s in item.partition("="))
            if not equals or key not in fields:
                raise ConfigError(f"{source}: {item!r} is not NAME=VALUE with a NAME of {names}")
            name = fields[key].name
            if name in values:
                raise ConfigError(f"{source} sets {key} twice; keep one")
            values[name] = _value(key, raw, source)
        try:
            return cls(**values)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(ENV, source, 1)) from None

    def describe(self) -> str:
        """The limits as parsed, in one line (``serve`` logs it): ``questions=4, n-articles=10, ...``."""
        return ", ".join(
            f"{_key(f.name)}={_shown(f.name, getattr(self, f.name))}" for f in dataclasses.fields(self)
        )

    def as_json(self) -> dict[str, Any]:
        """The limits by the names ``BERTKNN_SERVE_LIMITS`` uses (``query-body-mb`` in MiB)."""
        out = {_key(f.name): getattr(self, f.name) for f in dataclasses.fields(self)}
        out["query-body-mb"] = round(self.query_body / MIB, 3)
        return out


# The most each limit may be: what the request schema lets any request ask (``schemas``), or the
# server's own bounds; a larger limit would only look as if it allowed more.
CEILINGS: dict[str, float] = {
    "questions": MAX_QUESTIONS,
    "n_articles": 1000,
    "budget": 10_000_000,
    "articles": 10_000,
    "query_body": 1024 * MIB,
    "budget_s": 86_400.0,
}


def _said(value: Any) -> str:
    """A given value in a message, cut short (a limit of 10**100 digits must not fill the log)."""
    text = repr(value)
    return text if len(text) <= 24 else text[:20] + "…"


def _shown(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if name == "query_body":
        return f"{value / MIB:g}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _key(name: str) -> str:
    return "query-body-mb" if name == "query_body" else name.replace("_", "-")


def _value(key: str, raw: str, source: str) -> Any:
    if key in ("exact", "lifted-by-token"):
        switch = raw.lower()
        if switch in ("1", "true", "yes", "on"):
            return True
        if switch in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{source}: {key} must be yes or no, got {raw!r}")
    try:
        if key == "query-body-mb":
            mib = float(raw)
            if not 0 < mib <= CEILINGS["query_body"] / MIB:
                raise ConfigError(
                    f"{source}: query-body-mb must be more than 0 and at most"
                    f" {CEILINGS['query_body'] / MIB:g}, got {_said(raw)}"
                )
            return max(1, int(mib * MIB))
        if key == "budget-s":
            seconds = float(raw)
            if seconds != seconds:  # NaN passes every comparison
                raise ValueError
            return seconds
        return int(raw)  # int() reads "1_000" and " 5": both meant as numbers
    except ValueError:
        raise ConfigError(f"{source}: {key} must be a number, got {_said(raw)}") from None


def bearer(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The token in an ``Authorization: Bearer <token>`` header; None without one."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


class RequestGuard:
    """ASGI middleware, before the app reads anything: the token of a write, then the body's size.

    A write (any request but ``GET``/``HEAD`` and ``POST /query``) to a server with a token is a 401
    unless it gives the token; a body larger than its limit is a 413 from its Content-Length, or, sent
    chunked, as soon as the bytes received pass the limit. A ``POST /query`` body's limit is
    ``limits.query_body`` unless the token lifts it; every other body's is ``max_bytes``. The request
    reaches the app with ``scope[TRUSTED]``: whether it gave the token. A body past ``LARGE`` bytes waits
    for one of ``LARGE_AT_ONCE`` places before more of it is read, and keeps it until its request ends.
    """

    def __init__(self, app: Any, token: str | None, max_bytes: int, limits: RequestLimits) -> None:
        self.app = app
        self.token = token
        self.max_bytes = max_bytes
        self.limits = limits
        self.large = asyncio.Semaphore(LARGE_AT_ONCE)

    def trusted(self, given: str | None) -> bool:
        """Whether ``given`` is the server's token (compared in constant time)."""
        if self.token is None or given is None:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers") or []
        if sum(name == b"authorization" for name, _ in headers) > 1:
            await refuse(send, 400, "the request has more than one Authorization header; send one")
            return
        trusted = self.trusted(bearer(headers))
        method, path = scope.get("method", ""), scope.get("path", "")
        read = method in READ_METHODS or (method, path) in READS
        if self.token is not None and not read and not trusted:
            await refuse(send, 401, TOKEN_NEEDED, [(b"www-authenticate", b"Bearer")])
            return
        scope[TRUSTED] = trusted
        limit, name = self.max_bytes, "--max-body-mb"
        query = (method, path) in READS and not (trusted and self.limits.lifted_by_token)
        if query and self.limits.query_body < limit:
            limit, name = self.limits.query_body, "query-body-mb"
        declared = dict(headers).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await refuse(send, 413, self._too_large(limit, name))
            return
        seen, held = 0, False

        async def counted() -> Any:
            nonlocal seen, held
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:  # a chunked body has no Content-Length to check up front
                    raise HTTPException(413, self._too_large(limit, name))
                if seen > LARGE and not held:
                    await self.large.acquire()
                    held = True
            return message

        try:
            await self.app(scope, counted, send)
        finally:
            if held:
                self.large.release()

    def _too_large(self, limit: int, name: str) -> str:
        if name == "--max-body-mb":
            return f"the body is larger than the server's limit of {limit:,} bytes (--max-body-mb)"
        return (
            f"the body is larger than the {limit:,} bytes a query may send (limit query-body-mb);"
            f" send fewer questions per request, or {how_to_lift(self.limits, self.token)}"
        )


def query_refusal(
    limits: RequestLimits, token: str | None, server: Config, asked: Config, questions: int, device: str
) -> tuple[int, str] | None:
    """Why a ``POST /query`` without a lifting token is over its limits (status, one line); None if not.

    Args:
        server: the server's settings; ``asked``: them with the request's overrides.
        questions: how many the request holds; ``device``: where the model runs ("cpu", "cuda").
    """
    lift = how_to_lift(limits, token)
    if questions > limits.questions:
        return 413, (
            f"the request holds {questions:,} questions, more than the {limits.questions:,} one request may"
            f" hold here (limit questions); send them in several requests, or {lift}"
        )
    cap = max(limits.n_articles, server.n_articles)
    if asked.n_articles > cap:
        return 422, (
            f"n-articles {asked.n_articles:,} is more than the {cap:,} articles a question may search here"
            f" (limit n-articles); ask for fewer, or {lift}"
        )
    if asked.exact and not (server.exact or limits.exact):
        return 422, (
            "exact: true (encode every missing context of the articles searched before answering) is not"
            " allowed here (limit exact); ask without it (a cold answer comes within the budget and grows"
            f" as it is asked again), or {lift}"
        )
    seconds = asked.budget_seconds_for(device)
    seconds_cap = max(limits.budget_s, server.budget_seconds_for(device) or 0)
    if seconds is not None and seconds > seconds_cap:
        return 422, (
            f"budget-s {seconds:g} is more than the {seconds_cap:g} seconds a question may encode before it"
            f" answers here (limit budget-s); ask for less, or {lift}"
        )
    own = server.budget_for(device) or 0
    if seconds is None and server.budget_seconds_for(device) is not None:
        own = 0  # the server's own count comes with its clock (a CPU's 1,024): without one, the limit
    budget, cap = asked.budget_for(device), max(limits.budget, own)
    by_seconds = asked.budget is None and asked.budget_s is not None  # bounded by its seconds alone
    if budget is not None and budget > cap and not by_seconds:
        return 422, (
            f"budget {budget:,} is more than the {cap:,} contexts a question may encode before it answers"
            f" here (limit budget); ask for less, or {lift}"
        )
    return None


def articles_refusal(limits: RequestLimits, token: str | None, articles: int) -> str | None:
    """Why a ``POST /articles`` without a lifting token holds too many articles (413); None if not."""
    if articles <= limits.articles:
        return None
    return (
        f"the request adds {articles:,} articles, more than the {limits.articles:,} one request may add"
        f" here (limit articles); send them in several requests, or {how_to_lift(limits, token)}"
    )


def lifted(limits: RequestLimits, scope: Scope) -> bool:
    """Whether the request's token lifts the limits (it gave the token, and the operator said so)."""
    return limits.lifted_by_token and bool(scope.get(TRUSTED))


TOKEN_NEEDED = "writes need a token: send 'Authorization: Bearer <token>' with the server's --token-file"


def how_to_lift(limits: RequestLimits, token: str | None) -> str:
    """How a client gets past a limit on this server (one clause, for a refusal's message)."""
    if token is not None and limits.lifted_by_token:
        return "send the server's token ('Authorization: Bearer <token>'), which lifts the limit"
    return f"ask the server's operator to raise it ({ENV}, see docs/serving.md)"


async def refuse(
    send: Any, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer ``{"detail": "one line"}`` from a middleware, before the app (and its handlers) sees it."""
    body = json.dumps({"detail": one_line(detail)}).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": body})
