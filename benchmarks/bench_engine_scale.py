"""Scale on the engines: a lazy ingest of N Wikipedia-shaped articles into embedded, one OpenSearch node and
a 3-node OpenSearch cluster, then warm free questions; one run, the same corpus and model.

For each backend in turn, ``ingest()`` of the same generated JSONL corpus with ``contexts="lazy"`` (what
``bertknn-search ingest wiki CORPUS --contexts lazy`` does: text, IR terms, no encoding). Recorded per
backend: wall seconds, articles/s and MB/s of text; disk (embedded: the index folder; engines:
``_stats/store`` of primaries and of every copy, and the nodes' data folders, as the ingest leaves them
and after a ``_flush``); segment counts; each node's JVM heap (``_nodes/stats/jvm`` sampled every second
during the ingest: the largest heap used, the old generation's peak, collections, and the heap used after a
full collection (``jcmd GC.run``) when the node was started here); the JVMs' and this process's CPU.

Then, with every backend up, free questions (no subject: BM25 top 3, then kNN over those articles'
contexts), the backends taking turns question by question: the first ask of each question is **cold**
(its articles' contexts are encoded and written, the lazy path), then ``--rounds`` warm rounds
(``bench_engines.warm_latency``: ``Searcher.answer``, rankings and evidence; HTTP requests counted), and
IR alone (``retrieve``: the BM25 top 3, ``search_articles``) ``--rounds`` times.

Optionally (``--eager-articles``), bytes per context of an eager store at BERT-base's width: a 1-layer
random model of ``--eager-hidden`` dims (768) eagerly ingests that many articles into each backend;
disk after a flush and after a force merge, over the contexts stored. That is what the English Wikipedia
projection of an eager store is scaled from (docs/performance.md).

Shards: the product ships the articles index with one shard (global BM25 statistics) and leaves the
contexts index to the engine's default (one shard; replicas 1, unassigned on one node). On the cluster the
contexts index gets ``--cluster-shards`` shards of 1 replica (as ``tests/test_engine_faults.py`` sets it
up, by the same patch of the shipped mapping); the client is given every node's URL.

Corpus: ``bench_scale``'s generator (lognormal lengths, median 250 and mean 500 words, ~2,900 characters an
article as English Wikipedia; Zipfian words from a 300,000-word vocabulary, so that the term dictionary
grows with the corpus as a real one does: 100,000 articles are 289.5 MB). Model: the tiny model with
bert-base-uncased's vocabulary (``bench_engines.model_for``): a lazy ingest loads it and never runs it.

    python benchmarks/bench_engine_scale.py --articles 5000 --data /tmp/X --out /tmp/X/scale-5k.json
    python benchmarks/bench_engine_scale.py --articles 100000 --port 10010 --cluster-port 10030 \\
        --data /tmp/X --out benchmarks/results/engines-scale-100k.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from bench_engines import bert_vocabulary, drop, engine_admin, model_for
from bench_scale import questions as cut_questions
from bench_scale import write_corpus
from common import Progress, cache_dir, dir_bytes, environment, load_average, percentiles, write_results
from engines_meter import Meter, QueryClock, cpu_seconds, instrumented, warm_latency

from bertknn_search.backends.engines import bodies as engine_bodies
from bertknn_search.config import Config
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.query.retrieve import retrieve
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question

BACKENDS = ("embedded", "opensearch-1", "opensearch-3")
PREFIX = "scale"
# A shard's store size is cached for index.store.stats_refresh_interval (10 s): read sooner after a write,
# a flush or a merge, it is the size before them.
STORE_STATS_S = 11.0
JVM_STATS_S = 1.5
RETENTION_LEASE_S = 35.0


# -- the engines' own numbers ------------------------------------------------------------------------
def get_json(url: str, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url.split(',')[0]}{path}", timeout=30) as response:
        return json.loads(response.read())


def jvm_nodes(url: str) -> dict[str, dict[str, Any]]:
    """Per node name: heap used and max, the old generation's used and peak, GC counts and milliseconds."""
    out = {}
    for node in get_json(url, "/_nodes/stats/jvm")["nodes"].values():
        mem, gc = node["jvm"]["mem"], node["jvm"]["gc"]["collectors"]
        old = mem.get("pools", {}).get("old", {})
        out[node["name"]] = {
            "heap_used": mem["heap_used_in_bytes"],
            "heap_max": mem["heap_max_in_bytes"],
            "old_used": old.get("used_in_bytes"),
            "old_peak": old.get("peak_used_in_bytes"),
            "gc_count": sum(c["collection_count"] for c in gc.values()),
            "gc_ms": sum(c["collection_time_in_millis"] for c in gc.values()),
        }
    return out


class HeapSampler:
    """Samples every node's heap each ``every`` seconds on a thread; the largest per node is kept."""

    def __init__(self, url: str, every: float = 1.0, say_every: float = 60.0) -> None:
        self.url, self.every, self.say_every = url, every, say_every
        self.peak: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.started = time.monotonic()

    def __enter__(self) -> HeapSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        told = time.monotonic()
        while not self._stop.wait(self.every):
            with contextlib.suppress(OSError, ValueError, KeyError):
                for name, node in jvm_nodes(self.url).items():
                    self.peak[name] = max(self.peak.get(name, 0), node["heap_used"])
                self.samples += 1
            if time.monotonic() - told >= self.say_every:  # a heartbeat for long runs, in the log
                told = time.monotonic()
                heap = ", ".join(f"{n} {b / 2**20:.0f} MiB" for n, b in sorted(self.peak.items()))
                print(f"  ... {time.monotonic() - self.started:6.0f} s, heap peaks {heap}", flush=True)


def heap_after_gc(url: str, pids: list[int]) -> dict[str, int] | None:
    """Each node's heap used after a full collection (``jcmd PID GC.run``); None for nodes not ours."""
    if not pids or not shutil.which("jcmd"):
        return None
    for pid in pids:
        subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, timeout=120, check=False)
    time.sleep(JVM_STATS_S)  # a node's JVM stats are cached (monitor.jvm.refresh_interval, 1 s)
    return {name: node["heap_used"] for name, node in jvm_nodes(url).items()}


def engine_disk(config: Config) -> dict[str, Any]:
    """Store bytes and segment counts, primaries and every copy, per index and in all."""
    time.sleep(STORE_STATS_S)
    admin = engine_admin(config)
    try:
        names = admin.names
        stats = admin._call(
            "stats",
            lambda: admin.client.indices.stats(
                index=",".join(names.values()), metric="store,segments,translog"
            ),
        )
    finally:
        admin.close()

    def cut(part: dict[str, Any]) -> dict[str, Any]:
        return {
            "bytes": part["store"]["size_in_bytes"],
            "segments": part["segments"]["count"],
            "translog_bytes": part["translog"]["size_in_bytes"],
        }

    out: dict[str, Any] = {"primaries": cut(stats["_all"]["primaries"]), "total": cut(stats["_all"]["total"])}
    for kind, name in names.items():
        index = stats["indices"].get(name, {})
        if index:
            out[kind] = {"primaries": cut(index["primaries"]), "total": cut(index["total"])}
    return out


def flush(config: Config, merge: bool = False) -> float:
    admin = engine_admin(config)
    started = time.perf_counter()
    try:
        names = ",".join(admin.names.values())
        if merge:
            admin._call("merge", lambda: admin.client.indices.forcemerge(index=names, max_num_segments=1))
        admin._call("flush", lambda: admin.client.indices.flush(index=names))
        # A merge's old segments are counted until a reader on the new ones is opened.
        admin._call("refresh", lambda: admin.client.indices.refresh(index=names))
    finally:
        admin.close()
    return time.perf_counter() - started


def tantivy_segments(index: Path) -> int | None:
    meta = next(index.rglob("meta.json"), None)
    return len(json.loads(meta.read_text())["segments"]) if meta else None


@contextlib.contextmanager
def contexts_shards(shards: int | None) -> Any:
    """New contexts indices made with ``shards`` shards of 1 replica (None: as shipped)."""
    if not shards:
        yield
        return
    shipped = engine_bodies.load_mapping

    def patched(name: str) -> dict[str, Any]:
        body = shipped(name)
        if name.endswith("-contexts"):
            body["settings"]["index"].update(number_of_shards=shards, number_of_replicas=1)
        return body

    engine_bodies.load_mapping = patched
    try:
        yield
    finally:
        engine_bodies.load_mapping = shipped


def writes(meter: Meter) -> dict[str, Any]:
    """Seconds inside the backend's add_articles, the engine's own ``took`` of its bulks, requests by kind."""
    return {
        "add_articles_s": meter.seconds.get("add_articles", 0.0),
        "bulk_took_s": meter.took_ms / 1000.0,
        "calls": meter.as_dict(),
    }


# -- phases ------------------------------------------------------------------------------------------
def lazy_ingest(
    name: str, corpus: Path, config: Config, nodes: Any, args: argparse.Namespace
) -> dict[str, Any]:
    """One backend's lazy ingest of the corpus into a fresh index, with its disk and heap."""
    drop(config)
    pids = [p.pid for p in nodes.procs if p is not None] if nodes else []
    url = config.opensearch_url if config.backend != "embedded" else None
    jvm0 = sum(cpu_seconds(p) for p in pids)
    gc0 = jvm_nodes(url) if url else {}
    cpu0, load0 = time.process_time(), load_average()
    sampler = HeapSampler(url) if url else contextlib.nullcontext()
    meter = Meter()
    with (
        sampler,
        instrumented(meter),
        contexts_shards(args.cluster_shards if name == "opensearch-3" else None),
    ):
        summary = ingest(corpus, config, progress=False)
    row: dict[str, Any] = {
        "articles": summary.articles,
        "seconds": summary.seconds,
        "articles_per_s": summary.articles / summary.seconds,
        **writes(meter),
        "python_cpu_s": time.process_time() - cpu0,
        "jvm_cpu_s": sum(cpu_seconds(p) for p in pids) - jvm0 if pids else None,
        "load_before": load0,
        "load_after": load_average(),
    }
    if url is None:
        row["disk"] = {"bytes": dir_bytes(config.index), "tantivy_segments": tantivy_segments(config.index)}
        return row
    after = jvm_nodes(url)
    row["disk_as_ingested"] = engine_disk(config)
    row["flush_s"] = flush(config)
    row["disk"] = engine_disk(config)
    if nodes:
        row["data_folder_bytes"] = dir_bytes(nodes.data)
    row["heap"] = {
        "sampled_peak": sampler.peak,
        "samples": sampler.samples,
        "old_gen_peak": {n: v["old_peak"] for n, v in after.items()},
        "heap_max": {n: v["heap_max"] for n, v in after.items()},
        "gc_count": {n: v["gc_count"] - gc0.get(n, {}).get("gc_count", 0) for n, v in after.items()},
        "gc_s": {n: (v["gc_ms"] - gc0.get(n, {}).get("gc_ms", 0)) / 1000 for n, v in after.items()},
        "after_full_gc": heap_after_gc(url, pids),
    }
    return row


def eager_bytes(name: str, corpus: Path, config: Config, args: argparse.Namespace) -> dict[str, Any]:
    """Bytes a context of an eager store at ``--eager-hidden`` dims: an eager ingest, flushed, merged."""
    drop(config)
    meter = Meter()
    with instrumented(meter), contexts_shards(args.cluster_shards if name == "opensearch-3" else None):
        summary = ingest(corpus, config, progress=False)
    row: dict[str, Any] = {
        "articles": summary.articles,
        "contexts": summary.contexts,
        "seconds": summary.seconds,
        **writes(meter),
    }
    # The backend's write rate alone: contexts over the seconds inside add_articles (on the writer thread,
    # beside the encoder on these cores, so a lower bound of what the engine takes when it has cores).
    row["contexts_per_add_s"] = summary.contexts / row["add_articles_s"] if row["add_articles_s"] else None
    if config.backend == "embedded":
        row["bytes"] = dir_bytes(config.index)
    else:
        flush(config)
        row["flushed"] = engine_disk(config)
        # A merge drops the _recovery_source copy of the vectors only once the shard's retention lease
        # has moved past the writes (renewed every 30 s): merged sooner, a context keeps it.
        time.sleep(RETENTION_LEASE_S)
        row["merge_flush_s"] = flush(config, merge=True)
        row["merged"] = engine_disk(config)
        row["bytes"] = row["flushed"]["primaries"]["bytes"]
        row["bytes_merged"] = row["merged"]["primaries"]["bytes"]
    row["bytes_per_context"] = row["bytes"] / max(1, summary.contexts)
    row["bytes_per_context_merged"] = row.get("bytes_merged", row["bytes"]) / max(1, summary.contexts)
    drop(config)
    return row


def interleaved_questions(
    searchers: dict[str, Searcher], questions: list[Question], rounds: int
) -> dict[str, Any]:
    """Cold asks (the lazy encode), then warm rounds and IR alone, the backends taking turns."""
    clocks = {name: QueryClock(s) for name, s in searchers.items()}
    cold: dict[str, list[float]] = {n: [] for n in searchers}
    cold_requests: dict[str, list[int]] = {n: [] for n in searchers}
    for q in questions:
        for name, searcher in searchers.items():
            clocks[name].reset()
            started = time.perf_counter()
            searcher.answer(q)
            cold[name].append(time.perf_counter() - started)
            cold_requests[name].append(clocks[name].reset()[1])
    for clock in clocks.values():
        clock.reset()
    ir: dict[str, list[float]] = {n: [] for n in searchers}
    ir_requests: dict[str, list[int]] = {n: [] for n in searchers}
    for _ in range(rounds):
        for q in questions:
            for name, searcher in searchers.items():
                clocks[name].reset()
                started = time.perf_counter()
                retrieve(searcher.backend, q, 3)
                ir[name].append(time.perf_counter() - started)
                ir_requests[name].append(clocks[name].reset()[1])
    # warm_latency wraps the backends again; the counting wrappers above stay under it, harmless.
    warm = warm_latency(searchers, questions, rounds)
    out = {}
    for name in searchers:
        out[name] = {
            "cold": {**percentiles(cold[name]), "requests_per_question": float(np.mean(cold_requests[name]))},
            "warm": warm[name],
            "ir": {**percentiles(ir[name]), "requests_per_question": float(np.mean(ir_requests[name]))},
        }
    base = out.get("embedded")
    if base:
        for row in out.values():
            for kind in ("cold", "warm", "ir"):
                row[kind]["p50_vs_embedded"] = row[kind]["p50_ms"] / base[kind]["p50_ms"]
    return out


# -- the run -----------------------------------------------------------------------------------------
def start_nodes(port: int, nodes: int, data: Path, heap: str) -> Any:
    from bertknn_search.nodes.launch import Cluster, engine

    cluster = Cluster(engine("opensearch"), port=port, nodes=nodes, data=data, heap=heap)
    cluster.start(say=lambda _line: None, progress=False)
    return cluster


def git_state() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[1]

    def git(*words: str) -> str:
        done = subprocess.run(["git", *words], cwd=root, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD"),
        "subject": git("log", "-1", "--format=%s"),
        # The working tree is shared: uncommitted product changes are measured too, so say which.
        "uncommitted_product_files": git(
            "status", "--short", "--", "bertknn_search", "ingest", "mappings"
        ).split("\n"),
        "lazy_landed": Path("/tmp/lazy-landed").exists(),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    backends = [b for b in args.backends.split(",") if b]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        raise SystemExit(f"unknown backend(s) {', '.join(unknown)}: choose from {', '.join(BACKENDS)}")
    args.data.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "benchmark": "engine-scale",
        "env": environment("cpu"),
        "git": git_state(),
        "articles_asked": args.articles,
        "heap": args.heap,
        "cluster_contexts_shards": args.cluster_shards,
    }
    progress = Progress(args.out, results)
    model, layer = model_for("tiny")
    corpus = args.data / f"corpus-{args.articles}-seed{args.seed}.jsonl"
    if not corpus.exists():
        write_corpus(args.articles, corpus, args.seed)
    text_mb = sum(len(json.loads(line)["text"].encode("utf-8")) for line in corpus.open()) / 1e6
    questions = [Question(text) for text, _ in cut_questions(corpus, args.questions, args.seed)]
    progress.done(
        "corpus",
        f"{args.articles:,} articles, {text_mb:.1f} MB of text; {len(questions)} free questions",
        corpus={"path": str(corpus), "articles": args.articles, "text_mb": text_mb},
        questions=len(questions),
        rounds=args.rounds,
    )
    base = Config(model=str(model), layer=layer, device="cpu", contexts="lazy")
    clusters: dict[str, Any] = {}
    configs: dict[str, Config] = {}
    searchers: dict[str, Searcher] = {}
    results["ingest"] = {}
    try:
        for name in backends:
            if name == "embedded":
                configs[name] = base.replace(index=args.data / "embedded")
            else:
                nodes = 1 if name == "opensearch-1" else 3
                url = args.opensearch_url if nodes == 1 else args.cluster_url
                if not url:
                    port = args.port if nodes == 1 else args.cluster_port
                    started = time.perf_counter()
                    clusters[name] = start_nodes(port, nodes, args.data / f"nodes-{port}", args.heap)
                    url = ",".join(clusters[name].node_url(i) for i in range(nodes))
                    progress.done(f"{name} started", f"{url} in {time.perf_counter() - started:.1f} s")
                configs[name] = base.replace(
                    backend="opensearch", opensearch_url=url, opensearch_prefix=args.prefix
                )
            row = lazy_ingest(name, corpus, configs[name], clusters.get(name), args)
            row["mb_per_s"] = text_mb / row["seconds"]
            results["ingest"][name] = row
            progress.done(f"lazy ingest {name}", ingest_line(name, row))
        base_row = results["ingest"].get("embedded")
        if base_row:
            for row in results["ingest"].values():
                row["seconds_vs_embedded"] = row["seconds"] / base_row["seconds"]
                row["bytes_vs_embedded"] = disk_bytes(row) / disk_bytes(base_row)
        for name in backends:
            searchers[name] = Searcher.open(configs[name])
        results["questions"] = interleaved_questions(searchers, questions, args.rounds)
        progress.done("questions", questions_line(results["questions"]))
        for s in searchers.values():
            s.close()
        searchers.clear()
        for name, cluster in clusters.items():
            url = configs[name].opensearch_url
            results["ingest"][name]["heap"]["after_questions"] = {
                n: v["heap_used"] for n, v in jvm_nodes(url).items()
            }
            results["ingest"][name]["heap"]["after_questions_full_gc"] = heap_after_gc(
                url, [p.pid for p in cluster.procs if p is not None]
            )
        if args.eager_articles:
            results["eager"] = eager_phase(args, backends, configs)
            progress.done(
                "eager bytes",
                "; ".join(f"{n} {v['bytes_per_context']:.0f} B/context" for n, v in results["eager"].items()),
            )
        if not args.keep:
            for name in backends:
                drop(configs[name].replace(contexts="lazy"))
    finally:
        for s in searchers.values():
            with contextlib.suppress(Exception):
                s.close()
        for cluster in clusters.values():
            cluster.stop()
    progress.finish()
    return results


def eager_phase(args: argparse.Namespace, backends: list[str], configs: dict[str, Config]) -> dict[str, Any]:
    from bertknn_search.demo import build_tiny_model

    model = cache_dir() / f"wide-{args.eager_hidden}-bert-vocab"
    if not (model / "config.json").exists():
        build_tiny_model(
            model, layers=1, hidden=args.eager_hidden, words=bert_vocabulary(), max_positions=512
        )
    corpus = args.data / f"eager-corpus-{args.eager_articles}.jsonl"
    write_corpus(args.eager_articles, corpus, args.seed + 7)
    out = {}
    for name in backends:
        config = configs[name].replace(model=str(model), layer=1, contexts="eager")
        if name == "embedded":
            config = config.replace(index=args.data / "embedded-eager")
        else:
            config = config.replace(opensearch_prefix=f"{args.prefix}-eager")
        out[name] = eager_bytes(name, corpus, config, args)
    return out


def disk_bytes(row: dict[str, Any]) -> int:
    """Embedded: the folder; an engine: the primaries' store after a flush (one copy of the data)."""
    disk = row["disk"]
    return disk["bytes"] if "bytes" in disk else disk["primaries"]["bytes"]


def ingest_line(name: str, row: dict[str, Any]) -> str:
    line = (
        f"{row['articles']:,} articles in {row['seconds']:.1f} s ({row['articles_per_s']:.0f}/s),"
        f" {disk_bytes(row) / 1e6:.1f} MB"
    )
    if "heap" in row:
        line += f", heap peak {max(row['heap']['sampled_peak'].values(), default=0) / 2**20:.0f} MiB"
    return line


def questions_line(q: dict[str, Any]) -> str:
    return "; ".join(
        f"{n} cold {v['cold']['p50_ms']:.0f} warm {v['warm']['p50_ms']:.0f} IR {v['ir']['p50_ms']:.1f} ms"
        for n, v in q.items()
    )


def report(r: dict[str, Any]) -> str:
    env = r["env"]
    lines = [
        f"engine scale: {r['corpus']['articles']:,} articles ({r['corpus']['text_mb']:.1f} MB), {env['cpu']},"
        f" {env['cpu_count']} cores; commit {r['git']['commit'][:10]}; heap {r['heap']} a node",
        "",
        "| backend | s | articles/s | MB/s | vs embedded | disk MB (primaries) | all copies | segments"
        " | heap peak MiB (per node) | after full GC | load |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for name, i in r["ingest"].items():
        disk = i["disk"]
        total = disk.get("total", {}).get("bytes", disk.get("bytes"))
        segments = disk.get("primaries", {}).get("segments", disk.get("tantivy_segments"))
        heap = i.get("heap", {})
        peak = "/".join(f"{b / 2**20:.0f}" for _, b in sorted(heap.get("sampled_peak", {}).items())) or "-"
        gc = "/".join(f"{b / 2**20:.0f}" for _, b in sorted((heap.get("after_full_gc") or {}).items())) or "-"
        lines.append(
            f"| {name} | {i['seconds']:.1f} | {i['articles_per_s']:.0f} | {i['mb_per_s']:.2f}"
            f" | {i.get('seconds_vs_embedded', 1):.2f}x | {disk_bytes(i) / 1e6:.1f} | {total / 1e6:.1f}"
            f" | {segments} | {peak} | {gc} | {i['load_before'][0]} -> {i['load_after'][0]} |"
        )
    if "questions" in r:
        lines += [
            "",
            "| backend | cold p50 / p95 ms | warm p50 / p95 ms | warm vs embedded | requests"
            " | IR p50 / p95 ms | IR vs embedded |",
            "| --- | --- | --- | ---: | ---: | --- | ---: |",
        ]
        for name, q in r["questions"].items():
            c, w, i = q["cold"], q["warm"], q["ir"]
            lines.append(
                f"| {name} | {c['p50_ms']:.0f} / {c['p95_ms']:.0f} | {w['p50_ms']:.1f} / {w['p95_ms']:.1f}"
                f" | {w['p50_vs_embedded']:.2f}x | {w['requests_per_question']:.1f}"
                f" | {i['p50_ms']:.2f} / {i['p95_ms']:.2f} | {i['p50_vs_embedded']:.2f}x |"
            )
    for name, e in r.get("eager", {}).items():
        lines.append(
            f"eager {name}: {e['contexts']:,} contexts, {e['bytes_per_context']:.0f} B/context"
            + f" ({e['bytes_per_context_merged']:.0f} merged)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--articles", type=int, default=100_000)
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, embedded first")
    parser.add_argument(
        "--data", type=Path, required=True, help="the corpus, the embedded index, the nodes' data"
    )
    parser.add_argument(
        "--port", type=int, default=10010, help="the single node's HTTP port (if started here)"
    )
    parser.add_argument(
        "--cluster-port", type=int, default=10030, help="the cluster's first port (if started here)"
    )
    parser.add_argument("--opensearch-url", help="a single node of your own (else one is started here)")
    parser.add_argument(
        "--cluster-url", help="a 3-node cluster of your own, every node's URL, comma-separated"
    )
    parser.add_argument(
        "--cluster-shards", type=int, default=3, help="contexts shards on the cluster (1 replica)"
    )
    parser.add_argument("--heap", default="1g", help="each node's JVM heap")
    parser.add_argument("--questions", type=int, default=20, help="free questions")
    parser.add_argument("--rounds", type=int, default=3, help="warm and IR rounds of every question")
    parser.add_argument(
        "--eager-articles", type=int, default=0, help="eager bytes-per-context phase (0: none)"
    )
    parser.add_argument("--eager-hidden", type=int, default=768, help="the eager phase's model width")
    parser.add_argument("--prefix", default=PREFIX, help="index prefix on the engines (dropped first)")
    parser.add_argument(
        "--keep", action="store_true", help="leave the lazy indexes (default: dropped at the end)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "engines-scale.json")
    args = parser.parse_args()
    if args.articles < 1 or args.questions < 1 or args.rounds < 1:
        raise SystemExit("--articles, --questions and --rounds must be at least 1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    results = run(args)
    print(report(results))
    write_results(args.out, results)


if __name__ == "__main__":
    main()
