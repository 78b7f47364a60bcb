"""Text store: what zstd (per article, with a trained dictionary) saves, and what reading costs.

Each part compares the store as version 4 wrote it (``plain``: every text and sentence list a TEXT row,
reproduced here by turning the codec off) with this version's (``zstd``), on the same inputs in the
same run, timings interleaved:

- **codecs**: zstd levels 1/3/9/19, without and with a 110 KB dictionary trained on the other half of
  the corpus: stored/raw bytes, compression and decompression microseconds an article. On real
  Wikipedia text dealt into Wikipedia's article lengths (``bench_lazy.wikipedia_shaped``), on the
  fragment's own (long) articles, and on the generated Wikipedia-shaped corpus of ``bench_scale``.
- **store**: a text-only (lazy) ``ingest`` of each corpus, plain and zstd: bytes of the text column, of
  the SQLite file, of tantivy and of the whole index.
- **reads**: ``unencoded`` of one article (the text a lazy encode starts from) on both indexes, then
  cold questions (each one's article never encoded: IR, the text read, split, encode, store, kNN) and
  the same questions warm (kNN, evidence sentences read back) with the tiny model, whose encode is
  fastest, so that reading and writing text weigh the most they can.

    python benchmarks/bench_text.py --articles 20000 --out benchmarks/results/text-store-cpu.json
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import zstandard
from bench_lazy import FRAGMENT, wikipedia_shaped
from bench_query import make_questions
from bench_scale import WikiShapedCorpus, text_only_ingest, write_corpus
from common import LAYER, Progress, argument_parser, build_model, dir_bytes, environment, run_benchmark

from bertknn_search.backends.embedded import backend as embedded
from bertknn_search.backends.embedded import text_codec
from bertknn_search.backends.embedded.backend import EmbeddedBackend
from bertknn_search.config import Config
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.readers import read_articles
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question

LEVELS = (1, 3, 9, 19)
REAL_ARTICLES = 700  # the fragment's sentences fill about this many articles before they repeat


@contextmanager
def plain_rows() -> Iterator[None]:
    """Store texts as version 4 did: TEXT rows, no dictionary."""
    pack, train = text_codec.TextCodec.pack, embedded.train
    text_codec.TextCodec.pack = lambda self, text: text  # type: ignore[method-assign]
    embedded.train = lambda texts: None  # type: ignore[assignment]
    try:
        yield
    finally:
        text_codec.TextCodec.pack, embedded.train = pack, train  # type: ignore[method-assign]


def codecs(texts: list[str]) -> dict[str, Any]:
    """Each level without and with a dictionary trained on the other half: ratio and microseconds."""
    raw = [t.encode("utf-8") for t in texts]
    train, test = raw[::2], raw[1::2]
    total = sum(map(len, test))
    dictionary = zstandard.ZstdCompressionDict(
        zstandard.train_dictionary(text_codec.DICTIONARY_BYTES, train).as_bytes()
    )
    out: dict[str, Any] = {"articles": len(test), "bytes_per_article": total / len(test)}
    for level in LEVELS:
        for name, d in (("plain", None), ("dictionary", dictionary)):
            c = zstandard.ZstdCompressor(level=level, dict_data=d, write_checksum=True)
            dc = zstandard.ZstdDecompressor(dict_data=d)
            started = time.perf_counter()
            packed = [c.compress(b) for b in test]
            compress = time.perf_counter() - started
            best = float("inf")
            for _ in range(3):
                started = time.perf_counter()
                for p in packed:
                    dc.decompress(p)
                best = min(best, time.perf_counter() - started)
            out[f"level {level} {name}"] = {
                "ratio": sum(map(len, packed)) / total,
                "compress_us": compress / len(test) * 1e6,
                "decompress_us": best / len(test) * 1e6,
            }
    return out


def store_bytes(index: Path) -> dict[str, Any]:
    db = index / "index.sqlite"
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        texts, raw_rows = conn.execute(
            "SELECT SUM(length(CAST(text AS BLOB))), SUM(typeof(text) = 'text') FROM texts"
        ).fetchone()
        dictionary = conn.execute("SELECT length(value) FROM meta WHERE key = 'text_dictionary'").fetchone()
    return {
        "texts": texts,
        "plain_rows": raw_rows,
        "dictionary": dictionary[0] if dictionary else 0,
        "sqlite": sum(p.stat().st_size for p in index.iterdir() if p.name.startswith("index.sqlite")),
        "tantivy": dir_bytes(index / "articles.tantivy"),
        "total": dir_bytes(index),
    }


def read_seconds(indexes: dict[str, Path], ids: list[str], rounds: int) -> dict[str, list[float]]:
    """Seconds to read one article's text, per read, the stores taking turns."""
    backends = {name: EmbeddedBackend.open(path) for name, path in indexes.items()}
    out: dict[str, list[float]] = {name: [] for name in backends}
    try:
        for _ in range(rounds):
            for aid in ids:
                for name, b in backends.items():
                    started = time.perf_counter()
                    b.unencoded([aid])
                    out[name].append(time.perf_counter() - started)
    finally:
        for b in backends.values():
            b.close()
    return out


def question_seconds(
    configs: dict[str, Config], questions: list[Question]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds of each question on each index, in turn: cold (each question's article is new to both
    indexes), then warm (asked again: its contexts stored, its evidence sentences read back)."""
    searchers = {name: Searcher.open(c) for name, c in configs.items()}
    cold: dict[str, list[float]] = {name: [] for name in searchers}
    warm: dict[str, list[float]] = {name: [] for name in searchers}
    try:
        for s in searchers.values():
            s.answer(Question("[MASK] zzzunseen qqqunknown.", None))  # model load, first allocations
        for into in (cold, warm):
            for q in questions:
                for name, s in searchers.items():
                    started = time.perf_counter()
                    s.answer(q)
                    into[name].append(time.perf_counter() - started)
    finally:
        for s in searchers.values():
            s.close()
    return cold, warm


def ratio_of_medians(times: dict[str, list[float]]) -> float:
    return statistics.median(times["zstd"]) / statistics.median(times["plain"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"benchmark": "text store", "env": environment("cpu")}
    progress = Progress(args.out, results)
    real = wikipedia_shaped(FRAGMENT, REAL_ARTICLES, args.seed)
    whole = list(read_articles(FRAGMENT))
    generated = list(WikiShapedCorpus(args.seed).articles(min(args.articles, 6_000)))
    for name, texts in (
        ("real", [a.text for a in real]),
        ("fragment", [a.text for a in whole]),
        ("generated", [a.text for a in generated]),
    ):
        table = codecs(texts)
        progress.done(
            f"codecs, {name}", f"level 3: {table['level 3 dictionary']}", **{f"codecs_{name}": table}
        )
    model = build_model("tiny")
    with tempfile.TemporaryDirectory(prefix="bench-text-", dir=args.tmp) as tmp:
        work = Path(tmp)
        corpus = work / "generated.jsonl"
        write_corpus(args.articles, corpus, args.seed)
        base = Config(model=str(model), layer=LAYER, device="cpu", contexts="lazy")
        indexes: dict[str, dict[str, Path]] = {}
        for name in ("plain", "zstd"):
            for source, what in (("real", real), ("fragment", FRAGMENT), ("generated", corpus)):
                index = work / f"{source}-{name}"
                with plain_rows() if name == "plain" else _nothing():
                    started = time.perf_counter()
                    if source == "generated":
                        text_only_ingest(corpus, index, model, workers=0, batch=16_000)
                    else:
                        ingest(what, base.replace(index=index), progress=False)
                    seconds = time.perf_counter() - started
                indexes.setdefault(source, {})[name] = index
                sizes = store_bytes(index)
                results.setdefault("store", {}).setdefault(source, {})[name] = {**sizes, "ingest_s": seconds}
                progress.done(f"store, {source}, {name}", f"{sizes}")
        for source in ("real", "fragment", "generated"):
            s = results["store"][source]
            s["texts_ratio"] = s["zstd"]["texts"] / s["plain"]["texts"]
            s["sqlite_ratio"] = s["zstd"]["sqlite"] / s["plain"]["sqlite"]
            s["total_ratio"] = s["zstd"]["total"] / s["plain"]["total"]
        rng = np.random.default_rng(args.seed)
        ids = [str(i) for i in rng.choice(args.articles, size=min(args.reads, args.articles), replace=False)]
        reads = read_seconds(indexes["generated"], ids, rounds=3)
        results["reads"] = {name: _us(t) for name, t in reads.items()} | {"ratio": ratio_of_medians(reads)}
        progress.done("reads", f"{results['reads']}")
        askable = [a for a in real if len(split_sentences(a.text)) >= 3]  # make_questions cuts from 1-2
        pairs = list({s: (t, s) for t, s in make_questions(askable, 4 * args.cold, args.seed)}.values())
        questions = [Question(t, s) for t, s in pairs[: args.cold]]
        configs = {name: base.replace(index=indexes["real"][name]) for name in ("plain", "zstd")}
        cold, warm = question_seconds(configs, questions)
        for part, times in (("cold", cold), ("warm", warm)):
            results[part] = {name: _us(t) for name, t in times.items()} | {"ratio": ratio_of_medians(times)}
        progress.done("questions", f"cold {results['cold']}, warm {results['warm']}")
    progress.finish()
    return results


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _us(seconds: list[float]) -> dict[str, float]:
    us = np.asarray(seconds) * 1e6
    return {"n": len(seconds), "p50_us": float(np.median(us)), "mean_us": float(us.mean())}


def report(r: dict[str, Any]) -> str:
    lines = [f"load average at the end: {r['phases'][-1]['load_average']}"]
    for name in ("real", "fragment", "generated"):
        table = r[f"codecs_{name}"]
        lines.append(
            f"codecs, {name} ({table['articles']} articles of {table['bytes_per_article']:,.0f} bytes):"
        )
        for level in LEVELS:
            cells = [
                f"{kind} {v['ratio']:.3f} ({v['compress_us']:.0f} / {v['decompress_us']:.1f} us)"
                for kind in ("plain", "dictionary")
                for v in [table[f"level {level} {kind}"]]
            ]
            lines.append(f"  level {level:2d}: " + ", ".join(cells))
    for source, s in r["store"].items():
        p, z = s["plain"], s["zstd"]
        lines.append(
            f"store, {source}: texts {p['texts'] / 1e6:.1f} -> {z['texts'] / 1e6:.1f} MB"
            f" ({s['texts_ratio']:.3f}), SQLite {p['sqlite'] / 1e6:.1f} -> {z['sqlite'] / 1e6:.1f} MB"
            f" ({s['sqlite_ratio']:.3f}), tantivy {z['tantivy'] / 1e6:.1f} MB, total {p['total'] / 1e6:.1f}"
            f" -> {z['total'] / 1e6:.1f} MB ({s['total_ratio']:.3f});"
            f" ingest {p['ingest_s']:.1f} -> {z['ingest_s']:.1f} s"
        )
    for part in ("reads", "cold", "warm"):
        v = r[part]
        lines.append(
            f"{part}: plain p50 {v['plain']['p50_us']:,.0f} us, zstd p50 {v['zstd']['p50_us']:,.0f} us,"
            f" ratio {v['ratio']:.3f} ({v['plain']['n']} each)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--articles", type=int, default=20_000, help="of the generated corpus")
    parser.add_argument("--reads", type=int, default=2_000, help="articles whose text read is timed")
    parser.add_argument("--cold", type=int, default=40, help="cold questions per store")
    parser.add_argument("--tmp", type=Path, default=None, help="where the indexes go (default: the system's)")
    run_benchmark(parser, run, report)


if __name__ == "__main__":
    main()
