"""Requests to OpenSearch or Elasticsearch: retries with backoff, one-line errors without secrets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from bertknn_search.backends.engines.dialect import Dialect, PartialAnswer
from bertknn_search.errors import BackendError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a failed request is tried again.

    Waits grow as ``initial_backoff · 2^n`` seconds, capped at ``max_backoff``; tests set both to 0.
    """

    attempts: int = 5
    initial_backoff: float = 0.5
    max_backoff: float = 8.0


def is_transient(exc: BaseException, engine: Dialect) -> bool:
    """Worth another try: the connection failed or timed out, part of the shards did not answer, or the
    server said 429 or 5xx, except for an index that refuses writes (a block: trying again cannot help)."""
    if isinstance(exc, PartialAnswer) or engine.is_connection_error(exc):
        return True
    status = engine.status(exc)
    if status is None or "cluster_block_exception" in engine.reason(exc):
        return False
    return status == 429 or status >= 500


def call(
    what: str, url: str, fn: Callable[[], T], policy: RetryPolicy, engine: Dialect, retry_429: bool = True
) -> T:
    """Run ``fn``, retrying transient failures with exponential backoff.

    Args:
        what: the action, completing "failed to ..." in messages (e.g. "search articles").
        url: the cluster URL without credentials, for messages.
        fn: the request.
        policy: attempts and backoff.
        engine: reads the client's exceptions.
        retry_429: False where 429s were retried already (per document, inside a bulk helper).

    Returns:
        What ``fn`` returned, as plain JSON values (an Elasticsearch response's body).

    Raises:
        BackendError: one line saying what failed, where, and what to do.
    """

    def transient(exc: BaseException) -> bool:
        return is_transient(exc, engine) and (retry_429 or engine.status(exc) != 429)

    retrying = Retrying(
        stop=stop_after_attempt(policy.attempts),
        wait=wait_exponential(multiplier=policy.initial_backoff, max=policy.max_backoff),
        retry=retry_if_exception(transient),
        reraise=True,
    )
    try:
        result = retrying(fn)
    except PartialAnswer as exc:
        attempts = retrying.statistics.get("attempt_number", 1)
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        raise BackendError(
            one_line(
                f"{engine.title} at {url} could not {what} from every shard{tries} ({exc}); a node is"
                " down or recovering: check the cluster's health, then run the command again"
            )
        ) from exc
    except engine.errors as exc:
        attempts = retrying.statistics.get("attempt_number", 1)
        raise BackendError(describe(what, url, exc, engine, attempts)) from exc
    return getattr(result, "body", result)  # type: ignore[no-any-return]


def describe(what: str, url: str, exc: BaseException, engine: Dialect, attempts: int = 1) -> str:
    """One line for a failed request: what, where, why, after how many attempts, and what to do."""
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    env = engine.env
    if engine.is_connection_error(exc):
        hint = (
            f"check {env}_CA (or --insecure for a test cluster with a self-signed certificate)"
            if engine.is_ssl_error(exc)
            else f"check that the cluster is up and {env}_URL is right"
        )
        return one_line(
            f"cannot reach {engine.title} at {url} to {what}{tries} ({type(exc).__name__}:"
            f" {engine.reason(exc)}); {hint}"
        )
    status = engine.status(exc)
    reason = engine.reason(exc)
    if "cluster_block_exception" in reason:
        hint = (
            "the index refuses writes (a write block, or a disk past its flood-stage watermark): free"
            " space or lift the block, then run the command again; nothing already written was lost"
        )
    elif status == 429:
        hint = "the cluster is overloaded: run the command again later or give the cluster more resources"
    elif status is not None and status >= 500:
        hint = "check the cluster's health and logs, then run the command again"
    elif status in (401, 403):
        hint = f"check {env}_USER / {env}_PASSWORD and the user's index permissions"
    else:
        hint = "the request was rejected; check the indices were made by this version of bertknn-search"
    code = f"HTTP {status} " if status is not None else ""
    return one_line(f"{engine.title} at {url} failed to {what}{tries}: {code}{reason}; {hint}")


def bulk_error_message(title: str, what: str, url: str, failures: list[dict[str, Any]], total: int) -> str:
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
    if "cluster_block_exception" in reason:
        return one_line(
            f"{title} at {url} refused {len(failures)} of {total} documents while trying to {what}:"
            f" {reason}; the index refuses writes (a write block, or a disk past its flood-stage"
            " watermark): free space or lift the block, then run the same command again;"
            " nothing already written was lost"
        )
    return one_line(
        f"{title} at {url} rejected {len(failures)} of {total} documents while trying to {what}"
        f" (first: {op} {info.get('_id')!r}, status {info.get('status')}, {reason});"
        " those articles were not written (an earlier version stays as it was);"
        " fix the input and run the add again"
    )


def one_line(text: str, limit: int = 600) -> str:
    """``text`` with whitespace runs collapsed, cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
