"""Fairness of the server's encoder: warm questions beside 8 exact clients and the idle completion, and
the idle completion's rate against the CLI's ``query --exact`` rate.

The model is all-MiniLM-L6-v2 (real weights, 6 BERT blocks, 384 wide; no MLM head, so answers are kNN
alone) on the CPU, through the server's batcher (``MicroBatcher``, the model loaded once per phase). The
index is lazy, over the real enwiki fragment: its 20 shortest articles are made warm up front (their real
rows with random keys, as ``bench_cold_serve`` does), the longest ones stay cold. Each phase runs on a
fresh copy of that index. A warm client asks warm subject questions back to back for ``--seconds``:

- **alone**: nothing else runs;
- **loaded**: first two budget questions leave two long articles partly encoded (the idle completion
  takes them up), then 8 clients each ask an ``exact`` question on a different long article, and the
  warm client starts once they all encode.

The phases alternate (alone, loaded, alone, loaded) so that the shared machine's load falls on both.
Reported: warm p50 / p99 per phase and the p99 ratio (target: loaded <= 1.5x alone), and how many
contexts each exact client's article got (round robin: none starved).

Then the rates, also alternated: the CLI's path (``Searcher.answer`` with ``exact``, its progress hook
only, as ``query --exact`` runs it) on a cold long article, and the server's idle completion of the same
article left partial by a budget question; each measured over ``--rate-seconds`` of encoding (preparation
not counted). Target: idle >= 80% of the CLI. Also counted: the server's log lines per article.

    python benchmarks/bench_fair_serve.py --seconds 30 --rate-seconds 30 \\
        --out benchmarks/results/fair-serve-cpu.json
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
from bench_cold_serve import FRAGMENT, store_random_contexts, tail, warm_client
from common import argument_parser, environment, run_benchmark

from bertknn_search.config import Config
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.readers import read_articles
from bertknn_search.query.search import Searcher
from bertknn_search.records import Answer, EncodeHooks, EncodeProgress, Question
from bertknn_search.server.batcher import MicroBatcher

WARM_ARTICLES = 20
EXACT_CLIENTS = 8
PARTIAL = 2  # long articles a budget question leaves partly encoded before a loaded phase


def minilm() -> Path:
    with contextlib.redirect_stdout(io.StringIO()):  # the package says hello on import
        from all_minilm_l6_v2 import extract_model

        return Path(extract_model(tempfile.mkdtemp(prefix="minilm-")))


def ask(title: str) -> Question:
    return Question(f"{title} was born in [MASK].", title)


@contextlib.contextmanager
def serving(config: Config) -> Iterator[MicroBatcher]:
    batcher = MicroBatcher(lambda: Searcher.open(config), max_batch=None, window_s=0.005, max_queue=4096)
    batcher.start()
    try:
        if not batcher.ready.wait(300):
            raise RuntimeError(f"the model did not load: {batcher.error}")
        yield batcher
    finally:
        batcher.interrupt()
        batcher.stop()


def fresh(prepared: Path, tmp: Path, name: str, config: Config) -> Config:
    target = tmp / name
    shutil.copytree(prepared, target)
    return config.replace(index=target)


def alone_phase(config: Config, warm: list[Question], seconds: float) -> list[float]:
    with serving(config) as batcher:
        warm_client(batcher, warm, config, 3)  # the first passes: allocations, caches
        return warm_client(batcher, warm, config, seconds)


def loaded_phase(
    config: Config, warm: list[Question], cold: list[str], seconds: float
) -> tuple[list[float], dict[str, Any]]:
    with serving(config) as batcher:
        warm_client(batcher, warm, config, 3)
        budget = config.replace(exact=False, budget=64)
        for title in cold[EXACT_CLIENTS : EXACT_CLIENTS + PARTIAL]:
            (partial,) = batcher.submit([ask(title)], budget)
            partial.result(timeout=600)
        exact: list[Future[Answer]] = [batcher.submit([ask(t)], config)[0] for t in cold[:EXACT_CLIENTS]]
        before = batcher.encoded
        deadline = time.monotonic() + 120
        while batcher.encoded - before < 4 * EXACT_CLIENTS and time.monotonic() < deadline:
            time.sleep(0.1)  # every exact client's encode is under way
        took = warm_client(batcher, warm, config, seconds)
        answered = sum(f.done() for f in exact)
        encoded_idle = batcher.encoded_idle
    check = Searcher.open(config)
    try:
        ids = {h.title: h.id for t in cold for h in check.retrieve(ask(t))[:1]}
        coverage = check.backend.coverage(list(ids.values()))
    finally:
        check.close()
    per_client = [coverage[ids[t]].encoded if ids.get(t) in coverage else 0 for t in cold[:EXACT_CLIENTS]]
    partial_done = [coverage[ids[t]].encoded if ids.get(t) in coverage else 0 for t in cold[EXACT_CLIENTS:]]
    return took, {
        "exact_answered": answered,
        "exact_encoded_per_client": per_client,
        "partial_encoded": partial_done,
        "encoded_idle": encoded_idle,
    }


class Rate:
    """Contexts told by progress callbacks over a window that starts at the first one (preparation is
    not counted) and ends ``seconds`` later."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.first: tuple[float, int] | None = None
        self.last: tuple[float, int] | None = None
        self.calls = 0

    def told(self, done: int) -> bool:
        """Record ``done`` contexts in all; whether the window is over."""
        now = time.monotonic()
        self.calls += 1
        if self.first is None:
            self.first = (now, done)
        self.last = (now, done)
        return now - self.first[0] >= self.seconds

    @property
    def per_second(self) -> float:
        if self.first is None or self.last is None or self.last[0] <= self.first[0]:
            return 0.0
        return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])


class _Enough(Exception):
    pass


def cli_rate(config: Config, title: str, warm: Question, seconds: float) -> float:
    """``query --exact``'s path: the Searcher with a progress hook alone, stopped after ``seconds``."""
    searcher = Searcher.open(config)
    try:
        searcher.answer(warm)  # loads the model: not counted
        rate = Rate(seconds)

        def progress(p: EncodeProgress) -> None:
            if rate.told(p.done):
                raise _Enough

        searcher.hooks = EncodeHooks(progress=progress)
        with contextlib.suppress(_Enough):
            searcher.answer(ask(title))
        return rate.per_second
    finally:
        searcher.close()


def idle_rate(config: Config, title: str, seconds: float) -> tuple[float, int, int]:
    """The server's idle completion of ``title`` left partial by a budget question: contexts/s over
    ``seconds``, the log lines it wrote meanwhile, and the contexts it encoded."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("bertknn_search.server")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with serving(config) as batcher:
            (partial,) = batcher.submit([ask(title)], config.replace(exact=False, budget=64))
            partial.result(timeout=600)
            start = batcher.encoded
            while batcher.encoded == start:  # the idle completion's first step
                time.sleep(0.01)
            t0, n0 = time.monotonic(), batcher.encoded
            logged = len(lines)
            time.sleep(seconds)
            t1, n1 = time.monotonic(), batcher.encoded
            return (n1 - n0) / (t1 - t0), len(lines) - logged, n1 - n0
    finally:
        logger.removeHandler(handler)


def run(args: Any) -> dict[str, Any]:
    model = minilm()
    articles = [a for a in read_articles(FRAGMENT) if a.text.strip()]
    by_length = sorted(articles, key=lambda a: len(a.text))
    warm = by_length[:WARM_ARTICLES]
    cold = [a.title for a in reversed(by_length[-(EXACT_CLIENTS + PARTIAL + 1) :])]
    rate_title, cold = cold[-1], cold[:-1]  # the shortest of the long ones: the rates' article
    results: dict[str, Any] = {
        "environment": environment("cpu"),
        "model": "all-MiniLM-L6-v2 (real weights, 6 blocks, no MLM head), fp32, CPU",
    }
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base = Config(
            model=str(model), layer=6, index=tmp / "prepared", device="cpu", contexts="lazy", precision="fp32"
        )
        ingest(articles, base, progress=False)
        exact = base.replace(exact=True)
        searcher = Searcher.open(exact)
        store_random_contexts(searcher, [a.id for a in warm], args.seed)
        searcher.close()
        questions = [ask(a.title) for a in warm]
        alone: list[list[float]] = []
        loaded: list[list[float]] = []
        loads: list[dict[str, Any]] = []
        for i in range(args.rounds if "warm" in args.parts else 0):
            alone.append(alone_phase(fresh(base.index, tmp, f"alone{i}", exact), questions, args.seconds))
            took, seen = loaded_phase(
                fresh(base.index, tmp, f"loaded{i}", exact), questions, cold, args.seconds
            )
            loaded.append(took)
            loads.append(seen)
            print(
                f"round {i + 1}: alone p99 {tail(alone[-1])['p99_ms']:.0f} ms, loaded p99"
                f" {tail(took)['p99_ms']:.0f} ms; {seen}",
                flush=True,
            )
        cli: list[float] = []
        idle: list[tuple[float, int, int]] = []
        for i in range(args.rounds if "rates" in args.parts else 0):
            cli.append(
                cli_rate(
                    fresh(base.index, tmp, f"cli{i}", exact), rate_title, questions[0], args.rate_seconds
                )
            )
            idle.append(idle_rate(fresh(base.index, tmp, f"idle{i}", exact), rate_title, args.rate_seconds))
            print(f"rates {i + 1}: cli {cli[-1]:.1f}/s, idle {idle[-1][0]:.1f}/s", flush=True)
    if alone:
        results.update(warm_results(alone, loaded, loads, args.seconds, cold))
    if cli:
        results.update(
            {
                "rate_article": rate_title,
                "rate_seconds": args.rate_seconds,
                "cli_exact_contexts_per_s": cli,
                "idle_contexts_per_s": [r for r, _, _ in idle],
                "idle_log_lines": [n for _, n, _ in idle],
                "idle_encoded": [e for _, _, e in idle],
                "idle_over_cli": float(np.mean([r for r, _, _ in idle]) / np.mean(cli)),
            }
        )
    return results


def warm_results(
    alone: list[list[float]],
    loaded: list[list[float]],
    loads: list[dict[str, Any]],
    seconds: float,
    cold: list[str],
) -> dict[str, Any]:
    a = tail([s for run_ in alone for s in run_])
    b = tail([s for run_ in loaded for s in run_])
    return {
        "seconds_per_phase": seconds,
        "rounds": len(alone),
        "exact_articles": cold[:EXACT_CLIENTS],
        "partial_articles": cold[EXACT_CLIENTS:],
        "warm_alone": {**a, "questions": sum(map(len, alone))},
        "warm_loaded": {**b, "questions": sum(map(len, loaded))},
        "warm_rounds_p99_ms": [[tail(x)["p99_ms"], tail(y)["p99_ms"]] for x, y in zip(alone, loaded)],
        "p50_ratio": b["p50_ms"] / a["p50_ms"],
        "p99_ratio": b["p99_ms"] / a["p99_ms"],
        "loaded_phases": loads,
    }


def report(r: dict[str, Any]) -> str:
    lines = []
    if "warm_alone" in r:
        a, b = r["warm_alone"], r["warm_loaded"]
        lines += [
            f"warm alone:  p50 {a['p50_ms']:.0f} ms, p99 {a['p99_ms']:.0f} ms, {a['questions']} asked",
            f"warm loaded: p50 {b['p50_ms']:.0f} ms, p99 {b['p99_ms']:.0f} ms, {b['questions']} asked",
            f"ratio p50 {r['p50_ratio']:.2f}, p99 {r['p99_ratio']:.2f} (target p99 <= 1.5)",
        ]
        for i, seen in enumerate(r["loaded_phases"]):
            lines.append(f"loaded {i + 1}: exact clients' contexts {seen['exact_encoded_per_client']}")
    if "cli_exact_contexts_per_s" not in r:
        return "\n".join(lines)
    lines.append(
        f"rates on {r['rate_article']!r}: CLI --exact {[round(x, 1) for x in r['cli_exact_contexts_per_s']]},"
        f" server idle {[round(x, 1) for x in r['idle_contexts_per_s']]} contexts/s:"
        f" idle/CLI {r['idle_over_cli']:.2f} (target >= 0.8); log lines {r['idle_log_lines']}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argument_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=30.0, help="each warm phase's length")
    parser.add_argument("--rate-seconds", type=float, default=30.0, help="each rate's window")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of each pair of phases")
    parser.add_argument("--parts", default="warm,rates", help="which parts to run: warm, rates")
    run_benchmark(parser, run, report)
