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
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_query import add_synthetic, make_questions
from common import (
    LAYER,
    Progress,
    argument_parser,
    build_model,
    dir_bytes,
    environment,
    percentiles,
    run_benchmark,
)

from bertknn_search.config import Config
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.readers import read_articles
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.query.search import Searcher
from bertknn_search.records import Article, Question

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
FRAGMENT = SHARED / "wiki-sample" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
TREX = SHARED / "lama" / "TREx"
# English Wikipedia, for the whole-dump table (README figures): pages, words and characters of text.
ENWIKI_ARTICLES = 6.7e6
ENWIKI_CHARS = 20e9
# Measured rates the table uses for the GPU (benchmarks/README.md, H100, ingest() end to end).
H100_CONTEXTS_PER_S = 10_800
# encode_rows alone on the H100 (21-25k contexts/s; benchmarks/README.md): what a cold query's pass runs.
H100_ENCODE_CONTEXTS_PER_S = 21_000
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


class StageClock:
    """Seconds spent in each stage of a lazy article's encoding while installed: ``encode`` (the BERT pass,
    what a GPU speeds up) and the CPU work around it, ``split``, ``rows``, ``blocks`` and ``write``."""

    def __init__(self, store: Any) -> None:
        import bertknn_search.ingest.contexts as contexts
        import bertknn_search.ingest.sentences as sentences

        self.seconds: dict[str, float] = dict.fromkeys(("split", "rows", "encode", "blocks", "write"), 0.0)
        self._undo: list[tuple[Any, str, Any]] = []
        for owner, name, stage in (
            (sentences, "split_sentences", "split"),
            (contexts, "make_rows", "rows"),
            (contexts, "encode_rows", "encode"),
            (contexts, "build_blocks", "blocks"),
            (store, "put_contexts", "write"),
        ):
            self._wrap(owner, name, stage)

    def _wrap(self, owner: Any, name: str, stage: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[stage] += time.perf_counter() - started

        self._undo.append((owner, name, original))
        setattr(owner, name, timed)

    def close(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)


def cold_answers(
    searcher: Searcher,
    questions: list[Question],
    wanted: int,
    clock: StageClock,
    deadline: float,
    say: Any,
) -> tuple[list[Question], dict[str, list[float]]]:
    """Up to ``wanted`` of ``questions`` asked once on the lazy index, each only if none of the articles
    it searches is encoded yet, until ``deadline``.

    Returns:
        The questions asked, and per question: seconds, contexts encoded first, and seconds of those in
        the encoder pass.
    """
    out: dict[str, list[float]] = {"seconds": [], "contexts": []}
    out.update({f"{stage}_seconds": [] for stage in clock.seconds})
    asked: list[Question] = []
    for q in questions:
        if time.monotonic() > deadline or len(asked) == wanted:
            if len(asked) < wanted:
                say(f"cold: time bound reached after {len(asked)} of {wanted} questions")
            break
        ids = [h.id for h in searcher.retrieve(q)]
        if not ids or len(searcher.backend.store.unencoded(ids)) < len(ids):
            continue  # an article an earlier question encoded: not a cold question
        asked.append(q)
        before, stages = searcher.backend.encoded_contexts, dict(clock.seconds)
        started = time.perf_counter()
        searcher.answer(q)
        out["seconds"].append(time.perf_counter() - started)
        out["contexts"].append(searcher.backend.encoded_contexts - before)
        for stage, seconds in clock.seconds.items():
            out[f"{stage}_seconds"].append(seconds - stages[stage])
        say(
            f"cold {len(asked)}/{wanted}: {out['seconds'][-1]:.1f} s, {out['contexts'][-1]} contexts"
            f" ({out['encode_seconds'][-1]:.1f} s in the encoder, "
            + ", ".join(
                f"{st} {out[f'{st}_seconds'][-1] * 1000:.0f}" for st in clock.seconds if st != "encode"
            )
            + " ms)"
        )
    return asked, out


def warm_in_turn(
    lazy: Searcher, eager: Searcher, questions: list[Question], rounds: int
) -> tuple[list[float], list[float]]:
    """The same questions on the lazy (now encoded) and eager indexes, in turn, the order alternating, so
    that the shared machine's load falls on both alike."""
    lazy_s: list[float] = []
    eager_s: list[float] = []
    for r in range(rounds):
        for i, q in enumerate(questions):
            pair = ((lazy, lazy_s), (eager, eager_s))
            for searcher, into in pair if (r + i) % 2 == 0 else pair[::-1]:
                started = time.perf_counter()
                searcher.answer(q)
                into.append(time.perf_counter() - started)
    return lazy_s, eager_s


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
    results: dict[str, Any] = {
        "benchmark": "lazy",
        "env": environment(args.device),
        "model_size": args.model_size,
    }
    progress = Progress(args.out, results)
    deadline = time.monotonic() + args.max_seconds
    articles = wikipedia_shaped(args.source, args.articles, args.seed)
    model_dir = build_model(args.model_size)
    # One question per article, so that every cold question really finds its article unencoded.
    pairs = list(
        {s: (t, s) for t, s in make_questions(articles, 4 * (args.cold + args.cold_free), args.seed)}.values()
    )
    # More than asked for: a free question whose articles an earlier one encoded is skipped.
    subject_qs = [Question(t, s) for t, s in pairs[: args.cold]]
    free_qs = [Question(t, None) for t, _ in pairs[args.cold :]]
    words = float(np.mean([len(a.text.split()) for a in articles]))
    progress.done(
        "corpus",
        f"{len(articles)} articles, {words:.0f} words each on average",
        articles=len(articles),
        words_per_article=words,
        words_p50=float(np.median([len(a.text.split()) for a in articles])),
        text_mb=sum(len(a.text.encode("utf-8")) for a in articles) / 1e6,
    )
    with tempfile.TemporaryDirectory(prefix="bench-lazy-", dir=args.tmp) as tmp:
        base = Config(model=str(model_dir), layer=LAYER, device=args.device, batch_size=args.batch_size)
        lazy, eager = (
            base.replace(index=Path(tmp) / "lazy", contexts="lazy"),
            base.replace(index=Path(tmp) / "eager", contexts="eager"),
        )
        started = time.perf_counter()
        ingest(articles, lazy, progress=False)
        text_seconds = time.perf_counter() - started
        progress.done(
            "text pass",
            f"{text_seconds:.1f} s",
            text_pass={
                "seconds": text_seconds,
                "mb_per_s": results["text_mb"] / text_seconds,
                "articles_per_s": len(articles) / text_seconds,
                "bytes": dir_bytes(lazy.index),
            },
        )
        started = time.perf_counter()
        phases = add_synthetic(articles, eager, args.seed)
        progress.done(
            "eager index (synthetic keys)",
            f"{time.perf_counter() - started:.1f} s",
            eager_synthetic={"seconds": time.perf_counter() - started, **phases},
        )
        lazy_s, eager_s = Searcher.open(lazy), Searcher.open(eager)
        clock = StageClock(lazy_s.backend.store)
        try:
            eager_stats = eager_s.backend.stats()
            started = time.perf_counter()
            nowhere = Question("[MASK] zzzunseen qqqunknown.", None)  # finds no article: encodes nothing
            lazy_s.answer(nowhere)  # model load and first-call allocations
            eager_s.answer(nowhere)
            progress.done(
                "models loaded",
                f"{time.perf_counter() - started:.1f} s; eager index {eager_stats.contexts:,} contexts",
                eager={
                    "contexts": eager_stats.contexts,
                    "contexts_per_article": eager_stats.contexts / eager_stats.articles,
                    "bytes": dir_bytes(eager.index),
                    "bytes_per_context": dir_bytes(eager.index) / eager_stats.contexts,
                },
            )
            for kind, qs, wanted in (("subject", subject_qs, args.cold), ("free", free_qs, args.cold_free)):
                say = lambda line, kind=kind: print(f"  {kind} {line}", file=sys.stderr, flush=True)  # noqa: E731
                asked, cold = cold_answers(lazy_s, qs, wanted, clock, deadline, say)
                if not asked:
                    continue
                warm, base_line = warm_in_turn(lazy_s, eager_s, asked, args.warm_rounds)
                encoded, seconds = sum(cold["contexts"]), sum(cold["seconds"])
                other = [s - e for s, e in zip(cold["seconds"], cold["encode_seconds"])]
                entry = {
                    "questions": len(asked),
                    "cold": percentiles(cold["seconds"]),
                    "cold_outside_encoder": percentiles(other),
                    "warm": percentiles(warm),
                    "eager": percentiles(base_line),
                    "warm_over_eager_p50": percentiles(warm)["p50_ms"] / percentiles(base_line)["p50_ms"],
                    "contexts_encoded_per_question": float(np.mean(cold["contexts"])),
                    "cold_contexts_per_s": float(encoded / max(seconds, 1e-9)),
                    "encoder_contexts_per_s": float(encoded / max(sum(cold["encode_seconds"]), 1e-9)),
                    "cpu_stages_ms_per_question": {
                        st: 1000 * float(np.mean(cold[f"{st}_seconds"]))
                        for st in clock.seconds
                        if st != "encode"
                    },
                    "per_question": cold,
                }
                progress.done(
                    f"{kind} questions",
                    f"cold p50 {entry['cold']['p50_ms']:.0f} ms ({entry['contexts_encoded_per_question']:.0f}"
                    f" contexts), warm p50 {entry['warm']['p50_ms']:.1f} ms, eager p50"
                    f" {entry['eager']['p50_ms']:.1f} ms (warm/eager {entry['warm_over_eager_p50']:.2f})",
                    **{kind: entry},
                )
            stats = lazy_s.backend.stats()
            results["lazy_after"] = {
                "encoded_articles": stats.encoded_articles,
                "contexts": stats.contexts,
                "bytes": dir_bytes(lazy.index),
            }
        finally:
            clock.close()
            lazy_s.close()
            eager_s.close()
    if "subject" in results:
        progress.done("whole-dump table", "from the rates above", enwiki=whole_dump(results))
    progress.finish()
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
        if kind not in r:
            continue
        k = r[kind]
        lines.append(
            f"  {kind:<7}: {k['cold']['p50_ms']:9.1f}/{k['cold']['p95_ms']:9.1f} |"
            f" {k['warm']['p50_ms']:6.1f}/{k['warm']['p95_ms']:6.1f} |"
            f" {k['eager']['p50_ms']:6.1f}/{k['eager']['p95_ms']:6.1f};"
            f" {k['contexts_encoded_per_question']:.0f} contexts,"
            f" encoder {k['encoder_contexts_per_s']:.0f}/s,"
            f" {k['cold_outside_encoder']['p50_ms']:.0f} ms outside it"
            f"  (warm/eager {k['warm_over_eager_p50']:.2f}; {k['questions']} questions)"
        )
        h100 = k["contexts_encoded_per_question"] / H100_ENCODE_CONTEXTS_PER_S * 1000
        cpu = k.get("cpu_stages_ms_per_question", {})
        lines.append(
            f"           on an H100 the encoding would take ~{h100:.0f} ms"
            f" (at {H100_ENCODE_CONTEXTS_PER_S:,} contexts/s, encode_rows' rate); CPU stages here, ms: "
            + ", ".join(f"{st} {ms:.0f}" for st, ms in cpu.items())
        )
    if "enwiki" not in r:
        return "\n".join(lines)
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
    parser.add_argument("--warm-rounds", type=int, default=8, help="times each cold question is asked warm")
    parser.add_argument(
        "--max-seconds", type=float, default=1500.0, help="no cold question is started after this"
    )
    parser.add_argument("--tmp", type=Path, default=None, help="where the indexes are built")
    run_benchmark(parser, run, report)


if __name__ == "__main__":
    main()
