"""The server under concurrent clients, against the batch path of ``query --file``, in the same run.

1. Builds an index of synthetic Wikipedia-like articles (random keys, as ``bench_query.py --keys
   synthetic``: query cost depends on the number of keys, not their values) for a random BERT-shaped model.
2. Batch path: ``Searcher.answer_batch`` in batches of the Config's batch size (128 on a CPU), exactly
   the loop ``query --file`` runs, in this process, after a warm-up; the model load is not counted.
3. Starts ``bertknn-search serve`` on 127.0.0.1 (a free port), and the same command with the batcher's
   fixed window alone (``--no-window-only`` skips it), and runs 1, 8 and 32 clients, each a thread with
   one keep-alive connection sending one question a request and waiting for the answer; 8 and 32 clients
   twice on each server, in the order A B B A. Questions/s over the wall time, p50/p99 of the request
   latency, and the server's passes (mean batch). The batch path runs again after each level, and each
   level is compared with the mean of the batch runs before and after it: the load of a shared machine
   drifts within minutes.
4. While 8 clients keep asking (half of them about the articles being added), adds ``--add`` new short
   articles in one ``POST /articles``. Every reply is checked: an error is a non-200; a partial answer is
   one whose rankings are short, whose own article is missing for a stored subject, or whose evidence
   span does not hold the answer word in its sentence (a mix of two versions of an article would).

Only loopback traffic; every phase is bounded by a question count and ``--max-seconds``.

    python benchmarks/bench_serve.py                       # BERT-base shapes on the CPU (~6 minutes)
    python benchmarks/bench_serve.py --model-size tiny     # a quick smoke run
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from bench_query import add_synthetic, as_questions, make_questions
from common import (
    LAYER,
    CorpusGenerator,
    Progress,
    argument_parser,
    build_model,
    environment,
    run_benchmark,
    start_serve,
)

from bertknn_search.config import Config
from bertknn_search.query.search import Searcher
from bertknn_search.records import Article, Question
from bertknn_search.stopwords import STOPWORDS

TOP = 10
# `bertknn-search serve` with ServerSettings.patience_s set: 0 is the fixed window alone (before the
# batcher waited for returning clients), for a comparison in the same run.
PATIENCE_SERVE = """
import functools, sys
import bertknn_search.server.app as app
app.ServerSettings = functools.partial(app.ServerSettings, patience_s=float(sys.argv[1]))
from bertknn_search.cli import main
sys.argv = ["bertknn-search", *sys.argv[2:]]
main()
"""


# -- the server --------------------------------------------------------------------------------------------
class Server:
    """``bertknn-search serve`` in a child process; its stderr is kept for the report."""

    def __init__(self, index: Path, device: str, max_seconds: float, patience_s: float | None = None) -> None:
        args = ["serve", "--index", str(index), "--port", "0", "--device", device]
        cmd = [sys.executable, "-m", "bertknn_search", *args]
        if patience_s is not None:  # the same command with the batcher's patience fixed (no flag sets it)
            cmd = [sys.executable, "-c", PATIENCE_SERVE, str(patience_s), *args]
        # A load test asks more than a tokenless client may at once (docs/serving.md, limits).
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "BERTKNN_SERVE_LIMITS": "questions=1024,articles=10000"}
        self.proc, self.url, self.log = start_serve(cmd, env, max_seconds)
        if not self.url:
            self.stop()
            raise RuntimeError("the server did not start:\n" + "".join(self.log))

    def batches(self) -> dict[str, Any]:
        """The server's own count of questions and batches (``GET /stats``), or why there is none."""
        parts = urllib.parse.urlsplit(self.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        try:
            conn.request("GET", "/stats")
            return dict(json.loads(conn.getresponse().read())["server"])
        except (OSError, http.client.HTTPException, KeyError, ValueError) as exc:
            return {"error": str(exc)}
        finally:
            conn.close()

    def stop(self) -> int:
        self.proc.terminate()  # SIGTERM: a running add finishes first
        try:
            return self.proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def post(url: str, path: str, body: Any, timeout: float) -> tuple[int, Any]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        conn.close()


# -- clients -----------------------------------------------------------------------------------------------
def partial(answer: dict[str, Any], stored_subject: bool) -> str | None:
    """Why ``answer`` is not a whole answer, or None when it is."""
    if any(len(answer[key]) != TOP for key in ("bert_knn", "bert")):
        return "short ranking"
    if stored_subject and not (answer["articles"] and answer["articles"][0]["title"] == answer["subject"]):
        return "own article missing"
    for ev in answer["evidence"]:
        for s in ev["sentences"]:
            if s["sentence"][s["start"] : s["end"]].lower() != ev["word"]:
                return "evidence span does not hold the answer"
    return None


def clients(
    url: str,
    questions: list[Question],
    n_clients: int,
    total: int,
    max_seconds: float,
    stored: Callable[[Question], bool] = lambda q: True,
    until: threading.Event | None = None,
) -> dict[str, Any]:
    """``n_clients`` threads asking ``questions`` in turn until ``total`` are asked (or ``until`` is set)."""
    parts = urllib.parse.urlsplit(url)
    lock = threading.Lock()
    taken = 0
    latencies: list[float] = []
    errors: list[str] = []
    partials: list[str] = []
    deadline = time.monotonic() + max_seconds

    def work() -> None:
        nonlocal taken
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=max_seconds + 60)
        try:
            while time.monotonic() < deadline:
                with lock:
                    if (until is None and taken >= total) or (until is not None and until.is_set()):
                        return
                    q = questions[taken % len(questions)]
                    taken += 1
                body = json.dumps({"question": q.text, "subject": q.subject})
                started = time.perf_counter()
                try:
                    conn.request("POST", "/query", body, {"Content-Type": "application/json"})
                    reply = conn.getresponse()
                    data = reply.read()
                except (OSError, http.client.HTTPException) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    conn.close()
                    continue
                elapsed = time.perf_counter() - started
                if reply.status != 200:
                    errors.append(f"{reply.status}: {data[:200]!r}")
                    continue
                latencies.append(elapsed)
                why = partial(json.loads(data)["answers"][0], stored(q))
                if why:
                    partials.append(why)
        finally:
            conn.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    ms = np.asarray(latencies) * 1000.0
    return {
        "clients": n_clients,
        "answered": len(latencies),
        "seconds": seconds,
        "questions_per_s": len(latencies) / seconds if seconds else 0.0,
        "p50_ms": float(np.percentile(ms, 50)) if ms.size else 0.0,
        "p99_ms": float(np.percentile(ms, 99)) if ms.size else 0.0,
        "latencies_ms": [round(x, 1) for x in ms.tolist()],
        "errors": len(errors),
        "error_examples": errors[:3],
        "partial": len(partials),
        "partial_examples": partials[:3],
    }


def merge_levels(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs of one client level as one: questions/s over their summed time, percentiles of all requests."""
    ms = np.asarray([x for r in runs for x in r["latencies_ms"]])
    answered, seconds = sum(r["answered"] for r in runs), sum(r["seconds"] for r in runs)
    passes = sum(r["passes"] for r in runs)
    return {
        "clients": runs[0]["clients"],
        "runs": [{k: v for k, v in r.items() if k != "latencies_ms"} for r in runs],
        "answered": answered,
        "seconds": seconds,
        "questions_per_s": answered / seconds if seconds else 0.0,
        "p50_ms": float(np.percentile(ms, 50)) if ms.size else 0.0,
        "p99_ms": float(np.percentile(ms, 99)) if ms.size else 0.0,
        "mean_batch": answered / max(passes, 1),
        "errors": sum(r["errors"] for r in runs),
        "partial": sum(r["partial"] for r in runs),
    }


# -- the run -----------------------------------------------------------------------------------------------
def batch_path(config: Config, questions: list[Question]) -> dict[str, Any]:
    """Questions/s of the loop ``query --file`` runs (answer_batch in batches of the Config's size)."""
    searcher = Searcher.open(config)
    try:
        size = config.batch_for(searcher.encoder.placement.device.type)
        searcher.answer_batch(questions[:size])  # warm-up: weights, first-call allocations
        started = time.perf_counter()
        for lo in range(0, len(questions), size):
            searcher.answer_batch(questions[lo : lo + size])
        seconds = time.perf_counter() - started
    finally:
        searcher.close()
    return {
        "batch": size,
        "questions": len(questions),
        "seconds": seconds,
        "questions_per_s": len(questions) / seconds,
    }


def short_articles(n: int, seed: int, sentences: int, words: int) -> list[Article]:
    """``n`` articles of ``sentences`` sentences cut to ``words`` words: encoding BERT-base contexts on
    two CPU cores runs at tens a second, so the add is kept to about 15 contexts an article."""
    gen = CorpusGenerator(seed=seed)
    out = []
    for i in range(n):
        title = f"{gen.title(900_000 + i)} Added"
        cut = [gen.sentence(title if s == 0 else None).rstrip(".").split()[:words] for s in range(sentences)]
        # A sentence cut after a stopword ("X is a.") reads as an abbreviation to the splitter.
        cut = [ws[: max(i for i, w in enumerate(ws) if w.lower() not in STOPWORDS) + 1] for ws in cut]
        text = " ".join(" ".join(w) + "." for w in cut)
        out.append(Article(f"added-{i}", title, text))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = build_model(args.model_size)
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-", dir=args.tmp))
    results: dict[str, Any] = {
        "environment": environment(args.device),
        "model_size": args.model_size,
        "articles": args.articles,
    }
    progress = Progress(args.out, results)
    try:
        # Eager: every context stored up front, as the batch path and the server should both find them.
        config = Config(
            model=str(model), layer=LAYER, index=tmp / "index", device=args.device, contexts="eager"
        )
        articles = CorpusGenerator(seed=args.seed).articles(args.articles)
        add_synthetic(articles, config, args.seed)
        questions = as_questions(make_questions(articles, args.questions, args.seed), "subject")
        progress.done("index", f"{args.articles} articles at {config.index}")
        # The batch path between the client levels: the shared machine's load drifts, so each level is
        # compared with the mean of the batch runs just before and after it.
        batch_runs = [batch_path(config, questions)]
        progress.done(
            "batch path", f"{batch_runs[0]['questions_per_s']:.1f} questions/s", batch_path=batch_runs
        )
        bound = max(args.max_seconds, 900.0)  # a loaded machine loads the model slowly
        server = Server(config.index, args.device, bound)
        # The same server with the fixed window alone, asked in turn with the first.
        other = Server(config.index, args.device, bound, patience_s=0.0) if args.window_only else None
        servers = {"adaptive": server, **({"window only": other} if other else {})}
        try:
            for s in servers.values():
                clients(s.url, questions, 32, 64, args.max_seconds)  # first passes at small and full shapes
            progress.done("servers ready", ", ".join(f"{k} {s.url}" for k, s in servers.items()))
            results["clients"] = {name: [] for name in servers}
            for turn, n in enumerate((1, 8, 32)):
                total = args.questions if n > 1 else args.questions // 4
                order = list(servers) if turn % 2 == 0 else list(servers)[::-1]
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
                for name in order + order[::-1] if n > 1 else order:  # A B B A: drift falls on both
                    before = servers[name].batches()
                    level = clients(servers[name].url, questions, n, total, args.max_seconds)
                    after = servers[name].batches()
                    level["passes"] = after.get("batches", 0) - before.get("batches", 0)
                    level["mean_batch"] = level["answered"] / max(level["passes"], 1)
                    runs[name].append(level)
                    progress.done(
                        f"{n} clients, {name}",
                        f"{level['questions_per_s']:.1f} questions/s, p50 {level['p50_ms']:.0f} ms,"
                        f" p99 {level['p99_ms']:.0f} ms, mean batch {level['mean_batch']:.1f},"
                        f" {level['errors']} errors, {level['partial']} partial",
                    )
                batch_runs.append(batch_path(config, questions))
                progress.done("batch path", f"{batch_runs[-1]['questions_per_s']:.1f} questions/s")
                around = float(np.mean([b["questions_per_s"] for b in batch_runs[-2:]]))
                for name, done in runs.items():
                    merged = merge_levels(done)
                    merged["batch_questions_per_s"] = around
                    merged["vs_batch_path"] = merged["questions_per_s"] / around
                    results["clients"][name].append(merged)
            if other:
                results["window_only_batches"] = other.batches()
                results["window_only_exit"] = other.stop()
            add = during_add(server.url, questions, args)
            progress.done(
                "during an add",
                f"{add['answered']} answered, {add['errors']} errors, {add['partial']} partial;"
                f" add {add['add_status']} in {add['add_seconds']:.0f} s",
                during_add=add,
            )
        finally:
            results["server_batches"] = server.batches()
            results["server_exit"] = server.stop()
            if other and other.proc.poll() is None:
                other.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    progress.finish()
    return results


def during_add(url: str, questions: list[Question], args: argparse.Namespace) -> dict[str, Any]:
    """Questions from 8 clients while one request adds ``args.add`` articles; half ask about those."""
    added = short_articles(args.add, args.seed + 1, args.add_sentences, args.add_words)
    new_titles = {a.title for a in added}
    about_new = as_questions(make_questions(added, len(questions), args.seed + 2), "subject")
    mixed = [q for pair in zip(questions, about_new) for q in pair]
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def add() -> None:
        started = time.perf_counter()
        body = {"articles": [{"id": a.id, "title": a.title, "text": a.text} for a in added]}
        try:
            status, reply = post(url, "/articles", body, timeout=args.max_seconds * 4)
            outcome.update(status=status, reply=reply)
        except (OSError, http.client.HTTPException) as exc:
            outcome.update(status=f"no reply: {exc}")  # the add is still bounded: report, don't hang
        finally:
            outcome["seconds"] = time.perf_counter() - started
            done.set()

    adder = threading.Thread(target=add)
    adder.start()
    load = clients(
        url, mixed, 8, 0, args.max_seconds * 4, stored=lambda q: q.subject not in new_titles, until=done
    )
    adder.join()
    status, after = post(
        url,
        "/query",
        {"questions": [{"question": q.text, "subject": q.subject} for q in about_new[:20]]},
        600,
    )
    answerable = status == 200 and all(
        a["articles"] and a["articles"][0]["title"] == a["subject"] for a in after["answers"]
    )
    summary = outcome.get("reply", {})
    return {
        "articles": args.add,
        "add_status": outcome.get("status"),
        "add_seconds": outcome.get("seconds"),
        "contexts_added": summary.get("contexts") if isinstance(summary, dict) else None,
        "answerable_after_add": answerable,
        **{k: v for k, v in load.items() if k != "latencies_ms"},
    }


def report(r: dict[str, Any]) -> str:
    b = r["batch_path"]
    lines = [
        f"BERT-{r['model_size']} on {r['environment']['cpu']} ({r['environment']['device']}),"
        f" {r['articles']} articles; load average at the start {r['environment']['load_average']}",
        f"batch path (query --file, batches of {b[0]['batch']}), before and after each level: "
        + ", ".join(f"{x['questions_per_s']:.1f}" for x in b)
        + " questions/s",
        "",
        "| server | clients | questions/s | vs batch path | mean batch | p50 ms | p99 ms | errors"
        " | partial |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, levels in r["clients"].items():
        for c in levels:
            lines.append(
                f"| {name} | {c['clients']} | {c['questions_per_s']:.1f} | {100 * c['vs_batch_path']:.0f}%"
                f" | {c['mean_batch']:.1f} | {c['p50_ms']:.0f} | {c['p99_ms']:.0f} | {c['errors']}"
                f" | {c['partial']} |"
            )
    a = r["during_add"]
    lines += [
        "",
        f"during an add of {a['articles']} articles ({a['contexts_added']} contexts,"
        f" {a['add_seconds']:.1f} s, status {a['add_status']}): 8 clients answered {a['answered']}"
        f" questions ({a['questions_per_s']:.1f}/s, p50 {a['p50_ms']:.0f} ms, p99 {a['p99_ms']:.0f} ms),"
        f" {a['errors']} errors, {a['partial']} partial;"
        f" new articles answerable after the add: {a['answerable_after_add']}",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--articles", type=int, default=300, help="index size (random keys)")
    parser.add_argument("--questions", type=int, default=256, help="questions per client level")
    parser.add_argument("--add", type=int, default=100, help="articles added while clients ask")
    parser.add_argument("--add-sentences", type=int, default=3, help="sentences per added article (>= 3)")
    parser.add_argument("--add-words", type=int, default=6, help="words per sentence of an added article")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="bound on each phase")
    parser.add_argument(
        "--no-window-only",
        dest="window_only",
        action="store_false",
        help="skip the second server that batches with the fixed window alone",
    )
    parser.add_argument("--tmp", type=Path, default=None, help="where the index is built (default: $TMPDIR)")
    run_benchmark(parser, run, report)


if __name__ == "__main__":
    main()
