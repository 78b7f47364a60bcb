"""Scale: text-only ingest rate and IR latency of the embedded backend on Wikipedia-shaped corpora.

Three parts, each on its own flag:

- default: for each ``--articles`` size, a generated corpus (JSONL) is ingested without BERT (read,
  split, IR terms, SQLite rows with the sentences, the tantivy article index), then free questions (BM25
  over the question) and subject questions (the title shortcut) are timed through ``retrieve``.
  ``--baseline REF`` runs the same sizes with the ``bertknn_search`` package of git ``REF`` (e.g. the
  SQLite-postings BM25 before tantivy), in a child process, on the same corpus: compare within one run.
- ``--splitters``: sentence splitters on the shared enwiki fragment and LAMA's T-REx evidence sentences
  (speed, sentence counts, boundaries that differ from pysbd's). Needs ``pip install pysbd blingfire``.
- ``--xml``: the MediaWiki XML path (mwparserfromhell markup stripping) in characters/s on one core and
  on every core (a process pool over pages).

The generated corpus has Wikipedia's shape, not its words: article lengths are lognormal with median
250 and mean 500 words (English Wikipedia: about 6.7M articles and 20G characters of clean text, about
3,000 characters an article, most of them stubs), sentences of 10-40 words, 42% stopwords, and content
words drawn Zipf-Mandelbrot (exponent 1) from a 300,000-word vocabulary.

    python benchmarks/bench_scale.py --articles 10000 100000 --baseline HEAD~2 \\
        --out benchmarks/results/scale-cpu.json
    python benchmarks/bench_scale.py --splitters --xml --out benchmarks/results/text-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from itertools import pairwise
from multiprocessing import Pool
from pathlib import Path
from typing import Any

if os.environ.get("BENCH_SCALE_PACKAGE"):  # the --baseline child: import that version of the package
    sys.path.insert(0, os.environ["BENCH_SCALE_PACKAGE"])

import numpy as np
from common import COMMON_STOPWORDS, dir_bytes, percentiles, synthetic_words, write_results

from bertknn_search.backends.embedded import EmbeddedBackend
from bertknn_search.ingest.readers import read_articles
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.records import Article, ContextBlock, EncodedArticle, IndexMeta, Question
from bertknn_search.retrieve import retrieve
from bertknn_search.stopwords import STOPWORDS

META = IndexMeta(model="bench", layer=11, dim=768, vocab_size=30522, mask_policy="single-wordpiece")
MEDIAN_WORDS, SIGMA = 250, 1.18  # lognormal: mean = median * exp(sigma^2 / 2) = 500 words
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
ENWIKI = SHARED / "wiki-sample" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


class WikiShapedCorpus:
    """Generated articles with Wikipedia's length distribution and a Zipfian vocabulary (vectorised)."""

    def __init__(self, seed: int = 0, vocab_size: int = 300_000) -> None:
        self.seed = seed
        self.words = np.array(synthetic_words(vocab_size, seed), dtype=object)
        weights = 1.0 / (np.arange(vocab_size) + 2.7)
        self.cdf = np.cumsum(weights / weights.sum())
        stops = COMMON_STOPWORDS + sorted(STOPWORDS - set(COMMON_STOPWORDS))
        self.stops = np.array(stops, dtype=object)
        stop_weights = 1.0 / (np.arange(len(stops)) + 1.0)
        self.stop_cdf = np.cumsum(stop_weights / stop_weights.sum())

    def articles(self, n: int) -> Iterator[Article]:
        rng = np.random.default_rng(self.seed)
        lengths = np.clip(rng.lognormal(np.log(MEDIAN_WORDS), SIGMA, n), 20, 20_000).astype(int)
        for i, length in enumerate(lengths.tolist()):
            words = self.words[np.minimum(np.searchsorted(self.cdf, rng.random(length)), len(self.cdf) - 1)]
            stop = rng.random(length) < 0.42
            words[stop] = self.stops[np.searchsorted(self.stop_cdf, rng.random(int(stop.sum())))]
            title = f"{words[0].title()} {self.words[-1 - i % len(self.words)].title()} {i}"
            cuts = np.cumsum(np.clip(rng.normal(23, 7, length // 10 + 1), 10, 40).astype(int))
            bounds = [0, *(c for c in cuts.tolist() if c < length), length]
            tokens = words.tolist()
            tokens[:2] = [title, "is"]
            sentences = (" ".join(tokens[a:b]) for a, b in pairwise(bounds) if b > a)
            yield Article(str(i), title, " ".join(s[0].upper() + s[1:] + "." for s in sentences))


def write_corpus(n: int, path: Path, seed: int) -> None:
    with path.open("w", encoding="utf-8") as f:
        for a in WikiShapedCorpus(seed).articles(n):
            f.write(json.dumps({"id": a.id, "title": a.title, "text": a.text}) + "\n")


def text_only_ingest(corpus: Path, index: Path, batch_articles: int, processes: int) -> dict[str, Any]:
    """Read, split and store every article (no contexts), timing each stage.

    With ``processes`` > 1, splitting and the IR terms are computed in a pool of worker processes (what
    ingest's text preparation would do with workers) and handed to the writer, which then only writes.
    """
    backend = EmbeddedBackend.create(index, META)
    stage = {"read_and_prepare": 0.0, "store": 0.0}
    chars = articles = 0
    started = time.perf_counter()
    chunks = _chunks(read_articles(corpus), batch_articles)
    pool = Pool(processes) if processes > 1 else None
    prepared_chunks = pool.imap(_prepare, chunks) if pool else map(_prepare_here, chunks)
    try:
        while True:
            t0 = time.perf_counter()
            prepared = next(prepared_chunks, None)
            t1 = time.perf_counter()
            if prepared is None:
                break
            chunk = [a for a, _, _ in prepared]
            backend.fingerprints([a.id for a in chunk])  # the resume check ingest makes for every chunk
            items = [EncodedArticle(a, ContextBlock.empty(META.dim, s), "f") for a, s, _ in prepared]
            if pool:
                _PRECOMPUTED.clear()
                _PRECOMPUTED.update(((a.title, a.text), f) for a, _, f in prepared)
            backend.add_articles(items)
            t3 = time.perf_counter()
            stage["read_and_prepare"] += t1 - t0  # with workers: the wait for their next chunk
            stage["store"] += t3 - t1
            chars += sum(len(a.text) for a in chunk)
            articles += len(chunk)
    finally:
        if pool:
            pool.terminate()
    seconds = time.perf_counter() - started
    backend.close()
    return {
        "articles": articles,
        "text_mb": chars / 1e6,
        "seconds": seconds,
        "mb_per_s": chars / 1e6 / seconds,
        "articles_per_s": articles / seconds,
        "stage_seconds": stage,
        "bytes": {"total": dir_bytes(index), "tantivy": dir_bytes(index / "articles.tantivy")},
    }


_PRECOMPUTED: dict[tuple[str, str], tuple[str, str]] = {}


def _chunks(articles: Iterator[Article], size: int) -> Iterator[list[Article]]:
    while chunk := [a for _, a in zip(range(size), articles)]:
        yield chunk


def _prepare_here(chunk: list[Article]) -> list[tuple[Article, list[str], None]]:
    """In the writer's process: splitting only; ``add_articles`` makes the IR terms itself."""
    return [(a, split_sentences(a.text), None) for a in chunk]


def _prepare(chunk: list[Article]) -> list[tuple[Article, list[str], tuple[str, str]]]:
    """In a worker process: splitting and the IR terms."""
    from bertknn_search.backends.article_index import field_texts

    return [(a, split_sentences(a.text), field_texts(a.title, a.text)) for a in chunk]


def questions(corpus: Path, n: int, seed: int) -> list[tuple[str, str]]:
    """(free question, subject) pairs cut from random articles: 10 words around a masked word."""
    rng = np.random.default_rng(seed + 1)
    articles = [a for i, a in enumerate(read_articles(corpus)) if i % 97 == 0]
    out: list[tuple[str, str]] = []
    while len(out) < n:
        a = articles[int(rng.integers(len(articles)))]
        sentences = split_sentences(a.text)
        words = sentences[int(rng.integers(len(sentences)))].rstrip(".").split()
        at = int(rng.integers(len(words)))
        lo = max(0, min(at - 5, len(words) - 10))
        window = words[lo : lo + 10]
        window[at - lo] = "[MASK]"
        out.append((" ".join(window) + ".", a.title))
    return out


def ir_latency(index: Path, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    backend = EmbeddedBackend.open(index)
    try:
        for text, _ in pairs[:20]:  # warm the page cache and the readers
            retrieve(backend, Question(text), 3)
        out = {}
        for kind in ("free", "subject"):
            seconds, found = [], 0
            for text, subject in pairs:
                q = Question(text, subject if kind == "subject" else None)
                t0 = time.perf_counter()
                hits = retrieve(backend, q, 3)
                seconds.append(time.perf_counter() - t0)
                found += bool(hits)
            out[kind] = {**percentiles(seconds), "answered": found / len(pairs)}
        return out
    finally:
        backend.close()


def run_sizes(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for n in args.articles:
        corpus = work / f"corpus-{n}.jsonl"
        if not corpus.exists():
            write_corpus(n, corpus, args.seed)
        index = work / f"index-{n}-{args.label}"
        ingest = text_only_ingest(corpus, index, args.batch_articles, args.prep_processes)
        latency = ir_latency(index, questions(corpus, args.questions, args.seed))
        results[str(n)] = {"ingest": ingest, "ir": latency}
        print(f"[{args.label}] {n:,} articles: {json.dumps(results[str(n)])}", file=sys.stderr, flush=True)
        if not args.keep:
            subprocess.run(["rm", "-rf", str(index)], check=True)
    return results


def baseline(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The same sizes with the package of git ``args.baseline``, in a child process."""
    root = Path(__file__).resolve().parents[1]
    package = work / "baseline-package"
    package.mkdir(exist_ok=True)
    archive = subprocess.run(
        ["git", "archive", args.baseline, "bertknn_search"], cwd=root, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(package)], input=archive.stdout, check=True)
    out = work / "baseline.json"
    argv = [sys.executable, __file__, "--work", str(work), "--label", "baseline", "--out", str(out)]
    sizes = args.baseline_articles or args.articles
    argv += ["--articles", *map(str, sizes), "--questions", str(args.questions)]
    argv += ["--batch-articles", str(args.batch_articles), "--seed", str(args.seed)]
    subprocess.run(argv, env={**os.environ, "BENCH_SCALE_PACKAGE": str(package)}, check=True)
    return json.loads(out.read_text())["sizes"]


# -- sentence splitters and the XML path --------------------------------------------------------------
def splitters() -> dict[str, Any]:
    import blingfire
    import pysbd
    import sentencex

    from bertknn_search.eval.evidence import evidence_articles

    segmenter = pysbd.Segmenter(language="en", clean=False)
    split = {
        "pysbd": lambda p: segmenter.segment(p),
        "sentencex": lambda p: sentencex.segment("en", p),
        "blingfire": lambda p: blingfire.text_to_sentences(p).split("\n"),
    }
    corpora = {
        "enwiki fragment": list(read_articles(ENWIKI)),
        "LAMA T-REx evidence": evidence_articles([SHARED / "lama" / "TREx"]),
    }
    out: dict[str, Any] = {}
    for name, arts in corpora.items():
        paragraphs = [p for a in arts for p in a.text.splitlines() if p.strip()][:20_000]
        chars = sum(map(len, paragraphs))
        bounds: dict[str, list[set[int]]] = {}
        row: dict[str, Any] = {"paragraphs": len(paragraphs), "characters": chars}
        for splitter, fn in split.items():
            t0 = time.perf_counter()
            pieces = [[s.strip() for s in fn(p) if s.strip()] for p in paragraphs]
            seconds = time.perf_counter() - t0
            bounds[splitter] = [_boundaries(ps) for ps in pieces]
            row[splitter] = {"sentences": sum(map(len, pieces)), "chars_per_s": chars / seconds}
        for splitter in ("sentencex", "blingfire"):
            pairs = list(zip(bounds["pysbd"], bounds[splitter]))
            row[splitter]["boundaries_shared_with_pysbd"] = sum(len(a & b) for a, b in pairs)
            row[splitter]["only_pysbd"] = sum(len(a - b) for a, b in pairs)
            row[splitter]["only_this"] = sum(len(b - a) for a, b in pairs)
        out[name] = row
    return out


def _boundaries(sentences: list[str]) -> set[int]:
    """Sentence ends as offsets into the paragraph's non-space characters (whitespace-insensitive)."""
    ends, at = set(), 0
    for s in sentences[:-1]:
        at += len("".join(s.split()))
        ends.add(at)
    return ends


def xml_path(processes: int) -> dict[str, Any]:
    import bz2
    import xml.etree.ElementTree as ET

    from bertknn_search.ingest.wikitext import wikitext_to_text

    with bz2.open(ENWIKI) as f:
        pages = [el.text or "" for _, el in ET.iterparse(f) if el.tag.endswith("}text")]
    chars = sum(map(len, pages))
    t0 = time.perf_counter()
    clean = sum(len(wikitext_to_text(p)) for p in pages)
    one = time.perf_counter() - t0
    t0 = time.perf_counter()
    with Pool(processes) as pool:
        pool.map(wikitext_to_text, sorted(pages, key=len, reverse=True), chunksize=1)
    many = time.perf_counter() - t0
    return {
        "pages": len(pages),
        "wikitext_chars": chars,
        "clean_chars": clean,
        "one_core": {"wikitext_chars_per_s": chars / one, "clean_chars_per_s": clean / one},
        f"{processes}_processes": {"wikitext_chars_per_s": chars / many, "clean_chars_per_s": clean / many},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--articles", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--questions", type=int, default=300)
    parser.add_argument(
        "--batch-articles", type=int, default=64, help="articles a write (ingest's chunk: 64)"
    )
    parser.add_argument("--baseline", help="git ref whose bertknn_search to run as well, on the same corpus")
    parser.add_argument(
        "--baseline-articles", type=int, nargs="*", help="sizes for the baseline (default: all)"
    )
    parser.add_argument("--splitters", action="store_true")
    parser.add_argument("--xml", action="store_true")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1, help="for --xml")
    parser.add_argument(
        "--prep-processes", type=int, default=1, help="worker processes preparing text for the writer"
    )
    parser.add_argument("--work", type=Path, help="corpora and indexes (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the indexes")
    parser.add_argument("--label", default="this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "batch_articles": args.batch_articles,
        "prep_processes": args.prep_processes,
    }
    if args.prep_processes > 1:
        # The writer takes the IR terms the workers made instead of making them again.
        from bertknn_search.backends import embedded

        embedded.field_texts = lambda title, text: _PRECOMPUTED[(title, text)]
    if args.splitters:
        results["splitters"] = splitters()
    if args.xml:
        results["xml"] = xml_path(args.processes)
    if args.articles and not (args.splitters or args.xml):
        work = args.work or Path(tempfile.mkdtemp(prefix="bench-scale-"))
        work.mkdir(parents=True, exist_ok=True)
        results["sizes"] = run_sizes(args, work)
        if args.baseline:
            results["baseline"] = {"ref": args.baseline, "sizes": baseline(args, work)}
    print(json.dumps(results, indent=2))
    write_results(args.out, results)


if __name__ == "__main__":
    main()
