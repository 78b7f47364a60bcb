"""What a subject's closest titles cost a question on real OpenSearch and Elasticsearch nodes, where
they are asked, in one run.

``Searcher.answer_batch`` asks ``Backend.subject_articles(..., closest=5)``. The closest titles (``*word*``
wildcards of the ``title_patterns``) are needed only where the title misses. **before** (commit 6bbc126):
a search per pattern rode in the IR ``_msearch`` beside the title lookup and the BM25 search, so a title
subject paid for them too. **now**: the IR request is the title lookup and BM25 search only, and a miss's
patterns, ranked in one search (``bodies.closest_body``), ride in the question's next request, its kNN
search (``engines/subject_search``). Both are two
requests a warm question. This times, in this process (wall ms, the round trips included):

- **title** subjects (an article's own title): the IR call alone, without closest titles (``without``:
  what ``eval`` asks), before and now;
- **no title** subjects (two words of an article's sentence): the question's two requests, IR then the
  kNN search over its BM25 articles (a fixed random query vector, ``Config().k`` neighbours) with the
  closest titles read at the end: without closest titles, before and now.

The variants take turns subject by subject, ``--rounds`` times, after one warming round. Corpus:
``bench_lazy``'s Wikipedia-shaped articles of real enwiki sentences, ingested eagerly (the kNN searches
read contexts), tiny model (``bench_engines.model_for``).

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

from bertknn_search.backends.base import title_patterns
from bertknn_search.backends.engines import bodies, subject_search
from bertknn_search.backends.engines.backend import EngineBackend
from bertknn_search.config import Config
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.records import ArticleHit, SubjectArticles
from bertknn_search.stopwords import STOPWORDS

CLOSEST = 5  # Searcher's CLOSEST_TITLES


def subjects(articles: list[Any], n: int, seed: int) -> tuple[list[str], list[str]]:
    """``n`` titles and ``n`` two-word subjects that are no title (no stopwords: BM25 finds articles)."""
    rng = np.random.default_rng(seed)
    titles = {a.title.lower() for a in articles}
    own = [a.title for a in articles[:n]]
    other: list[str] = []
    for a in articles:
        words = [w.strip(".,;:()\"'") for w in a.text.split()]
        words = [w for w in words if len(w) > 3 and w.isalpha() and w.lower() not in STOPWORDS]
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
    """p50 and mean of each variant, and each one's p50 against the first's."""
    out: dict[str, Any] = {
        k: {"p50": statistics.median(v), "mean": statistics.fmean(v)} for k, v in ms.items()
    }
    first, *rest = ms
    out["p50_ratio"] = {k: out[k]["p50"] / out[first]["p50"] for k in rest}
    return out


def measure(backend: EngineBackend, own: list[str], other: list[str], rounds: int) -> dict[str, Any]:
    """Both comparisons on one engine (see the module's doc)."""
    vector = np.random.default_rng(0).standard_normal(backend.meta().dim).astype(np.float32)
    k = Config().k

    def before_ir(s: str) -> list[ArticleHit]:
        """The IR request as it was: a titles search per pattern in the IR ``_msearch``."""
        whole = {"allow_partial_search_results": False}
        near = [line for p in title_patterns(s) for line in (whole, bodies.titles_body(p, CLOSEST))]
        body = subject_search.lines(s, s, 3, backend.dialect.bigram_field) + near
        send = subject_search.msearch(backend.client, backend.names["articles"], body)
        titled, searched, *answers = backend._call("look up a title and search articles", send)
        if titled["hits"]["hits"]:
            return subject_search.title_hits(titled)
        next((hits for a in answers if (hits := a["hits"]["hits"])), [])  # the closest titles, as read then
        return bodies.parse_articles(searched)

    def question(found: SubjectArticles) -> Any:
        neighbours = backend.knn(vector, k, [h.id for h in found.articles])
        return neighbours, found.closest  # read after the kNN search, as ``Searcher.score_batch`` does

    title = timed(
        {
            "without": lambda s: backend.subject_articles(s, s, 3),
            "before": before_ir,
            "now": lambda s: backend.subject_articles(s, s, 3, CLOSEST),
        },
        own,
        rounds,
    )
    assert all(backend.subject_articles(s, s, 3, CLOSEST).closest is None for s in own), "titles"
    no_title = timed(
        {
            "without": lambda s: question(backend.subject_articles(s, s, 3)),
            "before": lambda s: backend.knn(vector, k, [h.id for h in before_ir(s)]),
            "now": lambda s: question(backend.subject_articles(s, s, 3, CLOSEST)),
        },
        other,
        rounds,
    )
    assert all(backend.subject_articles(s, s, 3).articles for s in other), "no-title subjects reach kNN"
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
                config = Config(model=str(model), layer=layer, device="cpu", contexts="eager").replace(
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
    parts = []
    for kind, what in (("title", "title subjects' IR call"), ("no_title", "no-title subjects' IR + kNN")):
        t = r[kind]
        parts.append(
            f"{what} p50 {t['without']['p50']:.2f} ms without closest titles, {t['before']['p50']:.2f} ms"
            f" before ({t['p50_ratio']['before']:.2f}x), {t['now']['p50']:.2f} ms now"
            f" ({t['p50_ratio']['now']:.2f}x)"
        )
    return f"{name}: " + "; ".join(parts) + f"; load {r['load']}"


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
