"""What asking a subject's closest titles in its first ``_msearch`` costs, on real OpenSearch and
Elasticsearch nodes, in one run.

``Searcher.answer_batch`` asks ``Backend.subject_articles(..., closest=5)``: the title lookup, the BM25
search and the closest titles' searches (one per ``title_patterns`` pattern) in one ``_msearch``, so that
a subject that is no title is one round trip. Where the subject IS a title, the closest titles' searches
run for nothing. This times, in this process (wall ms of the call, the round trip included):

- **title** subjects (an article's own title): ``subject_articles(s, s, 3)`` against
  ``subject_articles(s, s, 3, 5)``: what the searches the title makes useless cost;
- **no title** subjects (two words of an article's sentence): the request before (``subject_articles``,
  then ``closest_titles``: two round trips) against the one ``_msearch`` now.

The variants take turns subject by subject, ``--rounds`` times, after one warming round. Corpus:
``bench_lazy``'s Wikipedia-shaped articles of real enwiki sentences, ingested lazily (texts only: the
article index is what these searches read), tiny model (``bench_engines.model_for``).

    python benchmarks/bench_subject_closest.py --out benchmarks/results/subject-closest-cpu.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from bench_engines import model_for
from bench_lazy import FRAGMENT, wikipedia_shaped
from common import environment, load_average, write_results

from bertknn_search.backends.engines.backend import EngineBackend
from bertknn_search.config import Config
from bertknn_search.ingest.pipeline import ingest

CLOSEST = 5  # Searcher's CLOSEST_TITLES


def subjects(articles: list[Any], n: int, seed: int) -> tuple[list[str], list[str]]:
    """``n`` titles and ``n`` two-word subjects that are no title."""
    rng = np.random.default_rng(seed)
    titles = {a.title.lower() for a in articles}
    own = [a.title for a in articles[:n]]
    other: list[str] = []
    for a in articles:
        words = [w.strip(".,;:()\"'") for w in a.text.split()]
        words = [w for w in words if len(w) > 3 and w.isalpha()]
        if len(words) >= 2:
            pick = rng.choice(len(words), 2, replace=False)
            s = f"{words[pick[0]]} {words[pick[1]]}"
            if s.lower() not in titles:
                other.append(s)
        if len(other) == n:
            break
    return own, other


def timed(calls: dict[str, Callable[[str], Any]], items: list[str], rounds: int) -> dict[str, list[float]]:
    """Milliseconds of each call on each item, the calls taking turns item by item."""
    for s in items:  # warm
        for call in calls.values():
            call(s)
    ms: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for s in items:
            for name, call in calls.items():
                start = time.perf_counter()
                call(s)
                ms[name].append((time.perf_counter() - start) * 1e3)
    return ms


def summary(ms: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        k: {"p50": statistics.median(v), "mean": statistics.fmean(v)} for k, v in ms.items()
    }
    a, b = list(ms)
    out["p50_ratio"] = out[b]["p50"] / out[a]["p50"]
    return out


def measure(backend: EngineBackend, own: list[str], other: list[str], rounds: int) -> dict[str, Any]:
    """Both comparisons on one engine (see the module's doc)."""

    def before(s: str) -> Any:  # a subject that is no title, as answer_batch asked it before
        return backend.subject_articles(s, s, 3), backend.closest_titles(s, CLOSEST)

    def now(s: str) -> Any:
        return backend.subject_articles(s, s, 3, CLOSEST)

    title = timed({"without": lambda s: backend.subject_articles(s, s, 3), "with": now}, own, rounds)
    assert all(now(s).closest is None for s in own), "a title's closest titles are never read"
    no_title = timed({"two_requests": before, "one_msearch": now}, other, rounds)
    return {"title": summary(title), "no_title": summary(no_title)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bertknn_search.nodes.launch import Cluster, engine, free_port

    model, layer = model_for("tiny")
    articles = wikipedia_shaped(args.source, args.articles, args.seed)
    own, other = subjects(articles, args.subjects, args.seed)
    results: dict[str, Any] = {
        "benchmark": "subject-closest",
        "env": environment("cpu"),
        "articles": len(articles),
        "subjects": {"title": len(own), "no_title": len(other)},
        "rounds": args.rounds,
        "load_before": load_average(),
    }
    with tempfile.TemporaryDirectory(prefix="bench-subject-closest-") as tmp:
        for name in args.backends.split(","):
            cluster = Cluster(engine(name), port=free_port(), data=Path(tmp) / name, heap=args.heap)
            cluster.start(say=lambda _line: None, progress=False)
            try:
                key = "opensearch_url" if name == "opensearch" else "elasticsearch_url"
                config = Config(model=str(model), layer=layer, device="cpu", contexts="lazy").replace(
                    backend=name, opensearch_prefix="bench-closest", **{key: cluster.url}
                )
                ingest(articles, config, progress=False)
                backend = EngineBackend.open(config)
                try:
                    results[name] = measure(backend, own, other, args.rounds)
                finally:
                    backend.close()
            finally:
                cluster.stop()
            results[name]["load"] = load_average()
            print(report_line(name, results[name]), flush=True)
    results["load_after"] = load_average()
    return results


def report_line(name: str, r: dict[str, Any]) -> str:
    t, n = r["title"], r["no_title"]
    return (
        f"{name}: title subjects p50 {t['without']['p50']:.2f} ms without closest, {t['with']['p50']:.2f} ms"
        f" with ({t['p50_ratio']:.2f}x); no-title subjects p50 {n['two_requests']['p50']:.2f} ms in two"
        f" requests, {n['one_msearch']['p50']:.2f} ms in one ({n['p50_ratio']:.2f}x); load {r['load']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="opensearch,elasticsearch")
    parser.add_argument("--articles", type=int, default=200)
    parser.add_argument("--subjects", type=int, default=40, help="of each kind")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--heap", default="512m")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--source", type=Path, default=FRAGMENT)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = run(args)
    load = f"load before {results['load_before']}, after {results['load_after']}"
    print(f"CPU: {results['env'].get('cpu')}; {load}")
    write_results(args.out, results)


if __name__ == "__main__":
    main()
