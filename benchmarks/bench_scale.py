"""Scale: text-only ingest rate and IR latency of the embedded backend on Wikipedia-shaped corpora.

Three parts, each on its own flag:

- default: for each ``--articles`` size, a generated corpus (JSONL) is ingested into a lazy index by
  ``ingest`` itself (read, IR terms, SQLite rows with the text, the tantivy article index; a tiny model
  is loaded and never run), once per ``--runs`` setting (text-preparation workers, articles a write and
  tantivy threads a write, so the previous text pass and this one run on the same corpus), then free questions
  (BM25 over the question) and subject questions (the title shortcut) are timed through ``retrieve``.
- ``--splitters``: sentence splitters on the shared enwiki fragment and LAMA's T-REx evidence sentences
  (speed, sentence counts, boundaries that differ from pysbd's). Needs ``pip install pysbd blingfire``.
- ``--stages``: each stage of the text pass alone (reading, preparing on one core, writing with one
  and two tantivy threads), the per-core rates a many-core machine's rate is estimated from.
- ``--xml``: the MediaWiki XML path (mwparserfromhell markup stripping) in characters/s on one core and
  on every core (a process pool over pages).
- ``--xml-stages DUMP``: each stage of preparing an XML dump's articles on one core (reading, markup
  stripping, fingerprints, IR field texts), in MB/s of the dump.
- ``--race DUMP``: ``ingest wiki DUMP --contexts lazy --workers N`` (this checkout and, with
  ``--baseline-cli``, another one's) against WikiExtractor (``--no-templates --processes N``; needs
  ``pip install wikiextractor``, benchmark-only) on the same plain XML, interleaved, wall time in MB/s.
  ``--repeat-dump COPIES OUT`` writes such a dump: the enwiki fragment's pages repeated, each copy with
  its own titles and ids.

The generated corpus has Wikipedia's shape, not its words: article lengths are lognormal with median
250 and mean 500 words (English Wikipedia: about 6.7M articles and 20G characters of clean text, about
3,000 characters an article, most of them stubs), sentences of 10-40 words, 42% stopwords, and content
words drawn Zipf-Mandelbrot (exponent 1) from a 300,000-word vocabulary.

    python benchmarks/bench_scale.py --articles 10000 100000 --out benchmarks/results/scale-cpu.json
    python benchmarks/bench_scale.py --splitters --xml --out benchmarks/results/text-cpu.json
    python benchmarks/bench_scale.py --repeat-dump 34 /tmp/bertknn-xml/big.xml
    python benchmarks/bench_scale.py --race /tmp/bertknn-xml/big.xml --race-workers 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    COMMON_STOPWORDS,
    LAYER,
    build_model,
    dir_bytes,
    percentiles,
    synthetic_words,
    write_results,
)

from bertknn_search.backends.embedded.backend import EmbeddedBackend
from bertknn_search.ingest.pipeline import TEXT_CHUNK_ARTICLES
from bertknn_search.ingest.prepare import default_workers
from bertknn_search.ingest.readers import read_articles
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.query.retrieve import retrieve
from bertknn_search.records import Article, Question
from bertknn_search.stopwords import STOPWORDS

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


def text_only_ingest(corpus: Path, index: Path, model: Path, workers: int, batch: int) -> dict[str, Any]:
    """``ingest`` of the corpus into a new lazy index (the text pass: read, IR index, text store).

    ``batch`` articles a write (the pipeline's text chunk; main's code wrote 64, the chunk it encodes)
    and ``workers`` text-preparation processes (0: on a thread of this process, as main's code did).
    """
    from bertknn_search.config import Config
    from bertknn_search.ingest import pipeline

    config = Config(model=str(model), layer=LAYER, device="cpu", index=index, contexts="lazy")
    pipeline.TEXT_CHUNK_ARTICLES, pipeline.TEXT_CHUNK_CHARS = batch, 3_000 * batch
    started = time.perf_counter()
    summary = pipeline.ingest(corpus, config, progress=False, workers=workers)
    seconds = time.perf_counter() - started
    chars = sum(len(a.text) for a in read_articles(corpus))
    return {
        "workers": workers,
        "batch_articles": batch,
        "articles": summary.articles,
        "text_mb": chars / 1e6,
        "seconds": seconds,
        "mb_per_s": chars / 1e6 / seconds,
        "articles_per_s": summary.articles / seconds,
        "bytes": {"total": dir_bytes(index), "tantivy": dir_bytes(index / "articles.tantivy")},
    }


@contextmanager
def writer_threads(threads: int | None, batch: int) -> Iterator[None]:
    """Give each write ``threads`` tantivy indexing threads (None: what ``article_index`` decides).

    Before writes were sized to make one segment a thread, a write was 4,000 articles and had one thread
    per 1,000 of them up to the cores, with 64 MB of heap each: ``1:4000:2`` on 2 cores.
    """
    from bertknn_search.backends.embedded import article_index

    saved = article_index.DOCS_PER_THREAD, article_index.CORES_PER_THREAD
    if threads is not None:
        article_index.DOCS_PER_THREAD, article_index.CORES_PER_THREAD = max(1, batch // threads), 1
    try:
        yield
    finally:
        article_index.DOCS_PER_THREAD, article_index.CORES_PER_THREAD = saved


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
    model = build_model("tiny")  # a lazy ingest loads the model once and never runs it
    results: dict[str, Any] = {}
    for n in args.articles:
        corpus = work / f"corpus-{n}.jsonl"
        if not corpus.exists():
            write_corpus(n, corpus, args.seed)
        pairs = questions(corpus, args.questions, args.seed)
        for setting in args.runs:
            workers, batch, *threads = (int(v) for v in setting.split(":"))
            if n > args.max_before_articles and (workers, batch) == (0, 64):
                continue  # main's path is measured at the smaller sizes only
            index = work / f"index-{n}-{setting.replace(':', '-')}"
            subprocess.run(["rm", "-rf", str(index)], check=True)
            with writer_threads(threads[0] if threads else None, batch):
                ingest = text_only_ingest(corpus, index, model, workers, batch)
            latency = ir_latency(index, pairs)
            results[f"{n}/{setting}"] = {"ingest": ingest, "ir": latency}
            print(f"{n:,} articles, {setting}: {json.dumps(results[f'{n}/{setting}'])}", file=sys.stderr)
            if not args.keep:
                subprocess.run(["rm", "-rf", str(index)], check=True)
    return results


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


def stage_rates(work: Path, n: int, seed: int) -> dict[str, Any]:
    """Per-core rates of the text pass's stages on ``n`` generated articles, each stage alone.

    read: records from the JSONL file (the reading thread's share); prepare: ``prepare`` of the lazy
    ingest (JSON decoding, checks, fingerprint, IR field texts) and of an eager one (the same plus
    sentence splitting), on one core; write: ``add_articles`` of the lazy ingest's writes with the field
    texts given (what the writer does), tantivy on one and on two indexing threads.
    """
    from bertknn_search.backends.embedded import article_index
    from bertknn_search.ingest.prepare import TextSpec, prepare
    from bertknn_search.ingest.readers import read_records
    from bertknn_search.records import EncodedArticle, IndexMeta

    corpus = work / f"corpus-{n}.jsonl"
    if not corpus.exists():
        write_corpus(n, corpus, seed)
    t0 = time.perf_counter()
    records = list(read_records(corpus))
    read = time.perf_counter() - t0
    out: dict[str, Any] = {"articles": n}
    settings = ("model", "11", "single-wordpiece", "512")
    for name, split in (("prepare_lazy", False), ("prepare_eager", True)):
        t0 = time.perf_counter()
        prepared = prepare(records, TextSpec(settings, split=split, ir_fields=True))
        out[name] = time.perf_counter() - t0
    chars = sum(len(p.article.text) for p in prepared)
    out["text_mb"] = chars / 1e6
    out["read"] = read
    meta = IndexMeta(model="bench", layer=11, dim=64, vocab_size=30522, mask_policy="single-wordpiece")
    python_side = _timed_methods(
        (EmbeddedBackend, "_write_one"), (article_index.ArticleBatch, "add")
    )  # the writer's own Python work (SQLite rows, tantivy documents); the rest is tantivy's threads
    for threads in (1, 2):
        python_side.clear()
        index = work / f"stage-index-{threads}"
        subprocess.run(["rm", "-rf", str(index)], check=True)
        backend = EmbeddedBackend.create(index, meta)
        t0 = time.perf_counter()
        with writer_threads(threads, TEXT_CHUNK_ARTICLES):  # two even on 2 cores: what a write costs then
            for lo in range(0, n, TEXT_CHUNK_ARTICLES):
                batch = prepared[lo : lo + TEXT_CHUNK_ARTICLES]
                items = [EncodedArticle(p.article, None, p.fingerprint) for p in batch]
                backend.add_articles(items, ir_fields={p.article.id: p.ir_fields for p in batch})
        out[f"write_{threads}_threads"] = time.perf_counter() - t0
        out[f"write_{threads}_threads_python"] = sum(python_side.values())
        backend.close()
        subprocess.run(["rm", "-rf", str(index)], check=True)
    out["mb_per_s"] = {k: chars / 1e6 / v for k, v in out.items() if k not in ("articles", "text_mb")}
    return out


def _timed_methods(*methods: tuple[type, str]) -> dict[str, float]:
    """Wrap methods so that the seconds spent in each add up in the returned dict."""
    spent: dict[str, float] = {}
    for cls, name in methods:
        real = getattr(cls, name)

        def timed(*args: Any, _real: Any = real, _key: str = f"{cls.__name__}.{name}", **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _real(*args, **kwargs)
            finally:
                spent[_key] = spent.get(_key, 0.0) + time.perf_counter() - t0

        setattr(cls, name, timed)
    return spent


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


def repeat_dump(copies: int, out: Path) -> None:
    """The enwiki fragment's pages ``copies`` times as plain XML: copy c > 0 as "T (c)", id + c * 10^7."""
    import bz2
    import re

    with bz2.open(ENWIKI) as f:
        dump = f.read().decode("utf-8")
    head, _, rest = dump.partition("  <page>")
    body, _, tail = ("  <page>" + rest).rpartition("</page>")
    pages = re.findall(r"  <page>.*?</page>", body + "</page>", re.S)
    with out.open("w", encoding="utf-8") as f:
        f.write(head)
        for copy in range(copies):
            for page in pages:
                if copy:
                    page = re.sub(r"<title>(.*?)</title>", rf"<title>\1 ({copy})</title>", page, count=1)
                    page = re.sub(
                        r"(</ns>\s*<id>)(\d+)(</id>)",
                        lambda m, c=copy: f"{m[1]}{int(m[2]) + c * 10_000_000}{m[3]}",
                        page,
                        count=1,
                    )
                f.write(page + "\n")
        f.write(tail)


def xml_stages(dump: Path) -> dict[str, Any]:
    """Seconds and MB/s of the dump for each stage of a lazy ingest's text preparation, on one core."""
    from bertknn_search.backends.embedded.article_index import field_texts
    from bertknn_search.ingest.prepare import article_fingerprint
    from bertknn_search.ingest.readers import finish, read_records

    size = dump.stat().st_size
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    records = list(read_records(dump))
    seconds["read (expat)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    articles = [finish(r) for r in records]
    seconds["markup (wikitext_to_text)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for a in articles:
        article_fingerprint(a, ("model", "11", "single-wordpiece", "512"))
    seconds["fingerprint"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for a in articles:
        field_texts(a.title, a.text)
    seconds["ir field texts"] = time.perf_counter() - t0
    prepare = sum(v for k, v in seconds.items() if k != "read (expat)")
    return {
        "dump_mb": size / 1e6,
        "articles": len(articles),
        "text_mb": sum(len(a.text) for a in articles) / 1e6,
        "seconds": seconds,
        "mb_per_s": {k: size / 1e6 / v for k, v in seconds.items()} | {"prepare (all)": size / 1e6 / prepare},
    }


def race(dump: Path, workers: list[int], repeats: int, baseline: str | None, work: Path) -> dict[str, Any]:
    """Wall time of our lazy ingest and of WikiExtractor on ``dump``, interleaved run by run."""
    model = build_model("tiny")  # loaded once per ingest and never run
    size = dump.stat().st_size
    ours = [sys.executable, "-m", "bertknn_search"]
    commands = {"this checkout": ours, **({"baseline": [baseline]} if baseline else {})}
    runs: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for _ in range(repeats):
        for n in workers:
            for name, cli in commands.items():
                out = work / "race-index"
                args = ["ingest", "wiki", str(dump), "--contexts", "lazy", "--workers", str(n)]
                args += ["--model", str(model), "--index", str(out), "--no-progress"]
                wall, used = _timed_run([*cli, *args], out)
                runs.setdefault(f"{name}/{n}", []).append(wall)
                cpu.setdefault(f"{name}/{n}", []).append(used)
            we = [sys.executable, "-m", "wikiextractor.WikiExtractor", "--no-templates", "-q"]
            out = work / "race-wikiextractor"
            we += ["--processes", str(n), "-o", str(out), str(dump)]
            wall, used = _timed_run(we, out)
            runs.setdefault(f"wikiextractor/{n}", []).append(wall)
            cpu.setdefault(f"wikiextractor/{n}", []).append(used)
            print(json.dumps({k: v[-1] for k, v in runs.items()}), file=sys.stderr)
    rates = {k: size / 1e6 / min(v) for k, v in runs.items()}  # each one's best run: the least disturbed
    ratios = {
        k: rates[k] / rates[f"wikiextractor/{k.rpartition('/')[2]}"]
        for k in rates
        if not k.startswith("wikiextractor")
    }
    # CPU seconds of all its processes: on a shared machine the wall time also measures the others' load.
    cpu_rates = {k: size / 1e6 / min(v) for k, v in cpu.items()}
    cpu_ratios = {k: cpu_rates[k] / cpu_rates[f"wikiextractor/{k.rpartition('/')[2]}"] for k in ratios}
    return {
        "dump_mb": size / 1e6,
        "seconds": runs,
        "cpu_seconds": cpu,
        "mb_per_s": rates,
        "vs_wikiextractor": ratios,
        "mb_per_cpu_s": cpu_rates,
        "vs_wikiextractor_per_cpu_s": cpu_ratios,
    }


def _timed_run(command: list[str], out: Path) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user and system, the command's processes all together)."""
    subprocess.run(["rm", "-rf", str(out)], check=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(["rm", "-rf", str(out)], check=True)
    return seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--articles", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--questions", type=int, default=300)
    parser.add_argument(
        "--runs",
        nargs="*",
        default=["1:4000:2", f"{default_workers()}:{TEXT_CHUNK_ARTICLES}"],
        help="WORKERS:BATCH[:THREADS] per ingest, each on its own index of the same corpus: text"
        " preparation processes (0: a thread of the writer's process), articles a write, and tantivy"
        " indexing threads a write (default: what the index decides); 1:4000:2 is the text pass before"
        " large writes, 0:64 the one before that",
    )
    parser.add_argument(
        "--max-before-articles", type=int, default=10_000, help="largest size main's path (0:64) runs at"
    )
    parser.add_argument("--splitters", action="store_true")
    parser.add_argument("--xml", action="store_true")
    parser.add_argument("--stages", action="store_true", help="per-core rates of each text-pass stage")
    parser.add_argument("--stage-articles", type=int, default=32_000)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1, help="for --xml")
    parser.add_argument("--xml-stages", type=Path, metavar="DUMP", help="plain or compressed XML dump")
    parser.add_argument("--race", type=Path, metavar="DUMP", help="plain XML dump (see --repeat-dump)")
    parser.add_argument("--race-workers", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--race-repeats", type=int, default=1)
    parser.add_argument("--baseline-cli", help="another checkout's bertknn-search executable to race too")
    parser.add_argument("--repeat-dump", nargs=2, metavar=("COPIES", "OUT"))
    parser.add_argument("--work", type=Path, help="corpora and indexes (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the indexes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {"cpu_count": os.cpu_count(), "load_average": os.getloadavg()}
    if args.splitters:
        results["splitters"] = splitters()
    if args.stages:
        work = args.work or Path(tempfile.mkdtemp(prefix="bench-scale-"))
        work.mkdir(parents=True, exist_ok=True)
        results["stages"] = stage_rates(work, args.stage_articles, args.seed)
    if args.xml:
        results["xml"] = xml_path(args.processes)
    if args.repeat_dump:
        repeat_dump(int(args.repeat_dump[0]), Path(args.repeat_dump[1]))
        return
    if args.xml_stages:
        results["xml_stages"] = xml_stages(args.xml_stages)
    if args.race:
        work = args.work or Path(tempfile.mkdtemp(prefix="bench-race-"))
        work.mkdir(parents=True, exist_ok=True)
        results["race"] = race(args.race, args.race_workers, args.race_repeats, args.baseline_cli, work)
    special = args.splitters or args.xml or args.stages or args.xml_stages or args.race
    if args.articles and not special:
        work = args.work or Path(tempfile.mkdtemp(prefix="bench-scale-"))
        work.mkdir(parents=True, exist_ok=True)
        results["sizes"] = run_sizes(args, work)
        results["load_average_after"] = os.getloadavg()
    print(json.dumps(results, indent=2))
    write_results(args.out, results)


if __name__ == "__main__":
    main()
