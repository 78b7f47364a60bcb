"""Requests to OpenSearch or Elasticsearch: retries with backoff, one-line errors without secrets.

Retries are for a cluster that answered before in this process (a node lost, a restart): where nothing
ever answered at a URL, a connection error is a mistake in the URL or a node not started, said at once
with its fix rather than after 5 attempts (``diagnose``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from bertknn_search.backends.engines.diagnose import (
    block_hint,
    connection_hint,
    disk_full_hint,
    first_node,
    identify,
    is_disk_full,
    probe,
    wrong_product,
)
from bertknn_search.backends.engines.dialect import Dialect, PartialAnswer, public_url
from bertknn_search.config import Config
from bertknn_search.errors import BackendError

T = TypeVar("T")
# Cluster URLs (as shown) that answered a request in this process: connection errors are retried for
# these only. And those whose GET / named the engine expected (``connect``), checked once a process.
ANSWERED: set[str] = set()
IDENTIFIED: set[str] = set()
# Error types that mean the index's mapping refused a document or request: only these point at indices
# made by another version.
MAPPING_ERRORS = (
    "strict_dynamic_mapping_exception",
    "mapper_parsing_exception",
    "document_parsing_exception",
    "illegal_argument_exception: mapper [",
)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a failed request is tried again.

    Waits grow as ``initial_backoff · 2^n`` seconds, capped at ``max_backoff``; tests set both to 0.
    """

    attempts: int = 5
    initial_backoff: float = 0.5
    max_backoff: float = 8.0


def is_transient(exc: BaseException, engine: Dialect, answered: bool = True) -> bool:
    """Worth another try: the connection failed or timed out (at a cluster that ``answered`` before),
    part of the shards did not answer, or the server said 429 or 5xx, except for a block (an index or
    cluster that refuses writes: trying again cannot lift it)."""
    if isinstance(exc, PartialAnswer):
        return True
    if engine.is_connection_error(exc):
        return answered
    status = engine.status(exc)
    if status is None or block_hint(engine.reason(exc), "") is not None:
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
        if engine.status(exc) is not None:
            ANSWERED.add(url)  # an HTTP answer, if an error: the cluster is there
        return is_transient(exc, engine, url in ANSWERED) and (retry_429 or engine.status(exc) != 429)

    retrying = Retrying(
        stop=stop_after_attempt(policy.attempts),
        wait=wait_exponential(multiplier=policy.initial_backoff, max=policy.max_backoff),
        retry=retry_if_exception(transient),
        reraise=True,
    )
    try:
        result = retrying(fn)
    except Throttled as exc:
        attempts = retrying.statistics.get("attempt_number", 1)
        raise BackendError(
            one_line(
                f"{engine.title} at {url} failed to {what} after {attempts} attempts: {exc}; the cluster is"
                " overloaded: run the command again later or give the cluster more resources"
            )
        ) from exc
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
    ANSWERED.add(url)
    return getattr(result, "body", result)  # type: ignore[no-any-return]


def describe(what: str, url: str, exc: BaseException, engine: Dialect, attempts: int = 1) -> str:
    """One line for a failed request: what, where, why, after how many attempts, and what to do."""
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    env = engine.env
    if engine.is_connection_error(exc):
        reason = engine.reason(exc)
        if url not in ANSWERED:
            hint = connection_hint(engine.name, engine.title, env, url, engine.is_ssl_error(exc), reason)
        elif engine.is_ssl_error(exc):
            hint = f"check {env}_CA (or --insecure for a test cluster with a self-signed certificate)"
        else:
            hint = f"check that the cluster is up and {env}_URL is right"
        kind = type(exc).__name__
        said = reason if reason.startswith(kind) else f"{kind}: {reason}"
        return one_line(f"cannot reach {engine.title} at {url} to {what}{tries} ({said}); {hint}")
    status = engine.status(exc)
    reason = engine.reason(exc)
    blocked = disk_full_hint(reason, url) or block_hint(reason, url)
    if blocked is not None:
        hint = blocked
    elif status == 429:
        hint = "the cluster is overloaded: run the command again later or give the cluster more resources"
    elif status is not None and status >= 500:
        hint = "check the cluster's health and logs, then run the command again"
    elif status in (401, 403):
        hint = f"check {env}_USER / {env}_PASSWORD and the user's index permissions"
    elif status == 413:
        hint = (
            "the request is larger than the engine takes (its http.max_content_length, 100 MB by default):"
            " give a smaller --max-article-bytes or raise that setting of the nodes"
        )
    elif any(kind in reason for kind in MAPPING_ERRORS):
        hint = "the index mapping refused it: check the indices were made by this version of bertknn-search"
    else:
        hint = "the engine refused the request as it says; please report it with this line if it persists"
    code = f"HTTP {status} " if status is not None else ""
    return one_line(f"{engine.title} at {url} failed to {what}{tries}: {code}{reason}; {hint}")


def connect(engine: Dialect, config: Config, policy: RetryPolicy) -> Any:
    """The engine's client for ``config``, once a process and URL checked to be that engine.

    ``GET /`` says which product answers: another engine's URL (the other ``--backend``), a ``serve``
    server's or any other web server's is said as such, where it was "no index, build one" or a raw
    client error before. A user who may not read ``GET /`` (401, 403) is let through: the index requests
    say what they may do.

    Raises:
        ConfigError: see ``Dialect.client``.
        BackendError: nothing answers, or what answers is not this engine.
    """
    client = engine.client(config)
    url = public_url(engine.connection(config).url or "")
    if url in IDENTIFIED:
        return client
    try:
        _check_product(client, engine, url, policy)
    except BaseException:
        client.close()
        raise
    IDENTIFIED.add(url)
    return client


def _check_product(client: Any, engine: Dialect, url: str, policy: RetryPolicy) -> None:
    try:
        answer = call("read what the cluster is", url, client.info, policy, engine)
    except BackendError as exc:
        cause = exc.__cause__
        if cause is None or engine.is_connection_error(cause) or engine.status(cause) in (401, 403):
            raise
        node = first_node(url)
        found = probe(node) if node is not None else None
        if found is None or found.product == engine.name:
            raise
        raise BackendError(wrong_product(engine.name, engine.title, engine.env, found, url)) from cause
    found = identify(200, answer if isinstance(answer, dict) else str(answer))
    if found.product != engine.name:
        raise BackendError(wrong_product(engine.name, engine.title, engine.env, found, url))


def bulk_error_message(title: str, what: str, url: str, failures: list[dict[str, Any]], total: int) -> str:
    """One line for per-document bulk failures, naming the first one."""
    op, info = next(iter(failures[0].items()))
    reason = _reason(info)
    blocked = disk_full_hint(reason, url) or block_hint(reason, url)
    if blocked is not None:
        return one_line(
            f"{title} at {url} refused {len(failures)} of {total} documents while trying to {what}:"
            f" {reason}; {blocked}"
        )
    return one_line(
        f"{title} at {url} rejected {len(failures)} of {total} documents while trying to {what}"
        f" (first: {op} {info.get('_id')!r}, status {info.get('status')}, {reason});"
        " those articles were not written (an earlier version stays as it was);"
        " fix the input and run the add again"
    )


class Throttled(PartialAnswer):
    """Some documents of a bulk request were refused with 429 (the engine's queues were full), none for a
    block: the batch is worth sending again whole (ids are deterministic, a re-sent doc overwrites)."""


def refusals(failures: list[dict[str, Any]], total: int) -> list[dict[str, Any]]:
    """The failures of a bulk request that stand, after those that are no failure (a delete of a doc
    already gone: what it asked for).

    Raises:
        Throttled: every one left was a 429 without a block, which another try may get through. A 429 for
            a block (a full disk's flood stage among them) is no overload: it is returned at once, not
            retried for seconds as streaming_bulk's own per-document retries did.
    """
    left = [f for f in failures if not _already_deleted(f)]
    if not left:
        return []
    infos = [next(iter(f.values())) for f in left]
    if all(int(info.get("status") or 0) == 429 for info in infos):
        reasons = [_reason(info) for info in infos]
        if not any(block_hint(r, "") or is_disk_full(r) for r in reasons):
            raise Throttled(f"{len(left)} of {total} documents refused with 429 ({reasons[0]})")
    return left


def _already_deleted(failure: dict[str, Any]) -> bool:
    op, info = next(iter(failure.items()))
    return op == "delete" and int(info.get("status") or 0) == 404


def _reason(info: dict[str, Any]) -> str:
    """A bulk item's error as ``bulk_error_message`` says it: type, reason and what caused it."""
    error = info.get("error", {})
    if not isinstance(error, dict):
        return str(error)
    reason = f"{error.get('type')}: {error.get('reason')}"
    caused = error.get("caused_by", {})
    if isinstance(caused, dict) and caused.get("reason"):
        reason += f" ({caused.get('type')}: {caused.get('reason')})"
    return reason


def unavailable_shards(failures: list[dict[str, Any]], total: int) -> str | None:
    """Why a bulk request is worth sending again whole, or None: every document it could not write failed
    for want of an active shard (HTTP 5xx, e.g. ``unavailable_shards_exception`` while a lost node's
    replica is promoted), which no input change fixes. Ids are deterministic: a re-sent batch overwrites.
    """
    statuses = [int(next(iter(f.values())).get("status") or 0) for f in failures]
    if not statuses or min(statuses) < 500:
        return None
    if any(is_disk_full(_reason(next(iter(f.values())))) for f in failures):
        return None  # a shard that cannot write for want of disk: said at once, not sent again
    first = next(iter(failures[0].values())).get("error", {})
    kind = first.get("type", "unknown") if isinstance(first, dict) else str(first)
    return f"{len(failures)} of {total} documents found no active shard ({kind})"


def one_line(text: str, limit: int = 800) -> str:
    """``text`` with whitespace runs collapsed, cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
