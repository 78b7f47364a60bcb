"""Peers: the project against Lucene (IR latency, store size) and WikiExtractor (the XML text pass).

Three parts, each on its own flag (none given: all three), each measured on the same inputs in one run:

- ``--ir``: free questions against a Wikipedia-shaped corpus (``bench_scale``'s generator and questions),
  top 3, warm (``--warm`` passes first: the JVM needs many): ``retrieve`` on the embedded index against
  Lucene's BM25 (k1 1.2, b 0.75) over the same terms, in rounds that alternate the two. Lucene indexes
  the project's own terms (``terms.py``: unigrams and stopword-collapsed bigrams, as
  ``article_index.field_texts`` writes them) through a whitespace analyzer, and its queries are the
  project's ``query_terms``, so both rank the same strings. Lucene's time is measured in its JVM (query
  building, the search, reading the hits' stored ids); ours is ``retrieve`` from the question's text,
  in this process (no JVM in it); both in wall-clock and in thread-CPU time. Agreement: the share of
  questions with the same top article, and the mean overlap of the two top 3s.
- ``--store``: bytes of our index (tantivy; SQLite with the article text) against Lucene's index with
  the title and text stored (compressed, Lucene's default codec).
- ``--xml``: the real enwiki fragment's pages repeated (new titles and ids) to ``--xml-mb`` MB of XML,
  then ``ingest wiki --contexts lazy`` at ``--workers`` 1 and 2 against WikiExtractor (``--no-templates``,
  text only) at 1 and 2 processes: MB of XML a second, wall clock of each command.

Lucene runs from the anserini fat jar that pyserini's wheel ships (pyserini 0.24.0 holds Lucene 9.9.1)
through ``peers/LuceneBench.java``, compiled here with the JDK's ``javac``; WikiExtractor is the
``wikiextractor`` package, run as a subprocess. Neither is a dependency: a part whose tool is missing
says so in one line and is skipped.

    pip download --no-deps pyserini==0.24.0 -d /tmp/bertknn-peers/dl
    unzip -j /tmp/bertknn-peers/dl/pyserini-0.24.0-py3-none-any.whl '*fatjar.jar' -d /tmp/bertknn-peers/dl
    pip install wikiextractor==3.1.0
    python benchmarks/bench_peers.py --articles 100000 --out benchmarks/results/peers-cpu.json
    python benchmarks/bench_peers.py --xml --xml-mb 20          # a quick text-pass comparison
"""

from __future__ import annotations

import argparse
import bz2
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np
import tantivy
from bench_scale import ENWIKI, questions, text_only_ingest, write_corpus
from common import LAYER, build_model, dir_bytes, load_average, percentiles, write_results

from bertknn_search.backends.embedded.article_index import FIRST_FETCH, SHOULD, field_texts
from bertknn_search.backends.embedded.backend import EmbeddedBackend
from bertknn_search.backends.embedded.pruning import split_query
from bertknn_search.ingest.pipeline import TEXT_CHUNK_ARTICLES
from bertknn_search.ingest.prepare import default_workers
from bertknn_search.ingest.readers import read_articles
from bertknn_search.query.retrieve import ir_query, retrieve
from bertknn_search.records import Question
from bertknn_search.terms import query_terms

HERE = Path(__file__).resolve().parent
JAVA_SOURCE = HERE / "peers" / "LuceneBench.java"
TOP = 3
STORED_FIELDS = (".fdt", ".fdx", ".fdm")  # Lucene's stored-fields files (the compressed text)


# -- the tools -----------------------------------------------------------------------------------------
def find_jar(given: Path | None, work: Path) -> Path | None:
    """The anserini fat jar: ``--jar``, else one under ``work`` or in an installed pyserini."""
    if given is not None:
        return given if given.is_file() else None
    places = [work]
    spec = importlib.util.find_spec("pyserini")
    if spec is not None and spec.submodule_search_locations:
        places += [Path(p) / "resources" / "jars" for p in spec.submodule_search_locations]
    for place in places:
        jars = sorted(place.rglob("anserini-*-fatjar.jar")) if place.is_dir() else []
        if jars:
            return jars[-1]
    return None


def lucene_classpath(args: argparse.Namespace) -> str | None:
    """Compile ``LuceneBench.java`` against the jar; None (and why, on one line) when it cannot run."""
    jar = find_jar(args.jar, args.work)
    missing = [tool for tool in ("java", "javac") if shutil.which(tool) is None]
    if missing:
        print(f"skipping Lucene: {' and '.join(missing)} not found (install a JDK 11+)", file=sys.stderr)
        return None
    if jar is None:
        print(
            "skipping Lucene: no anserini fat jar (pip download --no-deps pyserini==0.24.0 and unzip its"
            " *fatjar.jar under --work, or give --jar)",
            file=sys.stderr,
        )
        return None
    classes = args.work / "lucene-classes"
    classes.mkdir(parents=True, exist_ok=True)
    subprocess.run(["javac", "-d", str(classes), "-cp", str(jar), str(JAVA_SOURCE)], check=True)
    return f"{jar}{os.pathsep}{classes}"


def lucene_version(classpath: str) -> str:
    command = ["java", "-cp", classpath, "LuceneBench", "version"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def wikiextractor_ready() -> bool:
    if importlib.util.find_spec("wikiextractor") is None:
        print("skipping WikiExtractor: not installed (pip install wikiextractor==3.1.0)", file=sys.stderr)
        return False
    return True


# -- the corpus and the two indexes --------------------------------------------------------------------
def our_index(args: argparse.Namespace) -> tuple[Path, Path, dict[str, Any]]:
    """The corpus and our lazy index of it (built by ``ingest``, or kept from an earlier run)."""
    n = args.articles
    corpus = args.work / f"corpus-{n}.jsonl"
    if not corpus.exists():
        write_corpus(n, corpus, args.seed)
    index = args.work / f"index-{n}"
    built: dict[str, Any] = {"reused": True}
    if args.rebuild or not (index / "index.sqlite").exists():
        shutil.rmtree(index, ignore_errors=True)
        built = text_only_ingest(corpus, index, build_model("tiny"), default_workers(), TEXT_CHUNK_ARTICLES)
    return corpus, index, built


def _doc_line(line: str) -> str:
    record = json.loads(line)
    unigrams, bigrams = field_texts(record["title"], record["text"])
    fields = (record["id"], _escape(record["title"]), _escape(record["text"]), unigrams, bigrams)
    return "\t".join(fields) + "\n"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\n")


def lucene_index(args: argparse.Namespace, corpus: Path, classpath: str) -> tuple[Path, dict[str, Any]]:
    """Lucene's index of the same articles and terms (built once; ``--rebuild`` builds it again)."""
    index = args.work / f"lucene-{args.articles}"
    info = args.work / f"lucene-{args.articles}.json"
    if not args.rebuild and info.exists() and index.is_dir():
        return index, {**json.loads(info.read_text()), "reused": True}
    docs = args.work / f"lucene-docs-{args.articles}.tsv"
    t0 = time.perf_counter()
    with corpus.open(encoding="utf-8") as lines, docs.open("w", encoding="utf-8") as out, Pool() as pool:
        out.writelines(pool.imap(_doc_line, lines, chunksize=64))
    terms_s = time.perf_counter() - t0
    shutil.rmtree(index, ignore_errors=True)
    t0 = time.perf_counter()
    done = subprocess.run(
        ["java", "-cp", classpath, "LuceneBench", "index", str(index), str(docs)],
        check=True,
        capture_output=True,
        text=True,
    )
    count, segments = done.stdout.split()
    built = {"terms_s": terms_s, "index_s": time.perf_counter() - t0, "docs": int(count)}
    built["segments"] = int(segments)
    info.write_text(json.dumps(built))
    docs.unlink()
    return index, built


# -- IR latency --------------------------------------------------------------------------------------
Timed = tuple[list[float], list[float], list[list[str]]]  # wall-clock s, thread-CPU s, top ids


def ours(index: Path, texts: list[str], warm: int) -> tuple[Timed, list[float]]:
    """``retrieve`` per question, then, in a pass of its own, tantivy's search alone for each: the
    engine's share of a question, the rest being what the project adds around it. (Right after the
    same question's ``retrieve`` the search would find its postings in the CPU's caches.)"""
    backend = EmbeddedBackend.open(index)
    try:
        engine = _engine_queries(backend, texts)
        for _ in range(warm):
            for text in texts:
                retrieve(backend, Question(text), TOP)
        seconds, cpu, ids = [], [], []
        for text in texts:
            c0 = time.thread_time()
            t0 = time.perf_counter()
            hits = retrieve(backend, Question(text), TOP)
            seconds.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            ids.append([h.id for h in hits])
        alone = []
        for search in engine:
            t0 = time.perf_counter()
            search()
            alone.append(time.perf_counter() - t0)
        return (seconds, cpu, ids), alone
    finally:
        backend.close()


def _engine_queries(backend: EmbeddedBackend, texts: list[str]) -> list[Callable[[], object]]:
    """Each question's first tantivy search as ``ArticleIndex.search`` makes it (the pruned query where
    there is one, else the whole disjunction), ready to run."""
    ir = backend._ir
    searcher = ir.searcher(None)
    total = ir._total_docs(searcher)
    out: list[Callable[[], object]] = []
    for text in texts:
        unigrams, bigrams = query_terms(ir_query(Question(text)))
        terms = [("unigrams", t) for t in unigrams] + [("bigrams", t) for t in bigrams]
        split = None if total is None else split_query(searcher, terms, ir._term, total)
        query = split.query if split else tantivy.Query.boolean_query([(SHOULD, ir._term(*t)) for t in terms])
        out.append(lambda q=query: searcher.search(q, TOP + FIRST_FETCH, count=False))
    return out


def lucene(index: Path, texts: list[str], warm: int, classpath: str, work: Path) -> Timed:
    queries, out = work / "lucene-queries.tsv", work / "lucene-results.tsv"
    with queries.open("w", encoding="utf-8") as f:
        for text in texts:
            unigrams, bigrams = query_terms(ir_query(Question(text)))
            f.write(f"{' '.join(unigrams)}\t{' '.join(bigrams)}\n")
    command = ["java", "-cp", classpath, "LuceneBench", "search", str(index), str(queries), str(TOP)]
    subprocess.run([*command, str(warm), str(out)], check=True)
    rows = [line.rstrip("\n").split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    return [int(r[0]) / 1e9 for r in rows], [int(r[1]) / 1e9 for r in rows], [r[2].split() for r in rows]


def agreement(a: list[list[str]], b: list[list[str]]) -> dict[str, float]:
    """Share of questions with the same top article, and mean overlap of the two top-k lists."""
    pairs = [(x, y) for x, y in zip(a, b) if x or y]
    same = sum(bool(x and y and x[0] == y[0]) for x, y in pairs)
    overlap = [len(set(x) & set(y)) / max(len(x), len(y)) for x, y in pairs]
    return {"questions": len(pairs), "same_top1": same / len(pairs), "top3_overlap": float(np.mean(overlap))}


def ir_part(args: argparse.Namespace, index: Path, lucene_dir: Path | None, classpath: str | None) -> dict:
    corpus = args.work / f"corpus-{args.articles}.jsonl"
    texts = [text for text, _ in questions(corpus, args.questions, args.seed)]
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):  # alternated, so that a change in load hits both
        row: dict[str, Any] = {"load_average": load_average()}
        (seconds, cpu, mine), alone = ours(index, texts, args.warm)
        row["ours"], row["ours_cpu"] = percentiles(seconds), percentiles(cpu)
        row["ours_tantivy_search_alone"] = percentiles(alone)
        if lucene_dir is not None and classpath is not None:
            seconds, cpu, theirs = lucene(lucene_dir, texts, args.warm, classpath, args.work)
            row["lucene"], row["lucene_cpu"] = percentiles(seconds), percentiles(cpu)
            row["agreement"] = agreement(mine, theirs)
            for clock in ("", "_cpu"):
                for p in ("p50", "p95"):
                    row[f"ratio{clock}_{p}"] = (
                        row[f"ours{clock}"][f"{p}_ms"] / row[f"lucene{clock}"][f"{p}_ms"]
                    )
        rounds.append(row)
        print(f"IR round {r + 1}: {json.dumps(row)}", file=sys.stderr)
    out: dict[str, Any] = {"questions": len(texts), "top": TOP, "warm_passes": args.warm, "rounds": rounds}
    for key in [k for k in rounds[0] if k.startswith("ratio")]:
        out[f"median_{key}"] = float(np.median([row[key] for row in rounds]))
    return out


# -- store size --------------------------------------------------------------------------------------
def store_part(index: Path, lucene_dir: Path | None) -> dict[str, Any]:
    tantivy = index / "articles.tantivy"
    sqlite = sum(p.stat().st_size for p in index.glob("index.sqlite*"))
    ours = {"total": dir_bytes(index), "tantivy": dir_bytes(tantivy), "sqlite": sqlite}
    out: dict[str, Any] = {"ours": ours, "tantivy_files": _by_suffix(tantivy)}
    if lucene_dir is not None:
        files = _by_suffix(lucene_dir)
        stored = sum(files.get(suffix, 0) for suffix in STORED_FIELDS)
        total = sum(files.values())
        out["lucene"] = {"total": total, "stored_fields": stored, "postings_and_rest": total - stored}
        out["lucene_files"] = files
        out["ratio_total"] = ours["total"] / total
    return out


def _by_suffix(folder: Path) -> dict[str, int]:
    """Bytes by file kind (a segment file's suffix), largest first."""
    sizes: dict[str, int] = {}
    for p in folder.iterdir():
        if p.is_file():
            sizes[p.suffix or p.name] = sizes.get(p.suffix or p.name, 0) + p.stat().st_size
    return dict(sorted(sizes.items(), key=lambda kv: -kv[1]))


# -- the XML text pass -------------------------------------------------------------------------------
def repeated_dump(work: Path, megabytes: float) -> Path:
    """The enwiki fragment's pages repeated, with new titles and ids, to about ``megabytes`` MB."""
    path = work / f"enwiki-repeated-{megabytes:g}mb.xml"
    if path.exists():
        return path
    with bz2.open(ENWIKI, "rt", encoding="utf-8") as f:
        xml = f.read()
    head, rest = xml.split("<page>", 1)
    body, _, tail = ("<page>" + rest).rpartition("</page>")
    body += "</page>"
    target, copy = megabytes * 1e6, 0
    with path.open("w", encoding="utf-8") as out:
        out.write(head)
        written = len(head.encode())
        while written < target:
            page = re.sub(r"<title>(.*?)</title>", rf"<title>\1 (copy {copy})</title>", body)
            shift = copy * 10_000_000
            page = re.sub(r"<id>(\d+)</id>", lambda m, s=shift: f"<id>{int(m[1]) + s}</id>", page)
            out.write(page)
            written += len(page.encode())
            copy += 1
        out.write(tail)
    return path


def timed_run(command: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def xml_part(args: argparse.Namespace) -> dict[str, Any]:
    dump = repeated_dump(args.work, args.xml_mb)
    mb = dump.stat().st_size / 1e6
    model = build_model("tiny")  # a lazy ingest loads it once and never runs it
    peer = wikiextractor_ready()
    out: dict[str, Any] = {"xml_mb": mb, "load_average_before": load_average()}
    for workers in (1, 2):
        with tempfile.TemporaryDirectory(dir=args.work) as scratch:
            ingest = [sys.executable, "-m", "bertknn_search", "ingest", "wiki", str(dump), "--contexts=lazy"]
            ingest += [f"--workers={workers}", f"--index={scratch}/index", f"--model={model}"]
            ingest += [f"--layer={LAYER}", "--device=cpu", "--no-progress"]
            seconds = timed_run(ingest)
            row: dict[str, Any] = {"ours_s": seconds, "ours_mb_per_s": mb / seconds}
        if peer:
            with tempfile.TemporaryDirectory(dir=args.work) as scratch:
                extract = [sys.executable, "-m", "wikiextractor.WikiExtractor", str(dump), "--no-templates"]
                extract += ["--processes", str(workers), "-q", "-o", f"{scratch}/text"]
                seconds = timed_run(extract)
            row |= {"wikiextractor_s": seconds, "wikiextractor_mb_per_s": mb / seconds}
            row["ratio"] = row["ours_mb_per_s"] / row["wikiextractor_mb_per_s"]
        row["load_average"] = load_average()
        out[f"{workers}_workers"] = row
        print(f"XML, {workers} worker(s): {json.dumps(row)}", file=sys.stderr)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ir", action="store_true", help="IR latency and agreement against Lucene")
    parser.add_argument("--store", action="store_true", help="index bytes against Lucene's")
    parser.add_argument("--xml", action="store_true", help="the XML text pass against WikiExtractor")
    parser.add_argument("--articles", type=int, default=100_000, help="generated articles (--ir, --store)")
    parser.add_argument("--questions", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3, help="IR rounds, ours then Lucene in each")
    parser.add_argument(
        "--warm",
        type=int,
        default=50,
        help="untimed passes over the questions first: the JVM's JIT needs ~50 to reach Lucene's steady"
        " state (its p50 falls 0.6-0.7 -> 0.36-0.38 ms from 3 passes to 50; ours does not change)",
    )
    parser.add_argument("--xml-mb", type=float, default=200.0, help="size of the repeated XML dump")
    parser.add_argument("--jar", type=Path, help="the anserini fat jar (default: found under --work)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bertknn-peers")
    parser.add_argument("--rebuild", action="store_true", help="build the corpus's indexes again")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not (args.ir or args.store or args.xml):
        args.ir = args.store = args.xml = True
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    if args.out is not None and args.out.exists():  # a run of some parts keeps the others' results
        results = json.loads(args.out.read_text(encoding="utf-8"))
    results |= {"cpu_count": os.cpu_count(), "load_average": load_average()}
    if args.ir or args.store:
        classpath = lucene_classpath(args)
        corpus, index, results["our_build"] = our_index(args)
        results["articles"] = args.articles
        results["text_mb"] = sum(len(a.text) for a in read_articles(corpus)) / 1e6
        lucene_dir = None
        if classpath is not None:
            results["lucene_version"] = lucene_version(classpath)
            lucene_dir, results["lucene_build"] = lucene_index(args, corpus, classpath)
        if args.store:
            results["store"] = store_part(index, lucene_dir)
        if args.ir:
            results["ir"] = ir_part(args, index, lucene_dir, classpath)
    if args.xml:
        results["xml"] = xml_part(args)
    results["load_average_after"] = load_average()
    print(json.dumps(results, indent=2))
    write_results(args.out, results)


if __name__ == "__main__":
    main()
