"""Where a warm question's time goes on each backend, in process: timestamps inside ``Searcher.answer``.

Opens a ``Searcher`` per backend over indexes that ``bench_engines.py --work DIR`` kept (the same
corpus, model and questions), answers every question once to warm, then ``--rounds`` rounds with the
backends taking turns question by question, and records per question: the encoder pass, the IR call
(and its HTTP), the kNN call and inside it the body built, the JSON serialised, the HTTP round trip
(urllib3: request sent to response bytes read), the engine's own ``took``, the JSON parsed, the hits
parsed and their keys decoded; the words resolved, the evidence, and each response's bytes. Medians per
backend are printed and written as JSON.

    python benchmarks/profile_engine_question.py --work /work/data/w20 --prefix bench \\
        --opensearch-url http://127.0.0.1:9200 --elasticsearch-url http://127.0.0.1:9201 --model minilm
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from bench_engines import kept_index_options, make_questions, model_for
from bench_lazy import FRAGMENT, wikipedia_shaped
from common import environment, load_average, write_results

from bertknn_search.config import Config
from bertknn_search.query.search import Searcher

_local = threading.local()


class Events:
    """Seconds (and bytes) per key for the question being asked, from any thread."""

    def __init__(self) -> None:
        self.now: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()

    def add(self, key: str, value: float) -> None:
        with self._lock:
            self.now[key] += value

    def take(self) -> dict[str, float]:
        with self._lock:
            out, self.now = dict(self.now), defaultdict(float)
        return out


def _kind() -> str:
    return getattr(_local, "kind", None) or "other"


@contextlib.contextmanager
def patched(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    original = owner.__dict__[name]
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def timer(events: Events, key: str | Callable[[], str], kind: str | None = None) -> Callable[[Any], Any]:
    """Time every call under ``key`` (a callable: named at call time); ``kind`` labels the thread's HTTP."""

    def make(original: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            before = getattr(_local, "kind", None)
            if kind is not None:
                _local.kind = kind
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                events.add(key() if callable(key) else key, time.perf_counter() - started)
                _local.kind = before

        return timed

    return make


@contextlib.contextmanager
def instrumented(events: Events) -> Iterator[None]:
    import elastic_transport
    import opensearchpy
    import opensearchpy.serializer as os_serializer
    from elastic_transport import _serializer as es_serializer

    from bertknn_search.backends.engines import neighbors
    from bertknn_search.backends.engines.backend import EngineBackend
    from bertknn_search.backends.engines.elasticsearch import ElasticsearchDialect
    from bertknn_search.backends.engines.opensearch import OpenSearchDialect
    from bertknn_search.query import search

    def os_http(original: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            status, headers, raw = original(*args, **kwargs)
            events.add(f"{_kind()} http", time.perf_counter() - started)
            events.add(f"{_kind()} bytes", len(raw or ""))
            return status, headers, raw

        return timed

    def es_http(original: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            response = original(*args, **kwargs)
            events.add(f"{_kind()} http", time.perf_counter() - started)
            events.add(f"{_kind()} bytes", len(response.body or b""))
            return response

        return timed

    def took(original: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            response = original(*args, **kwargs)
            body = getattr(response, "body", response)
            if isinstance(body, dict):
                events.add(f"{_kind()} took", float(body.get("took") or 0) / 1000.0)
                events.add(f"{_kind()} requests", 1)
            return response

        return timed

    with contextlib.ExitStack() as stack:
        enter = stack.enter_context
        enter(patched(opensearchpy.Urllib3HttpConnection, "perform_request", os_http))
        enter(patched(elastic_transport.Urllib3HttpNode, "perform_request", es_http))
        enter(patched(opensearchpy.transport.Transport, "perform_request", took))
        enter(patched(elastic_transport.Transport, "perform_request", took))
        enter(patched(os_serializer.JSONSerializer, "dumps", timer(events, lambda: f"{_kind()} dumps")))
        enter(patched(os_serializer.JSONSerializer, "loads", timer(events, lambda: f"{_kind()} loads")))
        enter(patched(es_serializer.JsonSerializer, "dumps", timer(events, lambda: f"{_kind()} dumps")))
        enter(patched(es_serializer.JsonSerializer, "loads", timer(events, lambda: f"{_kind()} loads")))
        for dialect in (OpenSearchDialect, ElasticsearchDialect):
            enter(patched(dialect, "knn_exact_body", timer(events, "knn body")))
        enter(patched(EngineBackend, "knn", timer(events, "knn call", kind="knn")))
        enter(patched(EngineBackend, "sentences", timer(events, "sentences call", kind="sentences")))
        enter(patched(EngineBackend, "titles", timer(events, "titles call", kind="titles")))
        enter(patched(_Module(neighbors), "parse_neighbors", timer(events, "knn parse")))
        enter(patched(_Module(neighbors), "_keys", timer(events, "knn keys")))
        enter(patched(_Module(search), "retrieve_subject", timer(events, "ir call", kind="ir")))
        enter(patched(_Module(search), "with_evidence", timer(events, "evidence")))
        enter(patched(Searcher, "encode", timer(events, "encode")))
        enter(patched(Searcher, "resolve_words", timer(events, "resolve words")))
        enter(patched(Searcher, "neighbors", timer(events, "neighbors")))
        yield


class _Module:
    """A module's globals as an object ``patched`` can set (module attributes are its ``__dict__``)."""

    def __init__(self, module: Any) -> None:
        self.__dict__ = module.__dict__


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    args = kept_index_options(parser, "embedded,opensearch,elasticsearch")
    model, layer = model_for(args.model)
    articles = wikipedia_shaped(FRAGMENT, args.articles, args.seed)
    questions = make_questions(articles, args.questions, args.seed)
    base = Config(model=str(model), layer=layer, device="cpu", contexts="eager")
    configs = {}
    for name in args.backends.split(","):
        if name == "embedded":
            configs[name] = base.replace(index=args.work / "embedded")
        else:
            url = {f"{name}_url": getattr(args, f"{name}_url")}
            configs[name] = base.replace(backend=name, opensearch_prefix=args.prefix, **url)
    searchers = {name: Searcher.open(config) for name, config in configs.items()}
    events = Events()
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in searchers}
    load0 = load_average()
    try:
        with instrumented(events):
            for q in questions:
                for s in searchers.values():
                    s.answer(q)
                    events.take()
            for _ in range(args.rounds):
                for q in questions:
                    for name, s in searchers.items():
                        started = time.perf_counter()
                        s.answer(q)
                        row = events.take()
                        row["total"] = time.perf_counter() - started
                        rows[name].append(row)
    finally:
        for s in searchers.values():
            s.close()
    out: dict[str, Any] = {
        "benchmark": "profile_engine_question",
        "env": environment("cpu"),
        "load_before": load0,
        "load_after": load_average(),
        "questions": len(questions),
        "rounds": args.rounds,
        "medians": {},
    }
    for name, found in rows.items():
        keys = sorted({k for r in found for k in r})
        out["medians"][name] = {k: float(np.median([r.get(k, 0.0) for r in found])) for k in keys}
    print(f"load {load0} -> {out['load_after']}; {out['env']['cpu']}")
    for name, med in out["medians"].items():
        print(f"\n{name}")
        for k, v in med.items():
            unit = (
                f"{v / 1e3:9.1f} KB"
                if k.endswith("bytes")
                else f"{v:9.1f}"
                if k.endswith("requests")
                else f"{v * 1e3:9.2f} ms"
            )
            print(f"  {k:<20} {unit}")
    if args.out:
        write_results(args.out, out)


if __name__ == "__main__":
    main()
