"""Query latency on the embedded backend, by stage, and how it and the store grow with the corpus.

The benchmark builds its own index of synthetic Wikipedia-like articles, growing it through ``--sizes``
(250 → 1,000 → 4,000 articles by default). At each size it records the time to add the new articles,
the store's bytes (per table where SQLite's dbstat is available) and bytes per context, and the
single-question latency by stage. At ``--articles`` (1,000) it also measures questions/s in batches.

Stages, as ``Searcher`` runs them: IR = ``retrieve`` (the subject's own article, else BM25 top 3),
encoder = ``encode`` (the full MLM: the query state and p_BERT), kNN = ``neighbors`` (load the top
articles' blocks and exact search), interpolation = ``knn_probs`` + ``interpolate`` + ``rank``.
"total" is ``Searcher.answer`` end to end, evidence included.

Before and after (``--variants``, at ``--articles``): the encoder stage with the model's own forward
(MLM logits at every position: the path before the head moved to the mask rows), with the head at the
mask rows only (now), and the same in int8 (``--precision int8``, CPU). The variants are timed question
by question in turn, so that a machine shared with other work slows them alike.

Two kinds of question: "subject" (a KB fact whose subject is an article title, so IR returns that one
article, as for LAMA) and "free" (no subject: BM25 over the question's words returns 3 articles).

Keys: ``--keys synthetic`` (default) stores random float16 keys of the model's dimension for every
context that ``make_rows`` finds: encoding a 4,000-article corpus with BERT-base takes hours on 2 CPU
cores, and query latency depends on the number and size of the keys, not their values. Everything
else (sentences, rows, SQLite store, BM25 postings) is the real ingest path. ``--keys encoder`` runs
``ingest()`` itself (use it on a GPU).

    python benchmarks/bench_query.py --model-size base
    python benchmarks/bench_query.py --model-size base --sizes 1000 --questions 100
    python benchmarks/bench_query.py --device cuda --keys encoder --model-size base
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    LAYER,
    CorpusGenerator,
    argument_parser,
    build_model,
    dir_bytes,
    environment,
    percentiles,
    run_benchmark,
)

from bertknn_search.backends import codec
from bertknn_search.config import Config
from bertknn_search.encoding.encoder import MASK
from bertknn_search.ingest.contexts import build_blocks, make_rows
from bertknn_search.ingest.pipeline import CHUNK_ARTICLES, index_meta, ingest
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.query.interpolate import interpolate, rank
from bertknn_search.query.knn import knn_probs
from bertknn_search.query.search import Searcher
from bertknn_search.records import Article, Question
from bertknn_search.stopwords import STOPWORDS

PAPER_QUERY_S = 2.0  # Kassner & Schütze 2020: one query on CPU
STAGES = ("ir", "encoder", "knn", "interpolation")


# -- the index -----------------------------------------------------------------------------------------
def add_synthetic(articles: list[Article], config: Config, seed: int) -> dict[str, float]:
    """The ingest path with random keys in place of the encoder: sentences, rows, blocks, SQLite.

    Returns:
        Seconds per phase.
    """
    from bertknn_search.backends import open_backend
    from bertknn_search.encoding.encoder import Encoder

    encoder = Encoder(config.model, config.layer, "cpu", config.max_length)  # the tokenizer only
    backend = open_backend(config, create=index_meta(config, encoder))
    rng = np.random.default_rng(seed)
    spent = dict.fromkeys(("sentences", "rows", "keys", "write"), 0.0)
    try:
        for lo in range(0, len(articles), CHUNK_ARTICLES):
            chunk = articles[lo : lo + CHUNK_ARTICLES]
            t0 = time.perf_counter()
            sentences = [split_sentences(a.text) for a in chunk]
            t1 = time.perf_counter()
            rows = make_rows(sentences, encoder, config.mask_policy, encoder.max_length)
            t2 = time.perf_counter()
            keys = rng.standard_normal((len(rows), encoder.dim), dtype=np.float32).astype(np.float16)
            t3 = time.perf_counter()
            backend.add_articles(build_blocks(chunk, sentences, rows, keys, config))
            t4 = time.perf_counter()
            for phase, seconds in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                spent[phase] += seconds
    finally:
        backend.close()
    return spent


def add_articles(articles: list[Article], config: Config, keys: str, seed: int) -> dict[str, float]:
    """Add ``articles`` to the index; seconds in all and per phase."""
    started = time.perf_counter()
    if keys == "encoder":
        summary = ingest(articles, config, progress=False)
        phases = {"contexts_per_s": summary.contexts_per_second}
    else:
        phases = add_synthetic(articles, config, seed)
    return {"seconds": time.perf_counter() - started, **phases}


def store_breakdown(index: Path) -> dict[str, int]:
    """Bytes per table and index of the SQLite file (empty if this SQLite lacks the dbstat table)."""
    conn = sqlite3.connect(index / "index.sqlite")
    try:
        rows = conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC").fetchall()
    except sqlite3.Error:
        return {}
    finally:
        conn.close()
    return {name: int(size) for name, size in rows}


# -- questions -----------------------------------------------------------------------------------------
def make_questions(articles: list[Article], n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` cloze questions (text, subject) cut from the corpus: about 10 words around a masked word."""
    rng = np.random.default_rng(seed)
    out: list[tuple[str, str]] = []
    while len(out) < n:
        article = articles[int(rng.integers(len(articles)))]
        words = split_sentences(article.text)[int(rng.integers(1, 3))].rstrip(".").split()
        choices = [i for i, w in enumerate(words) if re.fullmatch(r"[a-z]+", w) and w not in STOPWORDS]
        if not choices:
            continue
        at = int(rng.choice(choices))
        lo = max(0, min(at - 5, len(words) - 10))
        window = words[lo : lo + 10]
        window[at - lo] = MASK
        text = " ".join(window)
        out.append((text[0].upper() + text[1:] + ".", article.title))
    return out


def as_questions(pairs: list[tuple[str, str]], kind: str) -> list[Question]:
    return [Question(text, subject if kind == "subject" else None) for text, subject in pairs]


# -- timing ------------------------------------------------------------------------------------------
def stage_times(searcher: Searcher, question: Question) -> dict[str, float]:
    """Seconds spent in each stage for one question, run as ``answer`` runs them."""
    cfg = searcher.config
    t0 = time.perf_counter()
    hits = searcher.retrieve(question)
    t1 = time.perf_counter()
    states, p_bert = searcher.encode([question])
    t2 = time.perf_counter()
    nb = searcher.neighbors(states[0], hits)
    t3 = time.perf_counter()
    p_knn = knn_probs(
        nb.distances, nb.token_ids, searcher.encoder.vocab_size, cfg.temperature, cfg.distance == "squared-l2"
    )
    p = interpolate(p_knn, p_bert[0], cfg.lam)
    for dist in (p, p_bert[0], p_knn):
        rank(dist, cfg.top)
    t4 = time.perf_counter()
    return {"ir": t1 - t0, "encoder": t2 - t1, "knn": t3 - t2, "interpolation": t4 - t3}


@contextlib.contextmanager
def full_forward(searcher: Searcher) -> Iterator[None]:
    """Run the encoder stage as before: the model's own forward, logits at every position."""
    encoder = searcher.encoder
    encoder._states_and_logits = encoder._full_states_and_logits  # type: ignore[method-assign]
    try:
        yield
    finally:
        del encoder._states_and_logits


def compare_variants(variants: dict[str, tuple[Searcher, bool]], questions: list[Question]) -> dict[str, Any]:
    """p50/p95 per stage and end to end for each variant, the variants taking turns question by question.

    Args:
        variants: name -> (searcher, whether to run the encoder stage through the full forward).
    """
    for searcher, full in variants.values():
        with full_forward(searcher) if full else contextlib.nullcontext():
            for q in questions[:3]:
                searcher.answer(q)  # warm-up
    per: dict[str, dict[str, list[float]]] = {v: {s: [] for s in (*STAGES, "total")} for v in variants}
    for q in questions:
        for name, (searcher, full) in variants.items():
            with full_forward(searcher) if full else contextlib.nullcontext():
                for stage, seconds in stage_times(searcher, q).items():
                    per[name][stage].append(seconds)
                started = time.perf_counter()
                searcher.answer(q)
                per[name]["total"].append(time.perf_counter() - started)
    return {name: {stage: percentiles(v) for stage, v in times.items()} for name, times in per.items()}


def single_latency(searcher: Searcher, questions: list[Question], with_total: bool) -> dict[str, Any]:
    """p50/p95 per stage over ``questions``, one at a time; with ``with_total``, ``answer`` end to end."""
    for q in questions[:3]:
        searcher.answer(q)  # warm-up: model load, first-call allocations
    per_stage: dict[str, list[float]] = {s: [] for s in STAGES}
    for q in questions:
        for stage, seconds in stage_times(searcher, q).items():
            per_stage[stage].append(seconds)
    out: dict[str, Any] = {stage: percentiles(v) for stage, v in per_stage.items()}
    out["sum_of_stages"] = percentiles(np.sum([per_stage[s] for s in STAGES], axis=0).tolist())
    if with_total:
        totals = []
        for q in questions:
            started = time.perf_counter()
            searcher.answer(q)
            totals.append(time.perf_counter() - started)
        out["total"] = percentiles(totals)
    return out


def batch_throughput(searcher: Searcher, questions: list[Question], batch: int) -> dict[str, float]:
    """Questions/s of ``answer_batch`` in batches of ``batch``, and each stage's share per question."""
    searcher.answer_batch(questions[:batch])  # warm-up at this batch shape
    started = time.perf_counter()
    for lo in range(0, len(questions), batch):
        searcher.answer_batch(questions[lo : lo + batch])
    seconds = time.perf_counter() - started
    # The same work stage by stage: the encoder runs once per batch, the rest once per question.
    spent = dict.fromkeys(STAGES, 0.0)
    for lo in range(0, len(questions), batch):
        chunk = questions[lo : lo + batch]
        t0 = time.perf_counter()
        states, p_bert = searcher.encode(chunk)
        spent["encoder"] += time.perf_counter() - t0
        for q, state, pb in zip(chunk, states, p_bert):
            t1 = time.perf_counter()
            hits = searcher.retrieve(q)
            t2 = time.perf_counter()
            nb = searcher.neighbors(state, hits)
            t3 = time.perf_counter()
            cfg = searcher.config
            p_knn = knn_probs(
                nb.distances, nb.token_ids, len(pb), cfg.temperature, cfg.distance == "squared-l2"
            )
            for dist in (interpolate(p_knn, pb, cfg.lam), pb, p_knn):
                rank(dist, cfg.top)
            t4 = time.perf_counter()
            spent["ir"] += t2 - t1
            spent["knn"] += t3 - t2
            spent["interpolation"] += t4 - t3
    n = len(questions)
    return {
        "batch": batch,
        "questions_per_s": n / seconds,
        **{f"{stage}_ms_per_question": 1000 * s / n for stage, s in spent.items()},
    }


# -- the run -------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = sorted({int(s) for s in args.sizes.split(",")} | {args.articles})
    model_dir = build_model(args.model_size)
    articles = CorpusGenerator(seed=args.seed).articles(sizes[-1])
    # Questions come from the smallest corpus, so the same ones are asked at every size.
    pairs = make_questions(articles[: sizes[0]], args.questions, args.seed)
    results: dict[str, Any] = {
        "benchmark": "query",
        "env": environment(args.device),
        "model_size": args.model_size,
        "keys": args.keys,
        "store_dtype": args.store_dtype,
        "questions": len(pairs),
        "scale": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-query-", dir=args.tmp) as tmp:
        config = Config(
            model=str(model_dir),
            layer=LAYER,
            device=args.device,
            index=Path(tmp) / "index",
            batch_size=256,
            store_dtype=args.store_dtype,
            contexts="eager",  # keys are stored at add time, as the latency being measured assumes
        )
        built = 0
        for size in sizes:
            previous = built
            added = add_articles(articles[built:size], config, args.keys, args.seed + size)
            built = size
            searcher = Searcher.open(config)
            try:
                stats = searcher.backend.stats()
                row: dict[str, Any] = {
                    "articles": stats.articles,
                    "contexts": stats.contexts,
                    "add": {"articles": size - previous, **added},
                }
                headline = size == args.articles
                scale_n = len(pairs) if headline else min(len(pairs), args.scale_questions)
                for kind in ("subject", "free"):
                    row[kind] = single_latency(searcher, as_questions(pairs[:scale_n], kind), headline)
                if headline and args.variants:
                    # int8 runs on a CPU only
                    others = [Searcher.open(config.replace(precision="int8"))] if args.device == "cpu" else []
                    try:
                        variants = {
                            f"before: full forward, {searcher.encoder.precision}": (searcher, True),
                            f"after: head at the mask, {searcher.encoder.precision}": (searcher, False),
                            **{f"after, {o.encoder.precision}": (o, False) for o in others},
                        }
                        row["query_path"] = {
                            kind: compare_variants(variants, as_questions(pairs, kind))
                            for kind in ("subject", "free")
                        }
                    finally:
                        for other in others:
                            other.close()
                if headline:
                    results["batch"] = {
                        kind: batch_throughput(searcher, as_questions(pairs, kind), args.batch)
                        for kind in ("subject", "free")
                    }
            finally:
                searcher.close()
            row["store_bytes"] = dir_bytes(config.index)
            row["bytes_per_context"] = row["store_bytes"] / max(stats.contexts, 1)
            row["vector_bytes_per_context"] = codec.bytes_per_vector(stats.meta.dim, args.store_dtype)
            row["tables"] = store_breakdown(config.index)
            results["scale"].append(row)
            if headline:
                results["headline"] = row
    return results


def report(r: dict[str, Any]) -> str:
    env = r["env"]
    lines = [
        f"query benchmark: BERT-{r['model_size']} (random weights), embedded backend, {r['keys']} keys"
        f" stored as {r['store_dtype']},"
        f" {r['questions']} questions, on {env.get('gpu', env['cpu'])} ({env['device']},"
        f" {env['torch_threads']} threads)"
    ]
    head = r["headline"]
    lines.append(
        f" single questions at {head['articles']} articles ({head['contexts']} contexts), ms p50 / p95:"
    )
    for kind in ("subject", "free"):
        cells = [f"{s} {head[kind][s]['p50_ms']:.1f}/{head[kind][s]['p95_ms']:.1f}" for s in STAGES]
        total = head[kind]["total"]
        lines.append(
            f"  {kind:<7}: " + ", ".join(cells) + f"; total {total['p50_ms']:.1f}/{total['p95_ms']:.1f}"
            f"  ({PAPER_QUERY_S * 1000 / total['p50_ms']:.0f}x under the paper's 2 s)"
        )
    for kind, by_variant in head.get("query_path", {}).items():
        lines.append(f" {kind}, variants in turn, ms p50 / p95:")
        for name, v in by_variant.items():
            cells = [f"{s} {v[s]['p50_ms']:.1f}/{v[s]['p95_ms']:.1f}" for s in STAGES]
            lines.append(
                f"  {name:<30}: " + ", ".join(cells) + f"; total {v['total']['p50_ms']:.1f}/"
                f"{v['total']['p95_ms']:.1f}"
            )
    for kind, b in r["batch"].items():
        split = ", ".join(f"{s} {b[f'{s}_ms_per_question']:.1f}" for s in STAGES)
        lines.append(
            f" batch of {b['batch']}, {kind}: {b['questions_per_s']:.1f} questions/s (ms/question: {split})"
        )
    lines.append(
        " scale: articles, contexts, add s, store MB, bytes/context, p50 ms subject ir/knn, free ir/knn"
    )
    for row in r["scale"]:
        s, f = row["subject"], row["free"]
        lines.append(
            f"  {row['articles']:>6} {row['contexts']:>9} {row['add']['seconds']:8.1f}"
            f" {row['store_bytes'] / 1e6:9.1f}"
            f" {row['bytes_per_context']:8.0f}   {s['ir']['p50_ms']:6.2f} {s['knn']['p50_ms']:6.2f}"
            f"   {f['ir']['p50_ms']:6.2f} {f['knn']['p50_ms']:6.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--keys", choices=["synthetic", "encoder"], default="synthetic")
    parser.add_argument(
        "--store-dtype", choices=codec.DTYPES, default="float16", help="how vectors are stored"
    )
    parser.add_argument("--sizes", default="250,1000,4000", help="index sizes in articles, grown in turn")
    parser.add_argument("--articles", type=int, default=1000, help="size for the full latency/batch numbers")
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--scale-questions", type=int, default=60, help="questions per kind at other sizes")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--no-variants", dest="variants", action="store_false", help="skip the before/after/int8 comparison"
    )
    parser.add_argument("--tmp", type=Path, default=None, help="where the index is built (default: $TMPDIR)")
    run_benchmark(parser, run, report)


if __name__ == "__main__":
    main()
