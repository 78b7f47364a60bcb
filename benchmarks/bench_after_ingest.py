"""Why an engine index searches slower right after its ingest, on the nodes that ingested it: one run.

The engines' warm questions were 1.13-1.35x embedded's p50 through ``serve`` on indexes kept from earlier
runs (asked by nodes started for the run, which never ingested), and 1.64-1.82x right after the ingest
on the nodes that did it (docs/performance.md, issue 50). This run tells the candidates apart: one node
of each engine is started here, the corpus is ingested into them as ``bench_engines.py`` does, and the
same warm questions are asked in process (``warm_latency``: embedded and the engines in turn, question
by question, so that embedded's p50 is measured in the same window) in phases, each after one change:

- ``ingest``: right after the ingest; ``again``: the same, asked once more (what the questions' own
  warm-up changes);
- ``gc``: after a full collection in each JVM (``jcmd <pid> GC.run``: the heap left by the ingest);
- ``flush``: after ``_flush`` (segments committed, translog emptied) and a refresh;
- ``restart``: the nodes stopped and started again on the same data folders (fresh JVMs that never
  ingested; the page cache stays);
- ``pollute``: then another corpus ingested into other indexes (``--pollute-model``'s, cheap to encode)
  by those fresh JVMs, and the first indexes asked again: the JVM's own state after an ingest, with
  the data unchanged;
- ``idle``: after ``--idle-minutes`` idle (background merges, the shards' inactive flush).

Beside each phase's times: every backend's ms inside its methods per question, the JVMs' CPU seconds per
engine question (``/proc``), segments (count, committed, search-ready), merges running, heap and
collections, and the JIT's counts (``jstat -compiler``) and code cache (``jcmd Compiler.codecache``).

    python benchmarks/bench_after_ingest.py --work /work/data/NAME/after --port 9600 \\
        --embedded-from /work/data/h50e/w20/embedded --out benchmarks/results/after-ingest.json
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench_engines import drop, make_questions, model_for, question_kinds, run_ingest
from bench_lazy import FRAGMENT, wikipedia_shaped
from common import Progress, environment, load_average
from engines_meter import cpu_seconds, warm_latency

from bertknn_search.config import Config
from bertknn_search.nodes.launch import Cluster, engine
from bertknn_search.query.search import Searcher

PHASES = ("ingest", "again", "gc", "flush", "restart", "pollute", "idle")


class TunedCluster(Cluster):
    """A ``Cluster`` whose JVMs get ``jvm_options`` too (flags tried against the slowdown)."""

    def __init__(self, *args: Any, jvm_options: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.jvm_options = jvm_options

    def command(self, i: int, java: Path) -> list[str]:
        line = super().command(i, java)
        return [line[0], *self.jvm_options, *line[1:]]


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


def post(url: str) -> Any:
    request = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def run_tool(*argv: str) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"failed: {e}"


def jit_state(pid: int) -> dict[str, Any]:
    """jstat -compiler's counts and the code cache's use, from the JVM itself."""
    out: dict[str, Any] = {}
    lines = run_tool("jstat", "-compiler", str(pid)).splitlines()
    if len(lines) >= 2:  # Compiled Failed Invalid Time FailedType FailedMethod (the last may be empty)
        out["jstat_compiler"] = dict(zip(lines[0].split()[:4], lines[1].split()[:4]))
    cache = run_tool("jcmd", str(pid), "Compiler.codecache")
    used = [int(kb) for kb in re.findall(r"used=(\d+)Kb", cache)]
    out["codecache_used_kb"] = sum(used)
    out["codecache_full"] = "full" in cache.lower() and "full_count=0" not in cache
    return out


def engine_state(url: str, pid: int, prefix: str) -> dict[str, Any]:
    """Segments of the prefix's indices, merges, translog, heap, collections and the JIT, on one node."""
    segments = get(
        f"{url}/_cat/segments/{prefix}-*?format=json&h=index,segment,docs.count,committed,searchable"
    )
    per_index: dict[str, dict[str, int]] = {}
    for s in segments:
        row = per_index.setdefault(s["index"], {"segments": 0, "uncommitted": 0, "unsearchable": 0})
        row["segments"] += 1
        row["uncommitted"] += s["committed"] != "true"
        row["unsearchable"] += s["searchable"] != "true"
    nodes = get(f"{url}/_nodes/_local/stats/indices,jvm")["nodes"]
    node = next(iter(nodes.values()))
    indices, jvm = node["indices"], node["jvm"]
    return {
        "indices": per_index,
        "merges_current": indices["merges"]["current"],
        "merges_total": indices["merges"]["total"],
        "translog_uncommitted_ops": indices["translog"]["uncommitted_operations"],
        "query_cache_bytes": indices["query_cache"]["memory_size_in_bytes"],
        "heap_used_mb": round(jvm["mem"]["heap_used_in_bytes"] / 1e6, 1),
        "gc": {
            name: {"count": c["collection_count"], "ms": c["collection_time_in_millis"]}
            for name, c in jvm["gc"]["collectors"].items()
        },
        "jvm_cpu_s": cpu_seconds(pid),
        **jit_state(pid),
    }


def jvm_cpu_ms(pids: dict[str, int], before: dict[str, float], asked: int) -> dict[str, float]:
    """Each JVM's CPU milliseconds a question since ``before`` (its ``cpu_seconds`` then)."""
    return {name: (cpu_seconds(pid) - before[name]) * 1000 / asked for name, pid in pids.items()}


def ask(
    configs: dict[str, Config], questions: list[Any], kinds: list[str], rounds: int, pids: dict[str, int]
) -> dict[str, Any]:
    """The warm questions in process, the backends in turn; with the JVMs' CPU seconds per question."""
    searchers = {name: Searcher.open(config) for name, config in configs.items()}
    try:
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        load0 = load_average()
        latency = warm_latency(searchers, questions, rounds, kinds)
        for name, ms in jvm_cpu_ms(pids, cpu0, len(questions) * (rounds + 1)).items():
            latency[name]["jvm_cpu_ms_per_question"] = ms
        return {"load_before": load0, "load_after": load_average(), "latency": latency}
    finally:
        for s in searchers.values():
            s.close()


def summary(phase: dict[str, Any]) -> str:
    cells = []
    for name, v in phase["latency"].items():
        cell = f"{name} {v['p50_ms']:.1f} ms (backend {v['backend']['p50_ms']:.1f}"
        if "jvm_cpu_ms_per_question" in v:
            cell += f", JVM {v['jvm_cpu_ms_per_question']:.1f} CPU ms/q"
        cell += ")"
        if "p50_vs_embedded" in v:
            cell += f" {v['p50_vs_embedded']:.2f}x"
        cells.append(cell)
    return "; ".join(cells)


def run(args: argparse.Namespace) -> dict[str, Any]:
    phases = [p for p in args.phases.split(",") if p]
    if bad := [p for p in phases if p not in PHASES]:
        raise SystemExit(f"unknown --phases {', '.join(bad)}; known: {', '.join(PHASES)}")
    results: dict[str, Any] = {
        "benchmark": "after_ingest",
        "env": environment("cpu"),
        "model": args.model,
        "articles": args.articles,
        "questions": args.questions,
        "rounds": args.rounds,
        "heap": args.heap,
        "jvm_options": args.jvm_option,
        "phases_asked": phases,
        "results": {},
    }
    progress = Progress(args.out, results)
    model, layer = model_for(args.model)
    articles = wikipedia_shaped(args.source, args.articles, args.seed)
    questions = make_questions(articles, args.questions, args.seed)
    kinds = question_kinds(questions, articles)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    base = Config(model=str(model), layer=layer, device="cpu", contexts="eager")
    configs: dict[str, Config] = {"embedded": base.replace(index=work / "embedded")}
    clusters: dict[str, Cluster] = {}
    try:
        for i, name in enumerate(("opensearch", "elasticsearch")):
            shutil.rmtree(work / name, ignore_errors=True)  # a fresh node: its JVM and data both new
            cluster = TunedCluster(
                engine(name), port=args.port + 10 * i, data=work / name, heap=args.heap,
                jvm_options=args.jvm_option,
            )  # fmt: skip
            clusters[name] = cluster
            cluster.start(say=lambda _line: None, progress=False)
            url_key = "opensearch_url" if name == "opensearch" else "elasticsearch_url"
            configs[name] = base.replace(
                backend=name, opensearch_prefix=args.prefix, **{url_key: cluster.url}
            )
        progress.done("nodes started", ", ".join(c.url for c in clusters.values()))

        def pids() -> dict[str, int]:
            return {name: c.procs[0].pid for name, c in clusters.items() if c.procs[0]}

        if args.embedded_from:
            shutil.rmtree(work / "embedded", ignore_errors=True)
            shutil.copytree(args.embedded_from, work / "embedded")
            names = ["opensearch", "elasticsearch"]
        else:
            names = ["embedded", "opensearch", "elasticsearch"]
        results["ingest"] = {}
        for name in names:
            drop(configs[name])
            pid = pids().get(name)
            row = run_ingest(articles, configs[name], pid)
            results["ingest"][name] = {k: row[k] for k in ("contexts", "seconds", "jvm_cpu_s", "load_before")}
            progress.done(f"ingest {name}", f"{row['contexts']} contexts in {row['seconds']:.1f} s")

        def measure(phase: str) -> None:
            state = {n: engine_state(clusters[n].url, pids()[n], args.prefix) for n in clusters}
            asked = ask(configs, questions, kinds, args.rounds, pids())
            results["results"][phase] = {"state": state, **asked}
            progress.done(f"phase {phase}", summary(asked))

        for phase in phases:
            if phase == "gc":
                for pid in pids().values():
                    run_tool("jcmd", str(pid), "GC.run")
            elif phase == "flush":
                for c in clusters.values():
                    post(f"{c.url}/{args.prefix}-*/_flush")
                    post(f"{c.url}/{args.prefix}-*/_refresh")
            elif phase == "restart":
                for c in clusters.values():
                    c.stop()
                for c in clusters.values():
                    c.start(say=lambda _line: None, progress=False)
            elif phase == "pollute":
                other, other_layer = model_for(args.pollute_model)
                extra = wikipedia_shaped(args.source, args.pollute_articles, args.seed + 7)
                for name in clusters:
                    config = configs[name].replace(
                        model=str(other), layer=other_layer, opensearch_prefix=f"{args.prefix}-pollute"
                    )
                    drop(config)
                    run_ingest(extra, config, pids()[name])
            elif phase == "idle":
                time.sleep(args.idle_minutes * 60)
            measure(phase)
    finally:
        for c in clusters.values():
            c.stop()
    progress.finish()
    return results


def warmup_curve(args: argparse.Namespace) -> dict[str, Any]:
    """Fresh nodes of each ``--variant`` (its JVM options) on copies of ``--curve-from``'s engine data
    (indexes an earlier run of this bench ingested, ``--prefix``), asked the same warm questions in turn
    with embedded, ``--steps`` times: each step's p50s show how many questions a JVM takes to get warm."""
    results: dict[str, Any] = {
        "benchmark": "after_ingest_warmup_curve",
        "env": environment("cpu"),
        "variants": dict(args.variant),
        "questions": args.questions,
        "steps": [],
    }
    progress = Progress(args.out, results)
    model, layer = model_for(args.model)
    articles = wikipedia_shaped(args.source, args.articles, args.seed)
    questions = make_questions(articles, args.questions, args.seed)
    kinds = question_kinds(questions, articles)
    base = Config(model=str(model), layer=layer, device="cpu", contexts="eager")
    configs: dict[str, Config] = {"embedded": base.replace(index=args.curve_from / "embedded")}
    clusters: dict[str, Cluster] = {}
    searchers: dict[str, Searcher] = {}
    try:
        for v, (label, options) in enumerate(args.variant):
            for i, name in enumerate(("opensearch", "elasticsearch")):
                data = args.work / label / name
                shutil.rmtree(data, ignore_errors=True)
                shutil.copytree(
                    args.curve_from / name, data, ignore=shutil.ignore_patterns("*.lock", "node.pid")
                )
                cluster = TunedCluster(
                    engine(name), port=args.port + 20 * v + 10 * i, data=data, heap=args.heap,
                    jvm_options=options.split(),
                )  # fmt: skip
                clusters[f"{name} {label}"] = cluster
                cluster.start(say=lambda _line: None, progress=False)
                url_key = "opensearch_url" if name == "opensearch" else "elasticsearch_url"
                configs[f"{name} {label}"] = base.replace(
                    backend=name, opensearch_prefix=args.prefix, **{url_key: cluster.url}
                )
        progress.done("nodes started", ", ".join(f"{n} {c.url}" for n, c in clusters.items()))
        searchers = {name: Searcher.open(config) for name, config in configs.items()}
        pids = {name: c.procs[0].pid for name, c in clusters.items() if c.procs[0]}
        for step in range(args.steps):
            cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
            load0 = load_average()
            latency = warm_latency(searchers, questions, 1, kinds)
            jvm = jvm_cpu_ms(pids, cpu0, 2 * len(questions))  # warm_latency: a pass, then 1 round
            row: dict[str, Any] = {"step": step + 1, "load_before": load0, "load_after": load_average()}
            for name, v in latency.items():
                row[name] = {
                    "p50_ms": round(v["p50_ms"], 2),
                    "backend_p50_ms": round(v["backend"]["p50_ms"], 2),
                    "p50_vs_embedded": round(v.get("p50_vs_embedded", 1.0), 3),
                }
                if name in jvm:
                    row[name]["jvm_cpu_ms_per_question"] = round(jvm[name], 1)
            results["steps"].append(row)
            progress.done(
                f"step {step + 1} ({2 * (step + 1) * len(questions)} questions)",
                "; ".join(
                    f"{n} {v['p50_ms']:.1f} ms (backend {v['backend_p50_ms']:.1f}"
                    + (
                        f", JVM {v['jvm_cpu_ms_per_question']:.0f} CPU ms/q"
                        if "jvm_cpu_ms_per_question" in v
                        else ""
                    )
                    + ")"
                    for n, v in row.items()
                    if isinstance(v, dict)
                ),
            )
        results["state"] = {n: engine_state(c.url, pids[n], args.prefix) for n, c in clusters.items()}
    finally:
        for s in searchers.values():
            s.close()
        for c in clusters.values():
            c.stop()
    progress.finish()
    return results


def variant(text: str) -> tuple[str, str]:
    label, _, options = text.partition("=")
    return label, options


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, required=True, help="the indexes and the nodes' data (replaced)")
    parser.add_argument("--model", choices=["tiny", "minilm"], default="minilm")
    parser.add_argument("--articles", type=int, default=20)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--source", type=Path, default=FRAGMENT)
    parser.add_argument("--heap", default="1g")
    parser.add_argument("--port", type=int, default=9600, help="OpenSearch's; Elasticsearch's is 10 above")
    parser.add_argument("--prefix", default="after")
    parser.add_argument("--phases", default=",".join(PHASES[:-1]), help=f"of {', '.join(PHASES)}")
    parser.add_argument("--idle-minutes", type=float, default=6.0)
    parser.add_argument("--pollute-model", choices=["tiny", "minilm"], default="tiny")
    parser.add_argument("--pollute-articles", type=int, default=20)
    parser.add_argument("--jvm-option", action="append", default=[], help="an option for the nodes' JVMs")
    parser.add_argument(
        "--embedded-from", type=Path, help="an embedded index of the same corpus to copy (skips its ingest)"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--curve-from", type=Path, help="instead: a warm-up curve on copies of that --work's indexes"
    )
    parser.add_argument(
        "--variant", type=variant, action="append", default=[], help="LABEL=JVM OPTIONS (with --curve-from)"
    )
    parser.add_argument("--steps", type=int, default=20, help="with --curve-from: steps of 2 rounds")
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if args.curve_from:
        warmup_curve(args)
        return
    results = run(args)
    json.dump({p: summary(v) for p, v in results["results"].items()}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
