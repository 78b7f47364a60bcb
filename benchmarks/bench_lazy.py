"""Lazy datastore: text-pass ingest, cold and warm query latency against an eager index of the same corpus.

The corpus is real Wikipedia text cut to the real article-length distribution: the sentences of the
shared enwiki fragment (``--source``), in order, dealt into articles whose word counts follow a
lognormal with median 330 and sigma 1.0 (mean about 545 words; English Wikipedia has about 4B words in
6.7M articles, 600 a page). The fragment's own articles are the dump's first pages, Anarchism, Autism
and the like, ten times longer than a typical article, so they are not used whole.

- **text pass**: ``ingest(contexts="lazy")``: read, IR index and text store, no model.
- **eager**: the same articles with every context stored. Encoding them all with BERT-base on 2 CPU
  cores would take hours, so keys are random (``bench_query.add_synthetic``: the real sentences, rows,
  blocks and SQLite writes); latency depends on how many keys are searched, not on their values.
- **cold**: a question whose articles have no contexts yet: IR, then the real encoder pass over those
  articles' contexts, store, kNN. Subject questions need one article, free questions three.
- **warm**: the same questions again on the lazy index (contexts now stored), and on the eager index.

    python benchmarks/bench_lazy.py --model-size base --out benchmarks/results/lazy-cpu-base.json
    python benchmarks/bench_lazy.py --device cuda --model-size base --cold 40 --out ...
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_query import add_synthetic, make_questions
from common import LAYER, argument_parser, build_model, dir_bytes, environment, percentiles, run_benchmark

from bertknn_search.config import Config
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.readers import read_articles
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.records import Article, Question
from bertknn_search.search import Searcher

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
FRAGMENT = SHARED / "wiki-sample" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
TREX = SHARED / "lama" / "TREx"
# English Wikipedia, for the whole-dump table (README figures): pages, words and characters of text.
ENWIKI_ARTICLES = 6.7e6
ENWIKI_CHARS = 20e9
# Measured rates the table uses for the GPU (benchmarks/README.md, H100, ingest() end to end).
H100_CONTEXTS_PER_S = 10_800
LAMA_TREX_FACTS = 34_039  # LAMA's T-REx test facts, 41 relations (Petroni et al. 2019)


def wikipedia_shaped(source: Path, n: int, seed: int) -> list[Article]:
    """``n`` articles of real sentences with lognormal word counts (median 330, sigma 1.0)."""
    sentences = [s for a in read_articles(source) for s in split_sentences(a.text) if len(s.split()) >= 4]
    rng = np.random.default_rng(seed)
    out, at = [], 0
    for i in range(n):
        want = int(np.clip(rng.lognormal(np.log(330), 1.0), 40, 8000))
        picked: list[str] = []
        while sum(len(s.split()) for s in picked) < want:
            picked.append(sentences[at % len(sentences)])
            at += 1
        out.append(Article(str(i), f"Page {i:05d}", " ".join(picked)))
    return out


def timed_answers(searcher: Searcher, questions: list[Question]) -> tuple[list[float], list[int]]:
    """Seconds for each ``answer``, and the contexts each one had to encode first."""
    seconds, encoded = [], []
    for q in questions:
        before = getattr(searcher.backend, "encoded_contexts", 0)
        started = time.perf_counter()
        searcher.answer(q)
        seconds.append(time.perf_counter() - started)
        encoded.append(getattr(searcher.backend, "encoded_contexts", 0) - before)
    return seconds, encoded


def trex_subjects() -> int | None:
    """Distinct subjects in the shared T-REx files (each is one article a LAMA run needs)."""
    if not TREX.exists():
        return None
    subjects = set()
    for path in TREX.glob("P*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            subjects.add(json.loads(line)["sub_label"])
    return len(subjects)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not args.source.exists():
        raise SystemExit(f"the enwiki fragment is not at {args.source}: pass --source")
    articles = wikipedia_shaped(args.source, args.articles, args.seed)
    model_dir = build_model(args.model_size)
    # One question per article, so that every cold question really finds its article unencoded.
    pairs = list(
        {s: (t, s) for t, s in make_questions(articles, 4 * (args.cold + args.cold_free), args.seed)}.values()
    )
    subject_qs = [Question(t, s) for t, s in pairs[: args.cold]]
    free_qs = [Question(t, None) for t, _ in pairs[args.cold :]]
    results: dict[str, Any] = {
        "benchmark": "lazy",
        "env": environment(args.device),
        "model_size": args.model_size,
        "articles": len(articles),
        "words_per_article": float(np.mean([len(a.text.split()) for a in articles])),
        "text_mb": sum(len(a.text.encode("utf-8")) for a in articles) / 1e6,
    }
    with tempfile.TemporaryDirectory(prefix="bench-lazy-", dir=args.tmp) as tmp:
        base = Config(model=str(model_dir), layer=LAYER, device=args.device, batch_size=args.batch_size)
        lazy, eager = (
            base.replace(index=Path(tmp) / "lazy", contexts="lazy"),
            base.replace(index=Path(tmp) / "eager"),
        )
        started = time.perf_counter()
        ingest(articles, lazy, progress=False)
        text_seconds = time.perf_counter() - started
        results["text_pass"] = {
            "seconds": text_seconds,
            "mb_per_s": results["text_mb"] / text_seconds,
            "articles_per_s": len(articles) / text_seconds,
            "bytes": dir_bytes(lazy.index),
        }
        started = time.perf_counter()
        phases = add_synthetic(articles, eager, args.seed)
        results["eager_synthetic"] = {"seconds": time.perf_counter() - started, **phases}
        lazy_s, eager_s = Searcher.open(lazy), Searcher.open(eager)
        try:
            eager_stats = eager_s.backend.stats()
            results["eager"] = {
                "contexts": eager_stats.contexts,
                "contexts_per_article": eager_stats.contexts / eager_stats.articles,
                "bytes": dir_bytes(eager.index),
                "bytes_per_context": dir_bytes(eager.index) / eager_stats.contexts,
            }
            nowhere = Question("[MASK] zzzunseen qqqunknown.", None)  # finds no article: encodes nothing
            lazy_s.answer(nowhere)  # model load and first-call allocations
            eager_s.answer(nowhere)
            for kind, qs in (("subject", subject_qs), ("free", free_qs)):
                cold, encoded = timed_answers(lazy_s, qs)
                warm, _ = timed_answers(lazy_s, qs)
                base_line, _ = timed_answers(eager_s, qs)
                results[kind] = {
                    "cold": percentiles(cold),
                    "warm": percentiles(warm),
                    "eager": percentiles(base_line),
                    "contexts_encoded_per_question": float(np.mean(encoded)),
                    "cold_contexts_per_s": float(sum(encoded) / max(sum(cold), 1e-9)),
                }
            stats = lazy_s.backend.stats()
            results["lazy_after"] = {
                "encoded_articles": stats.encoded_articles,
                "contexts": stats.contexts,
                "bytes": dir_bytes(lazy.index),
            }
        finally:
            lazy_s.close()
            eager_s.close()
    results["enwiki"] = whole_dump(results)
    return results


def whole_dump(r: dict[str, Any]) -> dict[str, Any]:
    """The full English dump, from the rates measured here (and the H100 rate in the README)."""
    per_article = r["eager"]["contexts_per_article"] * 600 / r["words_per_article"]
    contexts = ENWIKI_ARTICLES * per_article
    cpu_rate = r["subject"]["cold_contexts_per_s"]
    text_bytes_per_char = r["text_pass"]["bytes"] / (r["text_mb"] * 1e6)
    subjects = trex_subjects()
    # Each T-REx fact needs its subject's article; LAMA's 41 relations share subjects less than the 28
    # here, so the shared files' ratio of subjects to facts is applied to LAMA's published fact count.
    trex_articles = LAMA_TREX_FACTS * (subjects / shared_trex_facts() if subjects else 1.0)
    return {
        "contexts": contexts,
        "eager_store_tb": contexts * r["eager"]["bytes_per_context"] / 1e12,
        "lazy_text_store_gb": ENWIKI_CHARS * text_bytes_per_char / 1e9,
        "eager_hours_h100": contexts / H100_CONTEXTS_PER_S / 3600,
        "eager_years_cpu": contexts / cpu_rate / 3600 / 24 / 365,
        "lazy_text_pass_hours_this_machine": ENWIKI_CHARS / (r["text_pass"]["mb_per_s"] * 1e6) / 3600,
        "trex_articles": trex_articles,
        "trex_contexts": trex_articles * per_article,
        "trex_hours_h100": trex_articles * per_article / H100_CONTEXTS_PER_S / 3600,
        "trex_hours_cpu": trex_articles * per_article / cpu_rate / 3600,
    }


def shared_trex_facts() -> int:
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in TREX.glob("P*.jsonl"))


def report(r: dict[str, Any]) -> str:
    env = r["env"]
    t, e = r["text_pass"], r["eager"]
    lines = [
        f"lazy benchmark: BERT-{r['model_size']} (random weights) on {env.get('gpu', env['cpu'])}"
        f" ({env['device']}, {env['torch_threads']} threads); {r['articles']} articles of real enwiki"
        f" sentences, {r['words_per_article']:.0f} words and {e['contexts_per_article']:.0f} contexts each",
        f" text pass (lazy ingest): {t['mb_per_s']:.2f} MB/s, {t['articles_per_s']:.0f} articles/s,"
        f" {t['bytes'] / r['articles']:.0f} bytes/article on disk; eager store"
        f" {e['bytes_per_context']:.0f} bytes/context",
        " latency ms p50/p95: cold (lazy, encodes first) | warm (lazy) | eager; contexts encoded per cold q",
    ]
    for kind in ("subject", "free"):
        k = r[kind]
        lines.append(
            f"  {kind:<7}: {k['cold']['p50_ms']:9.1f}/{k['cold']['p95_ms']:9.1f} |"
            f" {k['warm']['p50_ms']:6.1f}/{k['warm']['p95_ms']:6.1f} |"
            f" {k['eager']['p50_ms']:6.1f}/{k['eager']['p95_ms']:6.1f};"
            f" {k['contexts_encoded_per_question']:.0f} contexts at {k['cold_contexts_per_s']:.0f}/s"
            f"  (warm/eager {k['warm']['p50_ms'] / k['eager']['p50_ms']:.2f})"
        )
    w = r["enwiki"]
    lines += [
        f" full enwiki ({ENWIKI_ARTICLES / 1e6:.1f}M articles, ~{w['contexts'] / 1e9:.2f}B contexts):",
        f"  eager: {w['eager_hours_h100']:.0f} h on an H100 at {H100_CONTEXTS_PER_S:,}/s,"
        f" {w['eager_years_cpu']:.1f} years on this CPU; store {w['eager_store_tb']:.2f} TB",
        f"  lazy: text pass {w['lazy_text_pass_hours_this_machine']:.1f} h on this machine;"
        f" store {w['lazy_text_store_gb']:.0f} GB before any query",
        f"  a LAMA T-REx run: ~{w['trex_articles']:,.0f} articles, {w['trex_contexts'] / 1e6:.1f}M contexts:"
        f" {w['trex_hours_h100']:.1f} h on an H100, {w['trex_hours_cpu']:.0f} h on this CPU",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--source", type=Path, default=FRAGMENT, help="an enwiki XML dump (fragment)")
    parser.add_argument("--articles", type=int, default=300)
    parser.add_argument("--cold", type=int, default=6, help="subject questions (1 article each)")
    parser.add_argument("--cold-free", type=int, default=3, help="free questions (3 articles each)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--tmp", type=Path, default=None, help="where the indexes are built")
    run_benchmark(parser, run, report)


if __name__ == "__main__":
    main()
