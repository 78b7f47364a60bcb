"""``query --server URL``: questions sent to a running server; answers printed as ``query`` prints them.

Uses only the standard library (no numpy, torch or the server's pydantic schemas), so that asking a
server costs a fraction of a second. ``--token-file`` (or ``BERTKNN_TOKEN_FILE``) sends the server's token
as ``Authorization: Bearer``: with ``lifted-by-token=yes`` in its limits, the requests are then not held to
the limits of tokenless clients.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any

from bertknn_search.config import flag_name, read_settings_file, thresholds_to_json
from bertknn_search.errors import BertKnnError, ConfigError
from bertknn_search.output import render_answer, to_json
from bertknn_search.records import (
    Answer,
    ArticleHit,
    Confidence,
    Coverage,
    Evidence,
    EvidenceSentence,
    GateDecision,
    Prediction,
    Question,
    SplitWord,
    WordEvidence,
)
from bertknn_search.server.wire import MAX_QUESTIONS

# Config field -> the request's name for it (the flag's), and whether the value is negated.
REQUEST_NAMES: dict[str, tuple[str, bool]] = {
    "top": ("top", False),
    "k": ("k", False),
    "n_articles": ("n-articles", False),
    "lam": ("lambda", False),
    "temperature": ("temperature", False),
    "distance": ("distance", False),
    "use_ir": ("no-ir", True),
    "gate": ("gate", False),
    "gate_threshold": ("gate-threshold", False),
    "gate_thresholds": ("gate-thresholds", False),
    "evidence": ("evidence", False),
    "budget": ("budget", False),
    "budget_s": ("budget-s", False),
    "exact": ("exact", False),
}
TIMEOUT_S = 600.0  # a full batch of BERT-base questions on a CPU takes tens of seconds
IN_FLIGHT = 16  # requests one client has in flight at most


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """urllib's redirect handler copies every header, ``Authorization`` included, to whatever URL a
    ``Location`` names (and turns a POST into a GET): a 3xx is an error here, so the token and the
    questions go only to the server they were given for."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        raise BertKnnError(
            f"server at {_origin(req.full_url)} answered {code} (a redirect to {one_line(newurl, 200)});"
            " nothing was sent there: give --server the URL of the server itself"
        )


# No proxy either: a server is asked directly, never through whatever $http_proxy names.
_OPENER = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))


def checked_url(url: str) -> str:
    """``url`` if it can name a server: ``http`` or ``https``, a host and, if any, a numeric port.

    Raises:
        ConfigError: anything else (``ftp://``, ``file://``, ``host:notaport``), in one line.
    """
    said = one_line(url, 200)
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port  # ValueError for a port that is no number or out of range
    except ValueError as exc:
        raise ConfigError(f"--server {said!r} is not a URL ({exc}); e.g. http://127.0.0.1:8000") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"--server {said!r} is not an http:// or https:// URL; e.g. http://127.0.0.1:8000")
    if not parts.hostname or (port is None and parts.netloc.endswith(":")):
        raise ConfigError(f"--server {said!r} names no host and port; e.g. http://127.0.0.1:8000")
    return url.strip()


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def one_line(text: str, limit: int) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def method_overrides(flags: Mapping[str, Any], settings: Path | None) -> dict[str, Any]:
    """The request fields for the method options given (a settings file, then flags, which win).

    Raises:
        ConfigError: an option that names the server's index or model (the server has its own).
    """
    foreign = sorted(flag_name(n) for n, v in flags.items() if v is not None and n not in REQUEST_NAMES)
    if foreign:
        raise ConfigError(
            f"--server answers with the server's index and model; drop {', '.join(foreign)}"
            " (or leave out --server to answer here)"
        )
    values = dict(read_settings_file(settings)) if settings is not None else {}
    values.update({n: v for n, v in flags.items() if v is not None})
    out = {}
    for name, value in values.items():
        key, negated = REQUEST_NAMES[name]
        out[key] = (not value) if negated else value
    if "gate-thresholds" in out:
        out["gate-thresholds"] = thresholds_to_json(out["gate-thresholds"])
    return out


def ask(
    url: str, questions: Sequence[Question], overrides: Mapping[str, Any], token: str | None = None
) -> Iterator[Answer]:
    """Answers from the server at ``url``, in order, sent in requests of as many questions as the server
    takes in one (its ``limits``), several at once so that its batcher can answer them in one pass.

    Args:
        token: the server's token, sent with every request; None sends none.

    Raises:
        ConfigError: ``url`` is no http(s) URL (see ``checked_url``).
        BertKnnError: the server cannot be reached, or refused the request (its one-line reason).
    """
    url = checked_url(url)
    size = questions_per_request(url, token) if len(questions) > 1 else 1

    def send(lo: int) -> list[Any]:
        chunk = questions[lo : lo + size]
        asked = [{"question": q.text, "subject": q.subject} for q in chunk]
        for item, q in zip(asked, chunk):  # only when given: an older server would refuse the fields
            item.update({k: v for k, v in (("popularity", q.popularity), ("relation", q.relation)) if v})
            if q.evidence_for:
                item["evidence_for"] = list(q.evidence_for)
        return list(post(url, "/query", {"questions": asked, **overrides}, token)["answers"])

    starts = iter(range(0, len(questions), size))
    # Requests in flight at once: about one CPU batch of questions (128), and at most IN_FLIGHT.
    workers = max(1, min(IN_FLIGHT, -(-128 // size)))
    with ThreadPoolExecutor(workers) as pool:
        pending = deque(pool.submit(send, lo) for lo in islice(starts, workers))
        try:
            while pending:
                answers = pending.popleft().result()
                pending.extend(pool.submit(send, lo) for lo in islice(starts, 1))
                for item in answers:
                    yield answer_from_json(item)
        finally:  # an error, or a reader that stops early: no more requests than those in flight
            for future in pending:
                future.cancel()


def questions_per_request(url: str, token: str | None = None) -> int:
    """How many questions the server at ``url`` takes in one request (``/stats``' ``server.limits``,
    which a token lifts where they say ``lifted-by-token``); ``MAX_QUESTIONS`` from a server that does
    not say (one older than the limits)."""
    target = url.rstrip("/") + "/stats"
    request = urllib.request.Request(target, headers=_headers(token))
    try:
        with _OPENER.open(request, timeout=TIMEOUT_S) as reply:
            limits = json.loads(reply.read().decode("utf-8")).get("server", {}).get("limits", {})
    except (OSError, ValueError, AttributeError):
        return MAX_QUESTIONS  # the first request then says what is wrong, in one line
    if not isinstance(limits, dict):
        return MAX_QUESTIONS
    if token is not None and limits.get("lifted-by-token") is True:
        return MAX_QUESTIONS
    given = limits.get("questions")
    if isinstance(given, bool) or not isinstance(given, int) or given < 1:
        return MAX_QUESTIONS
    return min(given, MAX_QUESTIONS)


def lines(
    url: str,
    questions: Sequence[Question],
    overrides: Mapping[str, Any],
    as_json: bool,
    token: str | None = None,
) -> Iterator[str]:
    """What ``query`` prints for each answer: its JSON line, or the text rendering."""
    for answer in ask(url, questions, overrides, token):
        yield to_json(answer) if as_json else render_answer(answer, len(answer.bert_knn)) + "\n"


def _headers(token: str | None) -> dict[str, str]:
    return {"Accept": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})


def post(url: str, path: str, body: Mapping[str, Any], token: str | None = None) -> Any:
    """POST ``body`` as JSON (with ``token`` as a bearer token, if any) and return the decoded reply.

    Raises:
        BertKnnError: connection refused, timed out, or a 4xx/5xx (with the server's ``detail``).
    """
    target = url.rstrip("/") + path
    request = urllib.request.Request(
        target,
        data=json.dumps(body).encode("utf-8"),
        headers={"Content-Type": "application/json", **_headers(token)},
        method="POST",
    )
    try:
        with _OPENER.open(request, timeout=TIMEOUT_S) as reply:
            return json.loads(reply.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        raise BertKnnError(f"server at {url} answered {exc.code}: {_detail(exc)}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise BertKnnError(
            f"cannot reach a server at {url} ({reason}); start one with 'bertknn-search serve'"
        ) from exc
    except ValueError as exc:
        raise BertKnnError(f"server at {target} did not answer JSON ({exc}); is it bertknn-search?") from exc


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read().decode("utf-8"))["detail"])
    except (ValueError, KeyError, TypeError, OSError):
        return str(exc.reason)


def answer_from_json(item: Mapping[str, Any]) -> Answer:
    """An ``Answer`` from its JSON (``to_json`` of it gives the same JSON back)."""

    def predictions(rows: list[dict[str, Any]]) -> list[Prediction]:
        return [Prediction(**{**row, "pieces": tuple(row.get("pieces") or ())}) for row in rows]

    return Answer(
        question=item["question"],
        subject=item["subject"],
        # The subject's own article has no BM25 score: infinity, which JSON spells null.
        articles=[
            ArticleHit(
                a["id"], a["title"], float("inf") if a["score"] is None else a["score"], a.get("popularity")
            )
            for a in item["articles"]
        ],
        bert_knn=predictions(item["bert_knn"]),
        bert=None if item["bert"] is None else predictions(item["bert"]),
        knn=predictions(item["knn"]),
        evidence=[
            Evidence(e["word"], [EvidenceSentence(**s) for s in e["sentences"]]) for e in item["evidence"]
        ],
        n_neighbors=item["n_neighbors"],
        bert_available=item.get("bert_available", True),
        gate=GateDecision(**item["gate"]) if item.get("gate") else None,
        coverage={aid: Coverage(**c) for aid, c in (item.get("coverage") or {}).items()},
        split_words=[SplitWord(**w) for w in item.get("split_words") or []],
        evidence_for=[
            WordEvidence(**{**e, "sentences": [EvidenceSentence(**s) for s in e["sentences"]]})
            for e in item.get("evidence_for") or []
        ],
        confidence=Confidence(**item["confidence"]) if item.get("confidence") else None,
    )
