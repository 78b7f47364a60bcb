"""OpenSearch connections: the client from a Config, retries with backoff, one-line errors without secrets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

from opensearchpy import OpenSearch
from opensearchpy.exceptions import ConnectionError as OSConnectionError
from opensearchpy.exceptions import OpenSearchException, SSLError, TransportError
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from bertknn_search.config import Config
from bertknn_search.errors import BackendError, ConfigError

T = TypeVar("T")
TIMEOUT_S = 120  # a bulk chunk of 768-d vectors can take a while on a busy node


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a failed request is tried again.

    Waits grow as ``initial_backoff · 2^n`` seconds, capped at ``max_backoff``; tests set both to 0.
    """

    attempts: int = 5
    initial_backoff: float = 0.5
    max_backoff: float = 8.0


def public_url(url: str) -> str:
    """``url`` without any ``user:password@`` part: the only form that is ever shown or logged."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # IPv6 literal
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def make_client(config: Config) -> OpenSearch:
    """An OpenSearch client for ``config``'s URL, credentials and TLS settings.

    The client's own retries are off: ``call`` is the one retry layer, so attempts are counted once.

    Raises:
        ConfigError: no URL, a URL that is not http(s), or a CA file that does not exist.
    """
    url = config.opensearch_url
    if not url:
        raise ConfigError(
            "the opensearch backend needs a URL: set OPENSEARCH_URL or --opensearch-url"
            " (e.g. http://localhost:9200)"
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"OpenSearch URL {public_url(url)!r} must look like http(s)://host:port")
    if config.opensearch_ca is not None and not config.opensearch_ca.is_file():
        raise ConfigError(f"CA file {config.opensearch_ca} not found; check --opensearch-ca / OPENSEARCH_CA")
    user = config.opensearch_user or (unquote(parts.username) if parts.username else None)
    password = config.opensearch_password or (unquote(parts.password) if parts.password else "")
    options: dict[str, Any] = {
        "hosts": [public_url(url)],
        "max_retries": 0,
        "timeout": TIMEOUT_S,
        "http_compress": True,  # JSON vectors compress about 3x
        "verify_certs": config.opensearch_verify,
    }
    if user:
        options["http_auth"] = (user, password)
    if config.opensearch_ca is not None:
        options["ca_certs"] = str(config.opensearch_ca)
    if not config.opensearch_verify:
        # The user chose not to verify (--insecure): one warning per request would bury the output.
        options.update(ssl_show_warn=False, ssl_assert_hostname=False)
    return OpenSearch(**options)


def is_transient(exc: BaseException) -> bool:
    """Worth another try: the connection failed or timed out, or the server said 429 or 5xx."""
    if isinstance(exc, OSConnectionError):
        return True
    if isinstance(exc, TransportError):
        status = exc.status_code
        return isinstance(status, int) and (status == 429 or status >= 500)
    return False


def call(
    what: str,
    url: str,
    fn: Callable[[], T],
    policy: RetryPolicy,
    transient: Callable[[BaseException], bool] = is_transient,
) -> T:
    """Run ``fn``, retrying transient failures with exponential backoff.

    Args:
        what: the action, completing "failed to ..." in messages (e.g. "search articles").
        url: the cluster URL without credentials, for messages.
        fn: the request.
        policy: attempts and backoff.
        transient: which exceptions are retried.

    Raises:
        BackendError: one line saying what failed, where, and what to do.
    """
    retrying = Retrying(
        stop=stop_after_attempt(policy.attempts),
        wait=wait_exponential(multiplier=policy.initial_backoff, max=policy.max_backoff),
        retry=retry_if_exception(transient),
        reraise=True,
    )
    try:
        return retrying(fn)
    except OpenSearchException as exc:
        attempts = retrying.statistics.get("attempt_number", 1)
        raise BackendError(describe(what, url, exc, attempts)) from exc


def describe(what: str, url: str, exc: OpenSearchException, attempts: int = 1) -> str:
    """One line for a failed request: what, where, why, after how many attempts, and what to do."""
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    if isinstance(exc, OSConnectionError):
        cause = getattr(exc, "info", None) or exc.error
        hint = (
            "check OPENSEARCH_CA (or --insecure for a test cluster with a self-signed certificate)"
            if isinstance(exc, SSLError)
            else "check that the cluster is up and OPENSEARCH_URL is right"
        )
        return one_line(
            f"cannot reach OpenSearch at {url} to {what}{tries} ({type(exc).__name__}: {cause}); {hint}"
        )
    status = exc.status_code if isinstance(exc, TransportError) else None
    reason = _reason(exc)
    if status == 429:
        hint = "the cluster is overloaded: run the command again later or give the cluster more resources"
    elif isinstance(status, int) and status >= 500:
        hint = "check the cluster's health and logs, then run the command again"
    elif status in (401, 403):
        hint = "check OPENSEARCH_USER / OPENSEARCH_PASSWORD and the user's index permissions"
    else:
        hint = "the request was rejected; check the indices were made by this version of bertknn-search"
    code = f"HTTP {status} " if status is not None else ""
    return one_line(f"OpenSearch at {url} failed to {what}{tries}: {code}{reason}; {hint}")


def bulk_error_message(what: str, url: str, failures: list[dict[str, Any]], total: int) -> str:
    """One line for per-document bulk failures, naming the first one."""
    op, info = next(iter(failures[0].items()))
    error = info.get("error", {})
    if isinstance(error, dict):
        caused = error.get("caused_by", {})
        reason = f"{error.get('type')}: {error.get('reason')}"
        if isinstance(caused, dict) and caused.get("reason"):
            reason += f" ({caused.get('type')}: {caused.get('reason')})"
    else:
        reason = str(error)
    return one_line(
        f"OpenSearch at {url} rejected {len(failures)} of {total} documents while trying to {what}"
        f" (first: {op} {info.get('_id')!r}, status {info.get('status')}, {reason});"
        " those articles were not written (an earlier version stays as it was);"
        " fix the input and run the add again"
    )


def one_line(text: str, limit: int = 600) -> str:
    """``text`` with whitespace runs collapsed, cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _reason(exc: OpenSearchException) -> str:
    if not isinstance(exc, TransportError):
        return f"{type(exc).__name__}: {exc}"
    info = exc.info
    if isinstance(info, dict) and isinstance(info.get("error"), dict):
        err = info["error"]
        return f"{err.get('type')}: {err.get('reason')}"
    return str(exc.error)
