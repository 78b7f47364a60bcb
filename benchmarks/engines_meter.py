"""Instruments of ``bench_engines.py``: seconds and HTTP requests inside backends, in this process.

``instrumented`` times an ingest's writes and lookups and every engine request by kind (patched at the
clients' transports); ``QueryClock`` counts a searcher's backend seconds and engine requests per
question; ``warm_latency`` asks searchers the same warm questions in turn (the in-process mode);
``engine_warm_up`` warms the engines' nodes before that.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from common import percentiles

from bertknn_search.config import Config
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question

# The backend methods a question goes through (timed per question on the searcher's backend).
QUERY_METHODS = (
    "find_titles",
    "search_articles",
    "knn",
    "sentences",
    "titles",
    "coverage",
    "ensure_contexts",
)
TICKS = os.sysconf("SC_CLK_TCK")


# -- instruments -------------------------------------------------------------------------------------
class Meter:
    """Seconds and calls per key, from any thread."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.took_ms = 0.0  # the engine's own "took" of _bulk responses
        self._lock = threading.Lock()

    def add(self, key: str, seconds: float) -> None:
        with self._lock:
            self.seconds[key] = self.seconds.get(key, 0.0) + seconds
            self.calls[key] = self.calls.get(key, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            key: {"seconds": round(self.seconds[key], 4), "calls": self.calls[key]}
            for key in sorted(self.seconds, key=lambda k: -self.seconds[k])
        }


def request_kind(method: str, path: str) -> str:
    """``POST _bulk``, ``POST _refresh``, ``GET _mget``…: the request's verb and its last ``_`` word."""
    words = [w for w in path.split("?")[0].split("/") if w]
    named = [w for w in words if w.startswith("_")]
    tail = "/".join(named) if named else ("index" if words else "/")
    return f"{method} {tail}"


@contextlib.contextmanager
def patched(owner: Any, name: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, wrap(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def timing(meter: Meter, key: str | Callable[..., str]) -> Callable[[Any], Any]:
    def wrap(original: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                meter.add(key(*args, **kwargs) if callable(key) else key, time.perf_counter() - started)

        return timed

    return wrap


@contextlib.contextmanager
def instrumented(meter: Meter) -> Iterator[None]:
    """Time backends' writes and lookups, every HTTP request by kind, and the gzip of request bodies."""
    import elastic_transport
    import opensearchpy.transport
    from opensearchpy.connection.base import Connection

    from bertknn_search.backends.embedded.backend import EmbeddedBackend
    from bertknn_search.backends.engines.backend import EngineBackend

    inside = threading.local()  # whether this thread is inside add_articles

    def writes(original: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            inside.add = True
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                meter.add("add_articles", time.perf_counter() - started)
                inside.add = False

        return timed

    def transport(original: Any) -> Any:
        def timed(self: Any, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                response = original(self, method, path, *args, **kwargs)
            finally:
                where = "add" if getattr(inside, "add", False) else "other"
                meter.add(f"{where} http " + request_kind(method, path), time.perf_counter() - started)
            body = getattr(response, "body", response)
            if isinstance(body, dict) and path.split("?")[0].endswith("_bulk"):
                meter.took_ms += float(body.get("took") or 0)
            return response

        return timed

    with contextlib.ExitStack() as stack:
        for cls in (EngineBackend, EmbeddedBackend):
            stack.enter_context(patched(cls, "add_articles", writes))
            stack.enter_context(patched(cls, "fingerprints", timing(meter, "fingerprints")))
        stack.enter_context(patched(opensearchpy.transport.Transport, "perform_request", transport))
        stack.enter_context(patched(elastic_transport.Transport, "perform_request", transport))
        stack.enter_context(patched(Connection, "_gzip_compress", timing(meter, "gzip")))
        stack.enter_context(patched(gzip, "compress", timing(meter, "gzip")))
        yield


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class QueryClock:
    """Seconds inside a searcher's backend methods and HTTP requests made, per question."""

    def __init__(self, searcher: Searcher) -> None:
        self.backend_s = 0.0
        self.requests = 0
        self._undo: list[tuple[str, Any]] = []
        backend = searcher.backend
        for name in QUERY_METHODS:
            if hasattr(backend, name):
                original = getattr(backend, name)
                self._undo.append((name, original))
                setattr(backend, name, self._wrap(original))
        client = getattr(getattr(backend, "store", backend), "client", None)  # a lazy index wraps the engine
        if client is not None:
            transport = client.transport
            original = transport.perform_request

            def counted(*args: Any, **kwargs: Any) -> Any:
                self.requests += 1
                return original(*args, **kwargs)

            transport.perform_request = counted
        self._backend = backend

    def _wrap(self, original: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.backend_s += time.perf_counter() - started

        return timed

    def reset(self) -> tuple[float, int]:
        out = (self.backend_s, self.requests)
        self.backend_s, self.requests = 0.0, 0
        return out


def kinds_of(questions: Sequence[Question], kinds: Sequence[str] | None) -> list[str]:
    """Each question's kind for the per-kind figures: ``kinds`` as given, else "subject" or "free"."""
    return list(kinds) if kinds is not None else ["subject" if q.subject else "free" for q in questions]


def by_kind(kinds: Sequence[str], seconds: Sequence[float], requests: Sequence[int]) -> dict[str, Any]:
    """Percentiles of ``seconds`` and the mean and most of ``requests`` (if counted) per question kind."""
    out: dict[str, Any] = {}
    for kind in dict.fromkeys(kinds):
        at = [i for i, k in enumerate(kinds) if k == kind]
        row = percentiles([seconds[i] for i in at])
        if requests:
            counts = [requests[i] for i in at]
            row |= {"requests_per_question": float(np.mean(counts)), "requests_max": int(max(counts))}
        out[kind] = row
    return out


def warm_latency(
    searchers: dict[str, Searcher], questions: list[Question], rounds: int, kinds: Sequence[str] | None = None
) -> dict[str, Any]:
    """Each searcher answers every question once (warm-up), then ``rounds`` rounds, taking turns.

    ``kinds``: each question's kind (e.g. a subject that is a title, one that is not, free), for
    figures per kind ("question_kinds"); "subject" and "free" are there either way.
    """
    kind = kinds_of(questions, kinds)
    clocks = {name: QueryClock(s) for name, s in searchers.items()}
    tops: dict[str, list[str]] = {name: [] for name in searchers}
    for q in questions:
        for name, searcher in searchers.items():
            answer = searcher.answer(q)
            tops[name].append(answer.bert_knn[0].word if answer.bert_knn else "")
            clocks[name].reset()
    times: dict[str, dict[str, list[float]]] = {
        name: {"total": [], "backend": [], "requests": [], "subject": [], "free": []} for name in searchers
    }
    asked: list[str] = []
    for _ in range(rounds):
        for q, k in zip(questions, kind):
            asked.append(k)
            for name, searcher in searchers.items():
                started = time.perf_counter()
                searcher.answer(q)
                seconds = time.perf_counter() - started
                backend_s, requests = clocks[name].reset()
                t = times[name]
                t["total"].append(seconds)
                t["backend"].append(backend_s)
                t["requests"].append(requests)
                t["subject" if q.subject else "free"].append(seconds)
    out: dict[str, Any] = {}
    base = "embedded" if "embedded" in searchers else None
    for name, t in times.items():
        row = {
            **percentiles(t["total"]),
            "subject": percentiles(t["subject"]),
            "free": percentiles(t["free"]),
            "backend": percentiles(t["backend"]),
            "requests_per_question": float(np.mean(t["requests"])) if t["requests"] else 0.0,
            "answers": len(t["total"]),
            "question_kinds": by_kind(asked, t["total"], t["requests"]),
        }
        if base and name != base:
            row["top_answer_agrees_with_embedded"] = float(
                np.mean([a == b for a, b in zip(tops[name], tops[base])])
            )
        out[name] = row
    if base:
        for name in out:
            if name != base:
                out[name]["p50_vs_embedded"] = out[name]["p50_ms"] / out[base]["p50_ms"]
                out[name]["p95_vs_embedded"] = out[name]["p95_ms"] / out[base]["p95_ms"]
                for k, row in out[name]["question_kinds"].items():
                    row["p50_vs_embedded"] = row["p50_ms"] / out[base]["question_kinds"][k]["p50_ms"]
    return out


def engine_warm_up(configs: dict[str, Config], questions: Sequence[Question], n: int) -> dict[str, Any]:
    """Each engine answers ``n`` of ``questions`` (cycled; not the timed ones), in process, the engines in
    turn: the nodes' JIT compiles the search path; the last 64 answers' times say how warm it got."""
    engines = {name: c for name, c in configs.items() if name != "embedded"}
    searchers = {name: Searcher.open(config) for name, config in engines.items()}
    times: dict[str, list[float]] = {name: [] for name in searchers}
    started = time.perf_counter()
    try:
        for i in range(n):
            for name, searcher in searchers.items():
                t0 = time.perf_counter()
                searcher.answer(questions[i % len(questions)])
                times[name].append(time.perf_counter() - t0)
    finally:
        for s in searchers.values():
            s.close()
    return {
        "questions": n,
        "seconds": round(time.perf_counter() - started, 1),
        **{
            name: {
                "first_64_p50_ms": float(np.median(t[:64]) * 1000),
                "last_64_p50_ms": float(np.median(t[-64:]) * 1000),
            }
            for name, t in times.items()
        },
    }
