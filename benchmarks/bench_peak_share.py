"""The encoder against the machine: its contexts/s as a share of what the CPU's matrix products allow.

Issue 50.1. In one run, per model and precision:

- **the probe**: the rate (TFLOPS) of the four matrix products of an encoder block (Q/K/V as one
  (d, 3d) product, the attention output (d, d), the FFN up (d, f) and down (f, d)) at the number of token
  rows the encoder's own batches hold, in the precision's dtype, on the threads the encoder uses. It runs
  before and after the encoder's timings (the machine is shared: the two bound what it gave meanwhile);
- **FLOPs per context**, counted from the model's shapes and each encoded context's real length T, through
  the blocks the key needs (``layer``): 2 per multiply-add of the projections (4·d² + 2·d·f per token) and
  of attention's scores and weighted sum (2·T·d per token). Padding is not counted (the plain-torch
  runtime packs it away; transformers' padding is its own cost);
- **ingest**: an eager ``ingest()`` of the enwiki fragment's first articles, the model loaded (a server's or
  a long ingest's state); the encoder's own seconds (inside ``key_states_many``) and the whole ingest's;
- **a cold question**: a free question over three cold articles of a lazy index, as ``bench_first_answer``
  asks it (the floor, then ``CPU_BUDGET_S``), the encoding's seconds and the answer's;
- **runtimes** (``--runtimes``): the same rows through the plain-torch runtime (its bf16 row blocks on and
  off) and transformers, interleaved, and whether a row's key is the same in batches of another size and
  make-up (``--batchings``: the largest difference of a key encoded in batches of 128 rows sorted by length
  and in batches of 5 rows in a shuffled order).

The share is (contexts/s x FLOPs per context) / probe rate. BERT-base is the converted Google checkpoint
at ``~/.cache/bertknn-search/models/bert-base-uncased`` when it is there, else a random model of its
shapes (the same FLOPs); MiniLM is the real all-MiniLM-L6-v2 at layer 6.

    python benchmarks/bench_peak_share.py --out benchmarks/results/peak-share-cpu.json
    python benchmarks/bench_peak_share.py --models base --precisions fp32,bf16 --runtimes --batchings
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from anytime_setup import (
    FREE,
    MINILM_LAYER,
    NOWHERE,
    base_model_dir,
    cloze,
    cold_copy,
    fragment_articles,
    minilm_dir,
    text_pass,
)
from bench_lazy import FRAGMENT
from common import LAYER, environment, load_average, write_results

from bertknn_search.config import Config
from bertknn_search.encoding.encoder import Encoder
from bertknn_search.ingest.contexts import encode_rows, make_rows
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.sentences import split_sentences

REAL_BASE = Path.home() / ".cache" / "bertknn-search" / "models" / "bert-base-uncased"
POLICY = "single-wordpiece"


def context_flops(lengths: Sequence[int], d: int, f: int, layers: int) -> float:
    """FLOPs of encoding contexts of these token lengths through ``layers`` blocks (see the module note)."""
    t = np.asarray(lengths, dtype=np.float64)
    return float(np.sum(2.0 * layers * t * (4 * d * d + 2 * d * f + 2 * t * d)))


def probe(d: int, f: int, rows: int, dtype: Any, seconds: float = 1.5) -> tuple[float, float]:
    """TFLOPS of one block's four products at ``rows`` token rows in ``dtype``, per second of the clock
    and per CPU-second of this process: the best of 3 rounds each."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    shapes = [(d, 3 * d), (d, d), (d, f), (f, d)]
    weights = [(torch.randn(n, k, generator=gen).to(dtype), torch.randn(n).to(dtype)) for k, n in shapes]
    inputs = {k: torch.randn(rows, k, generator=gen).to(dtype) for k in (d, f)}
    flops = sum(2.0 * rows * k * n for k, n in shapes)

    def block() -> None:
        for (k, _), (w, b) in zip(shapes, weights):
            F.linear(inputs[k], w, b)

    with torch.inference_mode():
        block()
        best, best_cpu = 0.0, 0.0
        for _ in range(3):
            n, started, cpu = 0, time.perf_counter(), time.process_time()
            while n == 0 or time.perf_counter() - started < seconds / 3:
                block()
                n += 1
            best = max(best, n * flops / (time.perf_counter() - started))
            best_cpu = max(best_cpu, n * flops / max(time.process_time() - cpu, 1e-9))
    return best / 1e12, best_cpu / 1e12


class Meter:
    """Counts what an encoder's ``key_states_many`` encodes: the contexts' lengths and the seconds inside."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self.lengths: list[int] = []
        self.batch_rows: list[int] = []
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self._inner = encoder.key_states_many

    def _metered(self, batches: Any) -> Iterator[np.ndarray]:
        def counted() -> Iterator[Any]:
            for rows, positions in batches:
                lengths = [len(r) for r in rows]
                self.lengths.extend(lengths)
                self.batch_rows.append(sum(lengths))
                yield rows, positions

        inner = self._inner(counted())
        while True:
            started, cpu = time.perf_counter(), time.process_time()
            try:
                states = next(inner)
            except StopIteration:
                return
            finally:
                self.seconds += time.perf_counter() - started
                self.cpu_seconds += time.process_time() - cpu
            yield states

    @contextmanager
    def on(self) -> Iterator[Meter]:
        self.lengths, self.batch_rows, self.seconds, self.cpu_seconds = [], [], 0.0, 0.0
        self.encoder.key_states_many = self._metered  # type: ignore[method-assign]
        try:
            yield self
        finally:
            del self.encoder.key_states_many


def shapes(encoder: Encoder) -> tuple[int, int]:
    return int(encoder.model_config.hidden_size), int(encoder.model_config.intermediate_size)


def share(
    meter: Meter, encoder: Encoder, layer: int, seconds: tuple[float, float], tflops: tuple[float, float]
) -> dict[str, Any]:
    """Contexts per second and per CPU-second over ``seconds`` (clock, CPU), and their shares of the
    probe's ``tflops`` (per second of the clock, per CPU-second). On a shared machine the CPU share is the
    steadier one: both sides lose the same cores to the others."""
    d, f = shapes(encoder)
    flops = context_flops(meter.lengths, d, f, layer)
    n = len(meter.lengths)
    wall, cpu = seconds
    return {
        "contexts": n,
        "seconds": round(wall, 3),
        "cpu_seconds": round(cpu, 3),
        "contexts_per_s": round(n / wall, 2) if wall else 0.0,
        "contexts_per_cpu_s": round(n / cpu, 2) if cpu else 0.0,
        "mean_tokens": round(float(np.mean(meter.lengths)), 1) if n else 0.0,
        "gflop_per_context": round(flops / max(n, 1) / 1e9, 3),
        "share_of_probe": round(flops / wall / (tflops[0] * 1e12), 3) if wall else 0.0,
        "cpu_share_of_probe": round(flops / cpu / (tflops[1] * 1e12), 3) if cpu else 0.0,
    }


def run_ingest(encoder: Encoder, model: Path, layer: int, articles: list[Any], work: Path) -> dict[str, Any]:
    meter = Meter(encoder)
    index = work / "eager"
    shutil.rmtree(index, ignore_errors=True)
    config = Config(
        model=str(model),
        layer=layer,
        device="cpu",
        precision=encoder.precision,
        index=index,
        contexts="eager",
    )
    with meter.on():
        started, cpu = time.perf_counter(), time.process_time()
        summary = ingest(articles, config, progress=False, encoder=encoder)
        whole = (time.perf_counter() - started, time.process_time() - cpu)
    shutil.rmtree(index, ignore_errors=True)
    return {"meter": meter, "whole_s": whole, "contexts": summary.contexts}


def run_cold(encoder: Encoder, model: Path, layer: int, articles: list[Any], work: Path) -> dict[str, Any]:
    by_title = {a.title: a for a in articles}
    question = next(cloze(t, title, subject=False) for t, title in FREE if title in by_title)
    base = Config(model=str(model), layer=layer, device="cpu", contexts="lazy", precision=encoder.precision)
    pristine = work / f"lazy-{model.name}-{encoder.precision}"
    text_pass(articles, base.replace(index=pristine), encoder)
    scratch = work / "scratch-cold"
    with cold_copy(pristine, scratch, base, encoder) as searcher:
        searcher.answer(NOWHERE)  # first-call allocations, as a server has done before its first question
    meter = Meter(encoder)
    with cold_copy(pristine, scratch, base, encoder) as searcher, meter.on():
        started, cpu = time.perf_counter(), time.process_time()
        answer = searcher.answer(question)
        whole = (time.perf_counter() - started, time.process_time() - cpu)
    return {"meter": meter, "whole_s": whole, "question": question.text, "partial": answer.partial}


def rows_of(encoder: Encoder, articles: list[Any], limit: int, seed: int = 0) -> list[Any]:
    sentences = [split_sentences(a.text) for a in articles]
    rows = make_rows(sentences, encoder, POLICY, encoder.max_length)
    random.Random(seed).shuffle(rows)
    return rows[:limit]


def timed(fn: Callable[[], Any]) -> tuple[tuple[float, float], Any]:
    """(seconds, CPU-seconds) of ``fn()``, and what it returned."""
    started, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return (time.perf_counter() - started, time.process_time() - cpu), out


def run_runtimes(
    model: Path, layer: int, precision: str, rows: list[Any], batchings: bool, repeats: int
) -> dict[str, Any]:
    """The same rows through plain torch (bf16 row blocks on and off) and transformers, interleaved."""
    encoders: dict[str, Encoder] = {}
    for name, runtime in (("torch", "torch"), ("transformers", "transformers")):
        enc = Encoder(str(model), layer, "cpu", 512, precision, runtime)
        enc.trunk  # noqa: B018 (loads)
        encoders[name] = enc
    block = getattr(encoders["torch"].trunk, "row_block", None)
    variants: dict[str, tuple[Encoder, int | None]] = {
        "torch": (encoders["torch"], block),
        "transformers": (encoders["transformers"], None),
    }
    if block is not None:
        variants["torch_no_blocks"] = (encoders["torch"], None)
    seconds: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    keys: dict[str, np.ndarray] = {}
    for r in range(repeats + 1):  # the first round warms up and is not counted
        names = list(variants) if r % 2 == 0 else list(variants)[::-1]
        for name in names:
            enc, rb = variants[name]
            if name.startswith("torch"):
                enc.trunk.row_block = rb
            s, keys[name] = timed(lambda enc=enc: encode_rows(rows, enc, 128))
            if r:
                seconds[name].append(s)
    encoders["torch"].trunk.row_block = block
    # Each variant's best round, by the clock and by CPU-seconds (the steadier on a shared machine).
    best = {k: (min(w for w, _ in s), min(c for _, c in s)) for k, s in seconds.items()}
    out: dict[str, Any] = {
        name: {
            "best_s": round(b[0], 3),
            "best_cpu_s": round(b[1], 3),
            "contexts_per_s": round(len(rows) / b[0], 2),
            "contexts_per_cpu_s": round(len(rows) / b[1], 2),
        }
        for name, b in best.items()
    }
    for name in variants:
        if name != "transformers":
            out[name]["vs_transformers"] = round(best["transformers"][0] / best[name][0], 3)
            out[name]["vs_transformers_cpu"] = round(best["transformers"][1] / best[name][1], 3)
    if batchings:
        for name, (enc, rb) in variants.items():
            if name.startswith("torch"):
                enc.trunk.row_block = rb
            order = list(range(len(rows)))
            random.Random(1).shuffle(order)
            small = np.zeros_like(keys[name])
            for lo in range(0, len(order), 5):
                idx = order[lo : lo + 5]
                small[idx] = encode_rows([rows[i] for i in idx], enc, 5)
            diff = np.abs(small.astype(np.float32) - keys[name].astype(np.float32)).max()
            out[name]["max_diff_across_batchings"] = float(diff)
        encoders["torch"].trunk.row_block = block
    return out


def run_profile(encoder: Encoder, articles: list[Any], limit: int) -> dict[str, Any]:
    """Where an ingest's seconds go: tokenising into rows, then the encoder's ops (torch's profiler, CPU
    time of each op itself), for ``limit`` rows of ``articles`` encoded as ingest batches them."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    (wall, cpu), rows = timed(lambda: rows_of(encoder, articles, limit))
    out: dict[str, Any] = {"rows": len(rows), "make_rows_s": round(wall, 3), "make_rows_cpu_s": round(cpu, 3)}
    encode_rows(rows[:16], encoder, 128)  # warm
    with profile(activities=[ProfilerActivity.CPU]) as prof, torch.inference_mode():
        (wall, cpu), _ = timed(lambda: encode_rows(rows, encoder, 128))
    out["encode_s"], out["encode_cpu_s"] = round(wall, 3), round(cpu, 3)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    out["ops"] = [
        {
            "op": e.key,
            "calls": e.count,
            "self_ms": round(e.self_cpu_time_total / 1000, 1),
            "share": round(e.self_cpu_time_total / total, 3),
        }
        for e in events[:15]
    ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "bertknn-bench" / "anytime"
    )
    parser.add_argument("--models", default="base,minilm", help="base, minilm or both")
    parser.add_argument("--precisions", default="fp32", help="fp32, bf16 (emulated without AVX512-BF16)")
    parser.add_argument("--ingest-chars", type=int, default=4000, help="characters the eager ingest takes")
    parser.add_argument("--skip", default="", help="phases to skip: ingest, cold")
    parser.add_argument("--runtimes", action="store_true", help="plain torch against transformers")
    parser.add_argument("--batchings", action="store_true", help="keys across batchings (with --runtimes)")
    parser.add_argument("--profile", action="store_true", help="where the encoder's time goes, by op")
    parser.add_argument("--runtime-rows", type=int, default=256, help="rows --runtimes and --profile take")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import torch

    args.work.mkdir(parents=True, exist_ok=True)
    articles = fragment_articles(FRAGMENT)
    # Whole articles (an ingest stores articles) of at most --ingest-chars each, until --ingest-chars.
    ingested, chars = [], 0
    for article in articles:
        if chars >= args.ingest_chars:
            break
        if len(article.text) <= args.ingest_chars:
            ingested.append(article)
            chars += len(article.text)
    minilm = minilm_dir(args.work)
    results: dict[str, Any] = {"environment": environment("cpu"), "runs": []}
    for model_name in args.models.split(","):
        if model_name == "base":
            real = (REAL_BASE / "config.json").is_file()
            model, layer = (REAL_BASE if real else base_model_dir(args.work, minilm, 0)), LAYER
            label = "BERT-base (Google's weights)" if real else "BERT-base shapes (random weights)"
        else:
            model, layer, label = minilm, MINILM_LAYER, "all-MiniLM-L6-v2"
        for precision in args.precisions.split(","):
            encoder = Encoder(str(model), layer, "cpu", 512, precision)
            encoder.mlm  # noqa: B018 (loads: a server holds the model)
            d, f = shapes(encoder)
            dtype = torch.bfloat16 if encoder.precision == "bf16" else torch.float32
            run: dict[str, Any] = {
                "model": label,
                "layer": layer,
                "precision": encoder.precision,
                "threads": torch.get_num_threads(),
                "load_before": load_average(),
            }
            rows_per_batch = 128 * 30
            before = probe(d, f, rows_per_batch, dtype)
            phases: dict[str, dict[str, Any]] = {}
            if "ingest" not in args.skip:
                phases["ingest"] = run_ingest(encoder, model, layer, ingested, args.work)
                batch_rows = phases["ingest"]["meter"].batch_rows
                rows_per_batch = int(np.mean(batch_rows)) if batch_rows else rows_per_batch
            if "cold" not in args.skip:
                phases["cold_question"] = run_cold(encoder, model, layer, articles, args.work)
            after = probe(d, f, rows_per_batch, dtype)
            rate = (max(before[0], after[0]), max(before[1], after[1]))
            run["probe_tflops"] = {
                "rows": rows_per_batch,
                "before": [round(x, 4) for x in before],
                "after": [round(x, 4) for x in after],
                "per_s_and_per_cpu_s": [round(x, 4) for x in rate],
            }
            for name, phase in phases.items():
                meter = phase.pop("meter")
                run[name] = {
                    "encoding": share(meter, encoder, layer, (meter.seconds, meter.cpu_seconds), rate),
                    "whole": share(meter, encoder, layer, phase.pop("whole_s"), rate),
                    **phase,
                }
                e, w = run[name]["encoding"], run[name]["whole"]
                print(
                    f"{label} {encoder.precision} {name}: {e['contexts']} contexts"
                    f" ({e['mean_tokens']} tokens),"
                    f" encoding {e['contexts_per_s']}/s, {e['contexts_per_cpu_s']}/CPU-s ="
                    f" {e['share_of_probe']:.1%} / {e['cpu_share_of_probe']:.1%} of the probe's"
                    f" {rate[0]:.3f} TFLOPS / {rate[1]:.3f} per CPU-s; whole {w['seconds']} s,"
                    f" {w['cpu_seconds']} CPU-s ({w['share_of_probe']:.1%} / {w['cpu_share_of_probe']:.1%});"
                    f" load {load_average()}",
                    flush=True,
                )
            if args.profile:
                run["profile"] = run_profile(encoder, ingested, args.runtime_rows)
                print(f"{label} {encoder.precision} profile: {run['profile']}", flush=True)
            if args.runtimes:
                rows = rows_of(encoder, ingested, args.runtime_rows)
                run["runtimes"] = run_runtimes(
                    model, layer, encoder.precision, rows, args.batchings, args.repeats
                )
                run["runtimes"]["rows"] = len(rows)
                print(f"{label} {encoder.precision} runtimes: {run['runtimes']}", flush=True)
            run["load_after"] = load_average()
            results["runs"].append(run)
            write_results(args.out, results)
            del encoder
    write_results(args.out, results)


if __name__ == "__main__":
    main()
