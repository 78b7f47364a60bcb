"""Ingest speed: contexts/s of a naive reference-style encoder vs the project's path, in one run.

The naive baseline is how the reference code embeds a sentence: one padded batch of all its masked copies
through the whole ``BertForMaskedLM`` in fp32 with eager attention and ``output_hidden_states=True``,
keeping ``hidden_states[11]``. The project's path (``make_rows`` + ``encode_rows``) runs only the first 11
blocks, batches masked copies across sentences sorted by length, and uses SDPA (bf16 on a GPU). The
``ingest()`` row adds everything else a real run does: sentence splitting, the SQLite store and BM25
postings (written on a background thread), and loading the model.

Both paths must return the same vectors (checked below), so the ratio is speed and not less work.

``--precisions`` also times the project's path in each encoder precision (``--precision``: fp32, bf16,
int8) on the same rows, interleaved with the naive baseline over ``--repeats`` rounds so that a machine
shared with other work slows them alike (each rate is the best of its rounds), and measures how far each
precision moves the keys from fp32: cosine per row, and whether kNN ranks the same word first (p_kNN's
top word, l = 6, squared L2) for held-out contexts searched among their own article and two others, as
the IR step's top 3. ``--model``/``--layer`` take a local model instead of the random one: a trained
checkpoint shows what quantization does to real activations (random weights have no outliers).

    python benchmarks/bench_ingest.py --device cpu --model-size base --sentences 60
    python benchmarks/bench_ingest.py --device cpu --sentences 30 --precisions fp32,int8,bf16
    python benchmarks/bench_ingest.py --device cuda --model-size base --sentences 4000 --batch-sizes 128,512
"""

from __future__ import annotations

import argparse
import tempfile
import time
from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    LAYER,
    CorpusGenerator,
    argument_parser,
    build_model,
    environment,
    run_benchmark,
)

from bertknn_search.config import Config
from bertknn_search.encoding.encoder import Encoder
from bertknn_search.ingest.contexts import MaskedRow, encode_rows, make_rows
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.query.knn import knn_probs
from bertknn_search.records import Article

PAPER_CONTEXTS_PER_S = 300.0  # Kassner & Schütze 2020: per GTX 1080Ti
POLICY = "single-wordpiece"  # the project's default mask policy
# Defaults that keep a run to a few minutes: the naive path is the slow one.
DEFAULT_SENTENCES = {
    "cpu": {"base": 60, "small": 300, "tiny": 600},
    "cuda": {"base": 3000, "small": 6000, "tiny": 6000},
}


def corpus(n_sentences: int, seed: int) -> tuple[list[Article], list[list[str]]]:
    """Synthetic articles with at least ``n_sentences`` sentences, split exactly as ``ingest()`` splits."""
    gen = CorpusGenerator(seed=seed)
    articles: list[Article] = []
    sentences: list[list[str]] = []
    while sum(len(s) for s in sentences) < n_sentences:
        article = gen.article(len(articles))
        articles.append(article)
        sentences.append(split_sentences(article.text))
    return articles, sentences


def sync(device: str) -> None:
    """Wait for queued GPU work, so that a timer stops after it."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def naive_vectors(model: Any, rows: list[MaskedRow], device: str, layer: int = LAYER) -> np.ndarray:
    """The reference's way: per sentence, one batch of its masked copies through the full fp32 MLM.

    Returns:
        (len(rows), dim) float32, ``hidden_states[11]`` at each mask.
    """
    import torch

    out = []
    with torch.inference_mode():
        for _, group in groupby(rows, key=lambda r: (r.article, r.sentence)):
            batch = list(group)
            width = max(len(r.input_ids) for r in batch)
            ids = torch.zeros((len(batch), width), dtype=torch.long)
            attention = torch.zeros((len(batch), width), dtype=torch.long)
            for i, r in enumerate(batch):
                ids[i, : len(r.input_ids)] = torch.tensor(r.input_ids)
                attention[i, : len(r.input_ids)] = 1
            result = model(
                input_ids=ids.to(device), attention_mask=attention.to(device), output_hidden_states=True
            )
            at = (
                torch.arange(len(batch), device=device),
                torch.tensor([r.mask_position for r in batch], device=device),
            )
            out.append(result.hidden_states[layer][at].float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, model.config.hidden_size), np.float32)


def agreement(reference: np.ndarray, other: np.ndarray) -> dict[str, float]:
    """How far ``other`` is from the float32 ``reference`` vectors, row by row."""
    ref = reference.astype(np.float64)
    oth = other.astype(np.float64)
    diff = np.abs(ref - oth)
    cos = (ref * oth).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(oth, axis=1) + 1e-12)
    return {
        "max_abs_diff": float(diff.max()),
        "max_abs_value": float(np.abs(ref).max()),
        "mean_abs_diff": float(diff.mean()),
        "min_cosine": float(cos.min()),
    }


def knn_agreement(
    reference: np.ndarray, other: np.ndarray, rows: list[MaskedRow], vocab_size: int, max_queries: int = 400
) -> dict[str, float]:
    """Whether kNN over ``other``'s keys answers as over ``reference``'s, for held-out contexts.

    Each query is a stored context's own key (the trunk's state is the query state at the same layer);
    it searches the contexts of its article and the next two (the IR step's top 3), less its own
    sentence, once with the reference keys and query and once with the other's.

    Returns:
        same_top1 (p_kNN ranks the same word first, l = 6, squared L2), overlap@10 of the neighbours.
    """
    owner = np.array([r.article for r in rows])
    sentence = np.array([r.sentence for r in rows])
    values = np.array([r.token_id for r in rows])
    n_articles = int(owner.max()) + 1
    step = max(1, len(rows) // max_queries)
    same, overlap = [], []
    for q in range(0, len(rows), step):
        near = {(int(owner[q]) + d) % n_articles for d in range(3)}
        pool = np.flatnonzero(np.isin(owner, list(near)) & ~((owner == owner[q]) & (sentence == sentence[q])))
        if pool.size < 10:
            continue
        tops = []
        for keys in (reference, other):
            cand = keys[pool].astype(np.float32)
            d = ((cand - keys[q].astype(np.float32)) ** 2).sum(1)
            p = knn_probs(d, values[pool], vocab_size, 6.0, True)
            tops.append((int(p.argmax()), set(pool[np.argsort(d)[:10]].tolist())))
        same.append(tops[0][0] == tops[1][0])
        overlap.append(len(tops[0][1] & tops[1][1]) / 10)
    return {"queries": len(same), "same_top1": float(np.mean(same)), "overlap_at_10": float(np.mean(overlap))}


def encoder_shape(model_dir: Path) -> tuple[int, int]:
    """(hidden size, FFN size) from the model's config."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    return int(config.hidden_size), int(config.intermediate_size)


def model_flops_use(
    rows: list[MaskedRow], shape: tuple[int, int], layer: int, results: dict[str, Any], peak_tflops: float
) -> dict[str, float]:
    """Model FLOPs utilisation of our path and of ``ingest()``: useful FLOPs per second over the peak.

    Useful FLOPs of a context of T tokens through ``layer`` blocks: 2 per multiply-add of the four
    attention projections (4·d²) and the FFN (2·d·f) at every token, and of the attention scores and
    their weighted sum (2·T·d per token); padding is not counted.
    """
    d, f = shape
    tokens = np.array([len(r.input_ids) for r in rows], dtype=np.float64)
    flops = float(np.mean(2 * layer * tokens * (4 * d * d + 2 * d * f + 2 * tokens * d)))
    peak = peak_tflops * 1e12
    return {
        "gflop_per_context": flops / 1e9,
        "peak_tflops": peak_tflops,
        "ours": results["ours"]["contexts_per_s"] * flops / peak,
        "pipeline": results["pipeline"]["contexts_per_s"] * flops / peak,
    }


def timed_encode(encoder: Encoder, sentences: list[list[str]], batch: int, device: str) -> tuple[float, Any]:
    """Seconds for ``make_rows`` + ``encode_rows`` over ``sentences``, and the vectors."""
    sync(device)
    started = time.perf_counter()
    vectors = encode_rows(make_rows(sentences, encoder, POLICY, encoder.max_length), encoder, batch)
    sync(device)
    return time.perf_counter() - started, vectors


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import BertForMaskedLM

    device = args.device
    n_sentences = args.sentences or DEFAULT_SENTENCES[device][args.model_size]
    model_dir = args.model or build_model(args.model_size)
    layer = args.layer
    articles, sentences = corpus(n_sentences, args.seed)
    warm_sentences = corpus(8, args.seed + 1)[1]
    results: dict[str, Any] = {
        "benchmark": "ingest",
        "env": environment(device),
        "model_size": args.model_size if args.model is None else str(args.model),
        "layer": layer,
        "sentences": sum(len(s) for s in sentences),
        "articles": len(articles),
    }
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    # Our path. Loading the trunk is timed apart: it is paid once per run, not per context.
    started = time.perf_counter()
    encoder = Encoder(str(model_dir), layer, device)
    encoder.trunk  # noqa: B018 - loads the model
    results["ours_load_s"] = time.perf_counter() - started
    warm_rows = make_rows(warm_sentences, encoder, POLICY, encoder.max_length)
    encode_rows(warm_rows, encoder, max(batch_sizes))
    rows = make_rows(sentences, encoder, POLICY, encoder.max_length)
    results["contexts"] = len(rows)
    ours: dict[str, dict[str, float]] = {}
    vectors = np.zeros((0, encoder.dim), np.float16)
    for bs in batch_sizes:
        sync(device)
        started = time.perf_counter()
        timed_rows = make_rows(sentences, encoder, POLICY, encoder.max_length)
        vectors = encode_rows(timed_rows, encoder, bs)
        sync(device)
        seconds = time.perf_counter() - started
        ours[str(bs)] = {"seconds": seconds, "contexts_per_s": len(rows) / seconds}
    best = max(ours, key=lambda b: ours[b]["contexts_per_s"])
    results["ours"] = {
        "by_batch_size": ours,
        "best_batch_size": int(best),
        "precision": encoder.precision,
        **ours[best],
    }

    if args.cpu_bf16 and device == "cpu":
        # What bf16 would give on a CPU with bf16 instructions (AVX512-BF16, AMX); not the project's default.
        encoder.trunk.to(torch.bfloat16)
        encode_rows(warm_rows, encoder, int(best))
        started = time.perf_counter()
        bf16_vectors = encode_rows(
            make_rows(sentences, encoder, POLICY, encoder.max_length), encoder, int(best)
        )
        seconds = time.perf_counter() - started
        results["ours_cpu_bf16"] = {"seconds": seconds, "contexts_per_s": len(rows) / seconds}
        encoder.trunk.to(torch.float32)
    del encoder
    if device.startswith("cuda"):
        torch.cuda.empty_cache()

    # Naive baseline, on the same rows.
    model = BertForMaskedLM.from_pretrained(str(model_dir), attn_implementation="eager").to(device).eval()
    naive_vectors(model, warm_rows, device, layer)
    sync(device)
    started = time.perf_counter()
    reference = naive_vectors(model, rows, device, layer)
    seconds = time.perf_counter() - started
    results["naive"] = {"seconds": seconds, "contexts_per_s": len(rows) / seconds}
    results["agreement_ours_vs_naive"] = agreement(reference, vectors)
    if args.precisions:
        results["precisions"] = compare_precisions(
            args, model, model_dir, sentences, rows, reference, int(best)
        )
    if "ours_cpu_bf16" in results:
        results["agreement_cpu_bf16_vs_naive"] = agreement(reference, bf16_vectors)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()

    # The whole pipeline: text -> sentences -> rows -> vectors -> SQLite, model load included.
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        config = Config(
            model=str(model_dir),
            layer=layer,
            device=device,
            batch_size=int(best),
            index=Path(tmp),
            contexts="eager",  # a lazy index (the default) would encode nothing here
        )
        summary = ingest(articles, config, progress=False)
    results["pipeline"] = {
        "seconds": summary.seconds,
        "contexts": summary.contexts,
        "contexts_per_s": summary.contexts_per_second,
        "contexts_per_s_without_load": summary.contexts / max(summary.seconds - results["ours_load_s"], 1e-9),
    }
    if args.peak_tflops:
        results["mfu"] = model_flops_use(rows, encoder_shape(model_dir), layer, results, args.peak_tflops)
    naive_rate = results["naive"]["contexts_per_s"]
    results["ratios"] = {
        "ours_vs_naive": results["ours"]["contexts_per_s"] / naive_rate,
        "pipeline_vs_naive": results["pipeline"]["contexts_per_s"] / naive_rate,
    }
    if args.model is None and args.model_size == "base":
        # Across hardware (a GTX 1080Ti there), so context only; the same-run ratios above are the proof.
        results["ratios"]["ours_vs_paper_1080ti"] = results["ours"]["contexts_per_s"] / PAPER_CONTEXTS_PER_S
        results["ratios"]["pipeline_vs_paper_1080ti"] = (
            results["pipeline"]["contexts_per_s"] / PAPER_CONTEXTS_PER_S
        )
    if "ours_cpu_bf16" in results:
        results["ratios"]["ours_cpu_bf16_vs_naive"] = results["ours_cpu_bf16"]["contexts_per_s"] / naive_rate
    return results


def compare_precisions(
    args: argparse.Namespace,
    naive_model: Any,
    model_dir: Path,
    sentences: list[list[str]],
    rows: list[MaskedRow],
    reference: np.ndarray,
    batch: int,
) -> dict[str, Any]:
    """Each precision against the naive baseline, rounds interleaved, and its keys against fp32's."""
    from bertknn_search.encoding.threads import cpu_flags

    device, layer = args.device, args.layer
    precisions = args.precisions.split(",")
    encoders = {p: Encoder(str(model_dir), layer, device, precision=p) for p in precisions}
    slow_bf16 = device == "cpu" and not {"avx512_bf16", "amx_bf16"} & cpu_flags()
    # bf16 is emulated on a CPU without bf16 instructions, several times slower: time it on the first
    # sentences of the first article only (their rows come first, so they line up with ``rows``).
    few = [sentences[0][: args.slow_sentences]]
    subsets = {p: few if p == "bf16" and slow_bf16 else sentences for p in precisions}
    warm = corpus(8, args.seed + 1)[1]
    loads = {}
    for p, encoder in encoders.items():
        started = time.perf_counter()
        encoder.trunk  # noqa: B018 - loads (and for int8 quantizes) the model
        loads[p] = time.perf_counter() - started
        encode_rows(make_rows([warm[0][:2]], encoder, POLICY, encoder.max_length), encoder, batch)
    rates: dict[str, list[float]] = {p: [] for p in ["naive", *precisions]}
    vectors: dict[str, np.ndarray] = {}
    for _ in range(args.repeats):
        sync(device)
        started = time.perf_counter()
        naive_vectors(naive_model, rows, device, layer)
        sync(device)
        rates["naive"].append(len(rows) / (time.perf_counter() - started))
        for p, encoder in encoders.items():
            seconds, vectors[p] = timed_encode(encoder, subsets[p], batch, device)
            rates[p].append(len(vectors[p]) / seconds)
    out: dict[str, Any] = {"batch": batch, "repeats": args.repeats, "rates": rates}
    naive_best = max(rates["naive"])
    vocab = encoders[precisions[0]].vocab_size
    fp32_keys = vectors.get("fp32", reference.astype(np.float16))
    for p in precisions:
        n = len(vectors[p])
        out[p] = {
            "contexts": n,
            "load_s": loads[p],
            "contexts_per_s": max(rates[p]),
            "vs_naive": max(rates[p]) / naive_best,
            "keys_vs_naive_fp32": agreement(reference[:n], vectors[p]),
            "knn_vs_fp32": knn_agreement(fp32_keys[:n], vectors[p], rows[:n], vocab),
        }
    return out


def model_name(size: str) -> str:
    return f"BERT-{size} (random weights)" if size in ("base", "small", "tiny") else f"model {size}"


def mfu_line(m: dict[str, float]) -> str:
    return (
        f"  MFU ({m['gflop_per_context']:.2f} GFLOP a context, peak {m['peak_tflops']:g} TFLOP/s):"
        f" ours {m['ours']:.1%}, ingest() {m['pipeline']:.1%}"
    )


def report(r: dict[str, Any]) -> str:
    """The results as a few readable lines."""
    env = r["env"]
    where = env.get("gpu", env["cpu"])
    lines = [
        f"ingest benchmark: {model_name(r['model_size'])}, layer {r.get('layer', LAYER)},"
        f" {r['sentences']} sentences,"
        f" {r['contexts']} contexts, on {where} ({env['device']}, torch {env['torch']},"
        f" {env['torch_threads']} threads)",
        f"  naive (full MLM, fp32, eager, per-sentence batch): {r['naive']['contexts_per_s']:10.1f} ctx/s",
    ]
    for bs, row in r["ours"]["by_batch_size"].items():
        lines.append(
            f"  ours  (trunk, length-sorted batch {bs:>5}):          {row['contexts_per_s']:10.1f} ctx/s"
        )
    if "ours_cpu_bf16" in r:
        rate = r["ours_cpu_bf16"]["contexts_per_s"]
        lines.append(f"  ours, bf16 trunk on the CPU (not the default):      {rate:10.1f} ctx/s")
    p = r["pipeline"]
    lines += [
        f"  ingest() end to end (split, encode, SQLite, load):   {p['contexts_per_s']:10.1f} ctx/s"
        f"  ({p['contexts_per_s_without_load']:.1f} without the {r['ours_load_s']:.1f} s model load)",
        "  ratios (same run): " + ", ".join(f"{k} {v:.2f}x" for k, v in r["ratios"].items()),
        *([mfu_line(r["mfu"])] if "mfu" in r else []),
        "  same vectors: " + ", ".join(f"{k} {v:.4g}" for k, v in r["agreement_ours_vs_naive"].items()),
    ]
    if "agreement_cpu_bf16_vs_naive" in r:
        a = r["agreement_cpu_bf16_vs_naive"]
        lines.append("  bf16 trunk vectors: " + ", ".join(f"{k} {v:.4g}" for k, v in a.items()))
    if "precisions" in r:
        pr = r["precisions"]
        naive = ", ".join(f"{v:.1f}" for v in pr["rates"]["naive"])
        lines.append(f"  precisions, {pr['repeats']} interleaved rounds (best of each), naive {naive} ctx/s:")
        for p, row in pr.items():
            if not isinstance(row, dict) or "vs_naive" not in row:
                continue
            keys, knn = row["keys_vs_naive_fp32"], row["knn_vs_fp32"]
            lines.append(
                f"    {p:<5} {row['contexts_per_s']:8.1f} ctx/s = {row['vs_naive']:.2f}x naive"
                f" ({row['contexts']} contexts, load {row['load_s']:.1f} s); keys vs fp32: cosine min"
                f" {keys['min_cosine']:.4f}; kNN same top-1 {knn['same_top1']:.3f},"
                f" overlap@10 {knn['overlap_at_10']:.3f} ({knn['queries']} queries)"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--sentences", type=int, default=None, help="default: a few minutes' worth per device"
    )
    parser.add_argument("--batch-sizes", default="128", help="comma-separated batch sizes for our path")
    parser.add_argument("--cpu-bf16", action="store_true", help="also time a bf16 trunk on the CPU")
    parser.add_argument("--precisions", default="", help="e.g. fp32,int8,bf16: time and compare each")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved rounds for --precisions")
    parser.add_argument(
        "--slow-sentences", type=int, default=4, help="sentences for bf16 on a CPU without bf16 instructions"
    )
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="the device's peak (H100 SXM bf16 dense: 989) for MFU"
    )
    parser.add_argument("--model", type=Path, default=None, help="a local model instead of a random one")
    parser.add_argument("--layer", type=int, default=LAYER, help="the key layer (11 of BERT-base's 12)")
    run_benchmark(parser, run, report)


if __name__ == "__main__":
    main()
