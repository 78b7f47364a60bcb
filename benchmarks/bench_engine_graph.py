"""The no-IR graph's cost (issue 40.3): bytes per article and per context, write time and the no-IR search,
on OpenSearch without and with the HNSW graph (``ingest --no-ir-graph``), Elasticsearch and embedded.

One eager ingest into the embedded backend encodes the articles (all-MiniLM-L6-v2 or the tiny model); the
same encoded articles, in the same batches, are then written into each engine index in turn, so the
engines' numbers differ by their storage alone, not by the encoder. Per backend: the writes' wall seconds
and the engine's own indexing, refresh and merge milliseconds (``_stats``), bytes on disk as written
(after a flush) and after a force merge (which, once the shard's retention lease has moved past the
writes, drops OpenSearch's ``_recovery_source``: the JSON of every excluded vector), the bytes by Lucene
file kind (``vex``: the HNSW graph, ``vec``: float32 vectors, ``fdt``: stored fields), JVM heap, and
the no-IR search: its latency and the graph's recall against the exact scan.

Give running nodes (``bertknn-search engine start``)::

    python benchmarks/bench_engine_graph.py --model minilm --articles 20 \\
        --opensearch-url http://127.0.0.1:9810 --elasticsearch-url http://127.0.0.1:9830 \\
        --out benchmarks/results/engine-graph-minilm.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_engines import model_for
from bench_lazy import FRAGMENT, wikipedia_shaped
from common import Progress, dir_bytes, environment, load_average

from bertknn_search.backends.embedded.backend import EmbeddedBackend
from bertknn_search.backends.engines.backend import EngineBackend
from bertknn_search.config import Config
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.records import EncodedArticle, IndexMeta

VARIANTS = (("opensearch", False), ("opensearch", True), ("elasticsearch", False))
LEASE_S = 40  # OpenSearch syncs a shard's retention lease every 30 s; a merge prunes only behind it
K = 128  # the paper's k: what a --no-ir question asks for


def encode_once(articles: list[Any], config: Config) -> tuple[list[list[EncodedArticle]], IndexMeta, dict]:
    """Eager ingest into the embedded backend, keeping every batch it writes (and its write seconds)."""
    batches: list[list[EncodedArticle]] = []
    written = [0.0]
    add = EmbeddedBackend.add_articles

    def kept(self: EmbeddedBackend, items: Any, ir_fields: Any = None) -> None:
        batches.append(list(items))
        started = time.perf_counter()
        add(self, items, ir_fields)
        written[0] += time.perf_counter() - started

    EmbeddedBackend.add_articles = kept  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        ingest(articles, config, progress=False)
        seconds = time.perf_counter() - started
    finally:
        EmbeddedBackend.add_articles = add  # type: ignore[method-assign]
    backend = EmbeddedBackend.open(config.index)
    try:
        meta, stats = backend.meta(), backend.stats()
    finally:
        backend.close()
    return (
        batches,
        meta,
        {
            "ingest_s": round(seconds, 1),
            "write_s": round(written[0], 2),
            "articles": stats.articles,
            "contexts": stats.contexts,
            "bytes": dir_bytes(config.index),
            "load": load_average(),
        },
    )


def engine_stats(backend: EngineBackend) -> dict[str, Any]:
    """The contexts index's engine-side times and bytes (by Lucene file kind), both indices' bytes, heap."""
    client, names = backend.client, backend.names
    contexts = client.indices.stats(
        index=names["contexts"],
        metric="store,indexing,refresh,merge,flush,segments",
        include_segment_file_sizes=True,
    )["_all"]["primaries"]
    both = client.indices.stats(index=",".join(names.values()), metric="store")["_all"]["primaries"]
    files = contexts["segments"].get("file_sizes", {})
    heap = client.nodes.stats(metric="jvm")["nodes"]
    return {
        "bytes": int(both["store"]["size_in_bytes"]),
        "context_bytes": int(contexts["store"]["size_in_bytes"]),
        "segments": int(contexts["segments"]["count"]),
        "file_bytes": {kind: int(v["size_in_bytes"]) for kind, v in sorted(files.items())},
        "index_ms": int(contexts["indexing"]["index_time_in_millis"]),
        "refresh_ms": int(contexts["refresh"]["total_time_in_millis"]),
        "merge_ms": int(contexts["merges"]["total_time_in_millis"]),
        "heap_used_mb": round(sum(n["jvm"]["mem"]["heap_used_in_bytes"] for n in heap.values()) / 2**20, 1),
    }


def neighbour_keys(found: Any) -> list[tuple[str, int, int]]:
    return list(zip(found.article_ids, found.sentence_ids.tolist(), found.starts.tolist(), strict=True))


def search_cost(backend: Any, queries: np.ndarray, articles: list[str]) -> dict[str, Any]:
    """Median ms of a no-IR search (k 128, every context) and of the IR-first one (3 articles), and the
    no-IR neighbours of each query (for recall)."""
    no_ir, first, found = [], [], []
    backend.knn(queries[0], K)  # the first search warms caches (the embedded backend builds its flat index)
    for i, q in enumerate(queries):
        started = time.perf_counter()
        found.append(neighbour_keys(backend.knn(q, K)))
        no_ir.append((time.perf_counter() - started) * 1e3)
        started = time.perf_counter()
        backend.knn(q, K, articles[i % len(articles) : i % len(articles) + 3])
        first.append((time.perf_counter() - started) * 1e3)
    return {
        "no_ir_ms_p50": round(statistics.median(no_ir), 1),
        "ir_first_ms_p50": round(statistics.median(first), 1),
        "neighbours": found,
    }


def write_variant(
    batches: list[list[EncodedArticle]], meta: IndexMeta, config: Config, graph: bool
) -> dict[str, Any]:
    backend = EngineBackend.create(config, dataclasses.replace(meta, no_ir_graph=graph))
    load = load_average()
    started = time.perf_counter()
    try:
        for batch in batches:
            backend.add_articles(batch)
    finally:
        backend.close()
    seconds = time.perf_counter() - started
    backend = EngineBackend.open(config)
    try:
        backend.client.indices.flush(index=",".join(backend.names.values()))
        return {"write_s": round(seconds, 2), "load": [load, load_average()], "graph": backend._has_graph}
    finally:
        backend.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    model, layer = model_for(args.model)
    articles = wikipedia_shaped(args.source, args.articles, args.seed)
    results: dict[str, Any] = {"benchmark": "engine-graph", "env": environment("cpu"), "model": args.model}
    progress = Progress(args.out, results)
    urls = {"opensearch": args.opensearch_url, "elasticsearch": args.elasticsearch_url}
    with tempfile.TemporaryDirectory(prefix="bench-graph-") as tmp:
        base = Config(model=str(model), layer=layer, device="cpu", contexts="eager", precision="fp32")
        embedded = base.replace(index=Path(tmp) / "embedded")
        batches, meta, encoded = encode_once(articles, embedded)
        progress.done("embedded", f"{encoded}", embedded=encoded)
        items = [i for b in batches for i in b]
        rng = np.random.default_rng(args.seed)
        picked = rng.choice(sum(len(i.contexts) for i in items), args.queries, replace=False)
        vectors = np.concatenate([i.contexts.vectors for i in items]).astype(np.float32)
        queries = vectors[picked] + rng.normal(0, 0.05, (args.queries, vectors.shape[1])).astype(np.float32)
        ids = sorted(i.article.id for i in items)
        store = EmbeddedBackend.open(embedded.index)
        try:
            results["embedded"]["search"] = search_cost(store, queries, ids)
        finally:
            store.close()
        configs = {}
        for name, graph in VARIANTS:
            label = f"{name}{'-graph' if graph else ''}"
            config = base.replace(
                backend=name, opensearch_prefix=f"bench-graph-{label}", **{f"{name}_url": urls[name]}
            )
            configs[label] = config
            written = write_variant(batches, meta, config, graph)
            backend = EngineBackend.open(config)
            try:
                written |= {"written": engine_stats(backend), "search": search_cost(backend, queries, ids)}
            finally:
                backend.close()
            progress.done(
                label, f"{ {k: v for k, v in written.items() if k != 'search'} }", **{label: written}
            )
        time.sleep(LEASE_S)
        for label, config in configs.items():
            backend = EngineBackend.open(config)
            try:
                names = ",".join(backend.names.values())
                backend.client.indices.forcemerge(index=names, max_num_segments=1)
                # The merged-away segments count until a new reader and commit let them go.
                backend.client.indices.refresh(index=names)
                backend.client.indices.flush(index=names, force=True)
                results[label]["merged"] = engine_stats(backend)
                backend.client.indices.delete(index=names)
            finally:
                backend.close()
        exact = results["opensearch"]["search"]["neighbours"]
        for label in ("embedded", *configs):
            found = results[label]["search"].pop("neighbours")
            recall = [len(set(a) & set(b)) / K for a, b in zip(found, exact, strict=True)]
            results[label]["search"]["no_ir_recall_vs_exact"] = round(float(np.mean(recall)), 4)
    results["load_end"] = load_average()
    results["summary"] = summary(results)
    progress.done("merged", "force merged and measured")
    progress.finish()
    return results


def summary(r: dict[str, Any]) -> dict[str, Any]:
    """Bytes per article and per context, write seconds and no-IR search, per backend."""
    n, contexts = r["embedded"]["articles"], r["embedded"]["contexts"]
    out = {
        "embedded": {
            "bytes_per_article": round(r["embedded"]["bytes"] / n),
            "bytes_per_context": round(r["embedded"]["bytes"] / contexts),
            "write_s": r["embedded"]["write_s"],
            **{k: v for k, v in r["embedded"]["search"].items()},
        }
    }
    for label in ("opensearch", "opensearch-graph", "elasticsearch"):
        v = r[label]
        out[label] = {
            "bytes_per_article": round(v["written"]["bytes"] / n),
            "bytes_per_context": round(v["written"]["context_bytes"] / contexts),
            "merged_bytes_per_article": round(v["merged"]["bytes"] / n),
            "merged_bytes_per_context": round(v["merged"]["context_bytes"] / contexts),
            "graph_bytes_per_context": round(v["merged"]["file_bytes"].get("vex", 0) / contexts),
            "write_s": v["write_s"],
            "engine_index_ms": v["written"]["index_ms"],
            "engine_refresh_ms": v["written"]["refresh_ms"],
            **v["search"],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=["tiny", "minilm"], default="minilm")
    parser.add_argument("--articles", type=int, default=20)
    parser.add_argument("--queries", type=int, default=20, help="no-IR searches per backend")
    parser.add_argument("--opensearch-url", required=True)
    parser.add_argument("--elasticsearch-url", required=True)
    parser.add_argument("--source", type=Path, default=FRAGMENT, help="an enwiki XML dump (fragment)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    print(json.dumps(run(parser.parse_args())["summary"], indent=1))


if __name__ == "__main__":
    main()
