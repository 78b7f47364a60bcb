"""Warm questions while a cold one encodes, through the server's batcher (the model loaded once).

The index is lazy, over the real enwiki fragment's articles. Warm articles get their contexts stored
up front (random keys: the real rows, blocks and SQLite writes, as ``bench_lazy`` does), so a question
on them encodes nothing. One client asks warm subject questions back to back, each waiting for its
answer, for ``--seconds``:

- **alone**: nothing else runs;
- **beside a cold encode**: another client has asked an ``exact`` question on the longest article first,
  so the model spends every free moment encoding its contexts (minutes on a CPU), stepping aside between
  encoder steps for the warm questions.

Reported: warm p50 / p99 in both phases and their ratio (target: p99 beside a cold encode <= 1.5x
alone), how many contexts the cold question encoded meanwhile, and how long it took the batcher to stop
the cold encode when asked (SIGTERM's path).

    python benchmarks/bench_cold_serve.py --model-size base --seconds 60 \\
        --out benchmarks/results/cold-serve-cpu-base.json
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import argument_parser, build_model, environment, percentiles, run_benchmark

from bertknn_search.config import Config
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.readers import read_articles
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question
from bertknn_search.server.batcher import MicroBatcher, Stopping

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
FRAGMENT = SHARED / "wiki-sample" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
WARM_ARTICLES = 20


def store_random_contexts(searcher: Searcher, ids: list[str], seed: int) -> None:
    """Make ``ids`` warm: their real rows with random keys, stored as an encode would store them."""
    from bertknn_search.ingest.contexts import build_blocks, make_rows
    from bertknn_search.ingest.sentences import split_sentences
    from bertknn_search.records import EncodedArticle

    store = searcher.backend.store  # type: ignore[attr-defined]
    rng = np.random.default_rng(seed)
    for p in store.unencoded(ids):
        sentences = [split_sentences(p.article.text)]
        rows = make_rows(sentences, searcher.encoder, store.meta().mask_policy, store.meta().max_length)
        keys = rng.standard_normal((len(rows), searcher.encoder.dim), dtype=np.float32).astype(np.float16)
        (block,) = build_blocks([p.article], sentences, rows, keys, searcher.config)
        store.put_contexts([EncodedArticle(p.article, block.contexts, p.fingerprint)])


def tail(seconds: list[float]) -> dict[str, float]:
    """``percentiles`` and the p99 the target is about."""
    return {**percentiles(seconds), "p99_ms": float(np.percentile(np.asarray(seconds) * 1000.0, 99))}


def warm_client(
    batcher: MicroBatcher, questions: list[Question], config: Config, seconds: float
) -> list[float]:
    took: list[float] = []
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        q = questions[i % len(questions)]
        started = time.perf_counter()
        (future,) = batcher.submit([q], config)
        future.result(timeout=600)
        took.append(time.perf_counter() - started)
        i += 1
    return took


def run(args: Any) -> dict[str, Any]:
    model = build_model(args.model_size)
    articles = [a for a in read_articles(FRAGMENT) if a.text.strip()]
    longest = max(articles, key=lambda a: len(a.text))
    warm = sorted((a for a in articles if a.id != longest.id), key=lambda a: len(a.text))[:WARM_ARTICLES]
    results: dict[str, Any] = {"environment": environment("cpu"), "model_size": args.model_size}
    with tempfile.TemporaryDirectory() as tmp:
        config = Config(model=str(model), index=Path(tmp) / "index", device="cpu", contexts="lazy")
        ingest(articles, config, progress=False)
        exact = config.replace(exact=True)
        searcher = Searcher.open(exact)
        store_random_contexts(searcher, [a.id for a in warm], args.seed)
        searcher.close()
        questions = [Question(f"{a.title} was born in [MASK].", a.title) for a in warm]
        batcher = MicroBatcher(lambda: Searcher.open(exact), max_batch=None, window_s=0.005, max_queue=4096)
        batcher.start()
        try:
            batcher.ready.wait()
            warm_client(batcher, questions, exact, 5)  # the first passes: allocations, caches
            alone = warm_client(batcher, questions, exact, args.seconds)
            cold_q = Question(f"{longest.title} was born in [MASK].", longest.title)
            (cold,) = batcher.submit([cold_q], exact)
            time.sleep(2)  # the cold encode has begun
            beside = warm_client(batcher, questions, exact, args.seconds)
            still_cold = not cold.done()
            asked = time.perf_counter()
            batcher.interrupt()
            try:
                cold.result(timeout=120)
                stopped = "answered"
            except Stopping:
                stopped = "stopped"
            stop_s = time.perf_counter() - asked
        finally:
            batcher.stop()
        check = Searcher.open(exact)
        coverage = check.backend.coverage([longest.id]).get(longest.id)
        check.close()
    a, b = tail(alone), tail(beside)
    results.update(
        {
            "cold_article": {"title": longest.title, "chars": len(longest.text)},
            "warm_alone": {**a, "questions": len(alone)},
            "warm_beside_cold": {**b, "questions": len(beside)},
            "p50_ratio": b["p50_ms"] / a["p50_ms"],
            "p99_ratio": b["p99_ms"] / a["p99_ms"],
            "cold_still_encoding": still_cold,
            "cold_encoded": None
            if coverage is None
            else {"encoded": coverage.encoded, "total": coverage.total},
            "cold_stop": {"outcome": stopped, "seconds": stop_s},
        }
    )
    return results


def report(r: dict[str, Any]) -> str:
    a, b = r["warm_alone"], r["warm_beside_cold"]
    return "\n".join(
        [
            f"warm alone:        p50 {a['p50_ms']:.0f} ms, p99 {a['p99_ms']:.0f} ms, {a['questions']} asked",
            f"beside a cold one: p50 {b['p50_ms']:.0f} ms, p99 {b['p99_ms']:.0f} ms, {b['questions']} asked",
            f"ratio p50 {r['p50_ratio']:.2f}, p99 {r['p99_ratio']:.2f}; cold {r['cold_article']['title']!r}:"
            f" {r['cold_encoded']} encoded meanwhile, still encoding: {r['cold_still_encoding']};"
            f" stop: {r['cold_stop']['outcome']} in {r['cold_stop']['seconds']:.2f} s",
        ]
    )


if __name__ == "__main__":
    parser = argument_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="each phase's length")
    run_benchmark(parser, run, report)
