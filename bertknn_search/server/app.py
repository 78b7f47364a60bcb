"""The FastAPI app: routes over Searcher (through the batcher), the ingest pipeline and index stats.

Every error is a JSON ``{"detail": "one line"}`` with a 4xx (the request) or 5xx (the server) status.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import socket
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from bertknn_search import session
from bertknn_search.config import Config, settings_file_values
from bertknn_search.errors import (
    BackendError,
    BertKnnError,
    ConfigError,
    IndexCorruptError,
    IndexNotFoundError,
    InputFormatError,
    LazyIndexError,
    QuestionError,
)
from bertknn_search.output import to_json
from bertknn_search.query.search import Searcher
from bertknn_search.records import Article, Question
from bertknn_search.server import discovery
from bertknn_search.server.batcher import Busy, MicroBatcher, NotReady, Stopping, gather_answers
from bertknn_search.server.hosts import PAGE_CSP, HostCheck, SecurityHeaders, allowed_names, docs_csp
from bertknn_search.server.limits import (
    TOKEN_NEEDED,
    RequestGuard,
    RequestLimits,
    articles_refusal,
    lifted,
    one_line,
    query_refusal,
)
from bertknn_search.server.schemas import ArticlesRequest, QueryRequest
from bertknn_search.server.writer import Writer

log = logging.getLogger("bertknn_search.server")
STATIC = Path(str(files("bertknn_search.server") / "static"))

# What the request got wrong is a 422; what the server cannot do now is a 503.
STATUS: dict[type[BertKnnError], int] = {
    QuestionError: 422,
    ConfigError: 422,
    InputFormatError: 422,
    LazyIndexError: 422,
    Stopping: 503,
    IndexNotFoundError: 503,
    IndexCorruptError: 503,
    BackendError: 503,
}


@dataclass(frozen=True)
class ServerSettings:
    """How the server runs; ``config`` holds the method defaults a request may override.

    Attributes:
        config: the resolved settings (the index's model and layer, the method options given to serve).
        token: writes (POST and DELETE /articles) need ``Authorization: Bearer <token>``; None: open.
        max_body: request bodies larger than this many bytes are refused (413).
        max_batch: questions per encoder pass at most; None: ``config``'s batch size for the device.
        window_s: how long the first question of a batch waits for others.
        max_queue: questions waiting at most; more are refused (503).
        patience_s: how long a batch may wait for as many questions as the last one had; None: a quarter
            of the last pass, at most 0.25 s (see ``batcher``).
        allowed_hosts: names requests may give in Host (and Origin) besides loopback ones (see ``hosts``).
        limits: what one request may cost unless its token lifts them (see ``limits``); default: the
            built-in limits with ``BERTKNN_SERVE_LIMITS`` over them.
        nonce: the secret of this server's announcement (see ``discovery``): ``GET /serving`` proves
            that the server holds it.
    """

    config: Config
    token: str | None = None
    max_body: int = 16 * 1024 * 1024
    max_batch: int | None = None
    window_s: float = 0.005
    max_queue: int = 4096
    patience_s: float | None = None
    allowed_hosts: tuple[str, ...] = ()
    limits: RequestLimits = field(default_factory=RequestLimits.from_env)
    nonce: str = field(default_factory=discovery.new_nonce, repr=False)


def create_app(settings: ServerSettings, open_searcher: Callable[[], Searcher] | None = None) -> FastAPI:
    """The app; the model loads on a worker thread when the app starts (``/health`` says when it is ready).

    Args:
        settings: see ``ServerSettings``.
        open_searcher: loads index and model; default ``Searcher.open(settings.config)``.

    Raises:
        ConfigError: the limits are to be lifted by a token and the server has none.
    """
    config, limits, token = settings.config, settings.limits, settings.token
    if limits.lifted_by_token and token is None:
        raise ConfigError("the limits say lifted-by-token=yes but the server has no token; give --token-file")
    batcher = MicroBatcher(
        open_searcher or (lambda: Searcher.open(config)),
        settings.max_batch,
        settings.window_s,
        settings.max_queue,
        settings.patience_s,
    )
    writer = Writer(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        # uvicorn has let running requests finish; an add still queued or running finishes here too.
        await run_in_threadpool(writer.close)
        await run_in_threadpool(batcher.stop)

    app = _App(
        title="bertknn-search",
        summary="Cloze questions answered with BERT-kNN over a live index.",
        version=_version(),
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.batcher = batcher
    app.state.writer = writer
    # The token of a write and the size of the body, before the app reads the body (see ``limits``).
    app.add_middleware(RequestGuard, token=token, max_bytes=settings.max_body, limits=limits)
    # Added last, so it runs first: a request for another host is refused before its body is read.
    app.add_middleware(HostCheck, allowed=allowed_names(settings.allowed_hosts))
    _add_error_handlers(app)
    bearer = HTTPBearer(auto_error=False, description="The token in the server's --token-file.")

    def require_token(given: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:  # noqa: B008
        # RequestGuard refused a write without the token before its body was read; checked again here so
        # that a route never depends on a middleware alone (and the API docs show the lock).
        if token is None:
            return
        if given is None or not hmac.compare_digest(given.credentials.encode(), token.encode()):
            raise HTTPException(401, TOKEN_NEEDED, headers={"WWW-Authenticate": "Bearer"})

    @app.post("/query", summary="Answer one or many cloze questions")
    async def query(body: QueryRequest, request: Request) -> Response:
        """Each answer is the JSON ``bertknn-search query --json`` prints, in the order asked.

        Method options (``k``, ``lambda``, ``temperature``, ``n-articles``, ``distance``, ``no-ir``,
        ``top``, ``gate``, ``evidence``, ``budget``, ``budget-s``, ``exact``) replace the server's defaults
        for this request, within the server's limits (``server.limits`` in ``/stats``).

        ``evidence_for`` (a list of words, at most 10 of at most 100 characters each; inside each item of
        ``questions``) adds ``evidence_for`` to the answer: per word, the sentences of the neighbours that
        voted for it, ranked among the top answers or not, how many voted, and whether it can be an
        answer on this index at all.

        Evidence spans: ``start`` and ``end`` of each evidence sentence count Unicode code points (as
        Python indexes a string), not UTF-16 units (as JavaScript does): an emoji is one code point and
        two UTF-16 units, so a page must slice ``Array.from(sentence)``, not ``sentence``.
        """
        cfg = body.apply(config)
        items = body.items()
        if not lifted(limits, request.scope):
            device = batcher.device_type or "cpu"
            refused = query_refusal(limits, token, config, cfg, len(items), device)
            if refused is not None:
                raise HTTPException(*refused)
        asked = [
            Question(q.question, q.subject, q.popularity, q.relation, tuple(q.evidence_for or ()))
            for q in items
        ]
        futures = batcher.submit(asked, cfg)
        # A client that leaves gives its questions up: no encode goes on for nobody (see ``batcher``).
        results = await gather_answers(futures, request.is_disconnected)
        for i, result in enumerate(results):
            if isinstance(result, BaseException):
                if isinstance(result, QuestionError) and len(items) > 1:
                    raise QuestionError(f"question {i + 1}: {result}") from result
                raise result
        return _json_response('{"answers": [' + ", ".join(to_json(a) for a in results) + "]}")

    @app.post("/articles", summary="Add or replace articles", dependencies=[Depends(require_token)])
    async def add_articles(body: ArticlesRequest, request: Request) -> Response:
        """Returns once the articles are answerable, with what was written (the JSON of ``add --json``).

        An article whose id is stored already is replaced.
        """
        if not lifted(limits, request.scope):
            too_many = articles_refusal(limits, token, len(body.articles))
            if too_many is not None:
                raise HTTPException(413, too_many)
        limit = config.max_article_bytes
        for a in body.articles:
            # The CLI's limit: one article's text decides a cold encode's rows and its stored row.
            size = len(a.text.encode("utf-8"))
            if size > limit:
                raise HTTPException(
                    413,
                    f"article {a.id!r} holds {size:,} bytes of text, more than the {limit:,} one article"
                    " may hold (Wikipedia's own page limit); split it, nothing was written",
                )
        articles = [Article(a.id, a.title, a.text) for a in body.articles]
        summary = await asyncio.wrap_future(writer.add(articles))
        return _json_response(to_json(summary))

    @app.delete("/articles/{article_id}", summary="Delete an article", dependencies=[Depends(require_token)])
    async def delete_article(article_id: str) -> dict[str, str]:
        """The article, its contexts and its IR entries go; questions no longer find it."""
        deleted = await asyncio.wrap_future(writer.delete([article_id]))
        if not deleted:
            raise HTTPException(404, f"no article with id {article_id!r} in the index")
        return {"deleted": article_id}

    @app.get("/stats", summary="What the index holds, and what the server has done")
    async def stats() -> Response:
        """The JSON of ``bertknn-search stats --json``, plus ``server``: questions, batches, writes, and the
        ``defaults`` a request gets, by the request's names (``lambda``, ``no-ir``, ``n-articles``)."""
        index = await run_in_threadpool(session.index_stats, config)
        result = json.loads(to_json(index))
        head = batcher.has_head if batcher.has_head is not None else index.mlm_head
        result["server"] = {
            **batcher.stats.as_dict(),
            "adds": writer.adds,
            "deletes": writer.deletes,
            "writing": writer.running,
            "max_batch": batcher.max_batch,
            "defaults": request_defaults(config, batcher.device_type, head),
            "limits": request_limits(limits, config, batcher.device_type),
        }
        return _json_response(json.dumps(result, ensure_ascii=False, allow_nan=False))

    @app.get("/health", summary="Ready once the model is loaded and the index's engine answers")
    async def health() -> JSONResponse:
        """200 ``{"status": "ready"}`` once questions can be answered; 503 while loading or failed, and
        ``degraded`` (with the reason) while the engine of an index on OpenSearch or Elasticsearch cannot
        be reached: every question would fail then."""
        status, detail = batcher.status()
        if status == "ready":
            problem = await run_in_threadpool(engine_problem, config)
            if problem is not None:
                status, detail = (
                    "degraded",
                    f"the model is loaded, but {problem}; questions fail until it is back",
                )
        return JSONResponse(
            {"status": status, "detail": detail}, status_code=200 if status == "ready" else 503
        )

    @app.get("/serving", include_in_schema=False)
    async def serving(challenge: str = Query(min_length=16, max_length=128)) -> JSONResponse:
        # Token-free on purpose: ``query --server auto`` asks before it sends its questions or token, and
        # the answer proves only that this server holds its announcement's nonce (see ``discovery``).
        return JSONResponse({"proof": discovery.proof(settings.nonce, challenge), "pid": os.getpid()})

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": PAGE_CSP})

    # Browsers ask for /favicon.ico whatever a page links to (the API docs, a JSON reply): no 404 in the log.
    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    _add_docs(app)
    return app


PROBE_TIMEOUT_S = 1.0  # /health must answer in about a second, whatever the engine does


def engine_problem(config: Config) -> str | None:
    """Why the engine of ``config``'s index cannot be reached (no node accepts a connection at any of its
    URLs), in a clause; None when one does, or for the embedded store. A TCP connection, not a request:
    it needs no credentials and no retries, and says what matters here, whether the engine is there."""
    urls = {"opensearch": config.opensearch_url, "elasticsearch": config.elasticsearch_url}.get(
        config.backend
    )
    if not urls:
        return None
    why = ""
    for url in (u.strip() for u in urls.split(",") if u.strip()):
        try:
            parts = urllib.parse.urlsplit(url if "//" in url else f"http://{url}")
            address = (
                parts.hostname or "127.0.0.1",
                parts.port or (443 if parts.scheme == "https" else 9200),
            )
            with socket.create_connection(address, timeout=PROBE_TIMEOUT_S):
                return None
        except (OSError, ValueError) as exc:
            why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return f"the {config.backend} engine at {urls} cannot be reached ({why})"


def request_defaults(config: Config, device_type: str | None, has_head: bool | None) -> dict[str, Any]:
    """The method options a question gets unless its request gives them, spelled as a request spells them
    (``lambda``, ``no-ir``, ``n-articles``) and with the values that apply: λ is 1 on a model without a
    masked-LM head (BERT-kNN is kNN alone there), and ``budget`` is the device's default when none was
    given (null: exact, or the model not loaded yet to say which device it runs on).

    Args:
        config: the server's settings.
        device_type: "cpu" or "cuda", where the model runs; None before it loads.
        has_head: whether the model has a masked-LM head; None when unknown.
    """
    values = settings_file_values(config.method_settings())
    if has_head is False:
        values["lambda"] = 1.0
    values["budget"] = config.budget if device_type is None else config.budget_for(device_type)
    values["budget-s"] = config.budget_s if device_type is None else config.budget_seconds_for(device_type)
    return {"top": config.top, **values}


def request_limits(limits: RequestLimits, config: Config, device_type: str | None) -> dict[str, Any]:
    """What a request without a lifting token may ask, by ``BERTKNN_SERVE_LIMITS``'s names: the limits,
    raised to the server's own defaults where those are higher (see ``RequestLimits``)."""
    out = limits.as_json()
    out["n-articles"] = max(limits.n_articles, config.n_articles)
    out["budget"] = max(limits.budget, config.budget_for(device_type or "cpu") or 0)
    out["budget-s"] = max(limits.budget_s, config.budget_seconds_for(device_type or "cpu") or 0)
    out["exact"] = limits.exact or config.exact
    return out


class _App(FastAPI):
    """FastAPI with ``SecurityHeaders`` around its whole stack: error pages and refusals get them too."""

    def build_middleware_stack(self) -> Any:
        return SecurityHeaders(super().build_middleware_stack())


def _json_response(text: str) -> Response:
    return Response(text, media_type="application/json")


def _add_docs(app: FastAPI) -> None:
    """The OpenAPI page, with Swagger UI served from the installed package rather than a CDN.

    fastapi-offline ships Swagger UI 5, which reads the OpenAPI 3.1 that FastAPI writes; the 4.x of
    swagger-ui-bundle rendered "does not specify a valid version field" instead of the operations.
    """
    assets = Path(str(files("fastapi_offline") / "static"))
    app.mount("/docs-assets", StaticFiles(directory=assets), name="docs-assets")

    html = get_swagger_ui_html(
        openapi_url=app.openapi_url or "/openapi.json",
        title="bertknn-search API",
        swagger_js_url="/docs-assets/swagger-ui-bundle.js",
        swagger_css_url="/docs-assets/swagger-ui.css",
        swagger_favicon_url="/static/favicon.svg",
    ).body.decode()
    policy = docs_csp(html)  # the inline script that starts Swagger UI, allowed by its hash

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(html, headers={"Content-Security-Policy": policy})


def release(exc: BaseException) -> None:
    """Let go of what a handled exception keeps alive: its traceback's frames, which hold the request's
    body (its bytes, its text, its parsed JSON). FastAPI keeps the error it raises in a local of the frame
    that read the body, a reference cycle that only the full garbage collection frees, seconds later:
    meanwhile 8 refused 16 MiB bodies held 270 MB."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.__traceback__ = None
        if isinstance(current, RequestValidationError):
            current.body = None  # the body as parsed (or, not JSON, its text)
        current = current.__cause__ or current.__context__


def _add_error_handlers(app: FastAPI) -> None:
    def reply(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse({"detail": one_line(detail)}, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        release(exc)
        errors = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            why = next(e for e in errors if e.get("type") == "json_invalid").get("ctx", {}).get("error", "")
            return reply(400, f"the body is not valid JSON ({why})" if why else "the body is not valid JSON")
        return reply(422, "; ".join(_describe(e) for e in errors[:5]))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        release(exc)
        return reply(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(BertKnnError)
    async def library_error(request: Request, exc: BertKnnError) -> JSONResponse:
        release(exc)
        status = next((s for kind, s in STATUS.items() if isinstance(exc, kind)), 500)
        return reply(status, str(exc))

    @app.exception_handler(NotReady)
    async def not_ready(request: Request, exc: NotReady) -> JSONResponse:
        return reply(503, str(exc), {"Retry-After": "5"})

    @app.exception_handler(Busy)
    async def busy(request: Request, exc: Busy) -> JSONResponse:
        return reply(503, f"the server is busy: {exc}", {"Retry-After": "1"})

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return reply(500, f"internal error ({type(exc).__name__}: {exc}); the server log has the details")


def _describe(error: Any) -> str:
    """A pydantic error as "where: what" ("questions.2.question: Field required")."""
    where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
    if error.get("type") == "extra_forbidden":
        return f"unknown field {where!r}"
    message = str(error.get("msg", "invalid"))
    message = message.removeprefix("Value error, ")
    return f"{where or 'the body'}: {message}"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bertknn-search")
    except PackageNotFoundError:
        return "0"
