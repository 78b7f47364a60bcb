"""Ingest speed: contexts/s of a naive reference-style encoder vs the project's path, in one run.

The naive baseline is how the reference code embeds a sentence: one padded batch of all its masked copies
through the whole ``BertForMaskedLM`` in fp32 with eager attention and ``output_hidden_states=True``,
keeping ``hidden_states[11]``. The project's path (``make_rows`` + ``encode_rows``) runs only the first 11
blocks, batches masked copies across sentences sorted by length, and uses SDPA (bf16 on a GPU). The
``ingest()`` row adds everything else a real run does: sentence splitting, the SQLite store and BM25
postings (written on a background thread), and loading the model.

Both paths must return the same vectors (checked below), so the ratio is speed and not less work.

    python benchmarks/bench_ingest.py --device cpu --model-size base --sentences 60
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
from bertknn_search.encoder import Encoder
from bertknn_search.ingest.contexts import MaskedRow, encode_rows, make_rows
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.sentences import split_sentences
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


def naive_vectors(model: Any, rows: list[MaskedRow], device: str) -> np.ndarray:
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
            out.append(result.hidden_states[LAYER][at].float().cpu().numpy())
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


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import BertForMaskedLM

    device = args.device
    n_sentences = args.sentences or DEFAULT_SENTENCES[device][args.model_size]
    model_dir = build_model(args.model_size)
    articles, sentences = corpus(n_sentences, args.seed)
    warm_sentences = corpus(8, args.seed + 1)[1]
    results: dict[str, Any] = {
        "benchmark": "ingest",
        "env": environment(device),
        "model_size": args.model_size,
        "sentences": sum(len(s) for s in sentences),
        "articles": len(articles),
    }
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    # Our path. Loading the trunk is timed apart: it is paid once per run, not per context.
    started = time.perf_counter()
    encoder = Encoder(str(model_dir), LAYER, device)
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
    results["ours"] = {"by_batch_size": ours, "best_batch_size": int(best), **ours[best]}

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
    naive_vectors(model, warm_rows, device)
    sync(device)
    started = time.perf_counter()
    reference = naive_vectors(model, rows, device)
    seconds = time.perf_counter() - started
    results["naive"] = {"seconds": seconds, "contexts_per_s": len(rows) / seconds}
    results["agreement_ours_vs_naive"] = agreement(reference, vectors)
    if "ours_cpu_bf16" in results:
        results["agreement_cpu_bf16_vs_naive"] = agreement(reference, bf16_vectors)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()

    # The whole pipeline: text -> sentences -> rows -> vectors -> SQLite, model load included.
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        config = Config(
            model=str(model_dir), layer=LAYER, device=device, batch_size=int(best), index=Path(tmp)
        )
        summary = ingest(articles, config, progress=False)
    results["pipeline"] = {
        "seconds": summary.seconds,
        "contexts": summary.contexts,
        "contexts_per_s": summary.contexts_per_second,
        "contexts_per_s_without_load": summary.contexts / max(summary.seconds - results["ours_load_s"], 1e-9),
    }
    naive_rate = results["naive"]["contexts_per_s"]
    results["ratios"] = {
        "ours_vs_naive": results["ours"]["contexts_per_s"] / naive_rate,
        "pipeline_vs_naive": results["pipeline"]["contexts_per_s"] / naive_rate,
    }
    if args.model_size == "base":
        # Across hardware (a GTX 1080Ti there), so context only; the same-run ratios above are the proof.
        results["ratios"]["ours_vs_paper_1080ti"] = results["ours"]["contexts_per_s"] / PAPER_CONTEXTS_PER_S
        results["ratios"]["pipeline_vs_paper_1080ti"] = (
            results["pipeline"]["contexts_per_s"] / PAPER_CONTEXTS_PER_S
        )
    if "ours_cpu_bf16" in results:
        results["ratios"]["ours_cpu_bf16_vs_naive"] = results["ours_cpu_bf16"]["contexts_per_s"] / naive_rate
    return results


def report(r: dict[str, Any]) -> str:
    """The results as a few readable lines."""
    env = r["env"]
    where = env.get("gpu", env["cpu"])
    lines = [
        f"ingest benchmark: BERT-{r['model_size']} (random weights), {r['sentences']} sentences,"
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
        "  same vectors: " + ", ".join(f"{k} {v:.4g}" for k, v in r["agreement_ours_vs_naive"].items()),
    ]
    if "agreement_cpu_bf16_vs_naive" in r:
        a = r["agreement_cpu_bf16_vs_naive"]
        lines.append("  bf16 trunk vectors: " + ", ".join(f"{k} {v:.4g}" for k, v in a.items()))
    return "\n".join(lines)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument(
        "--sentences", type=int, default=None, help="default: a few minutes' worth per device"
    )
    parser.add_argument("--batch-sizes", default="128", help="comma-separated batch sizes for our path")
    parser.add_argument("--cpu-bf16", action="store_true", help="also time a bf16 trunk on the CPU")
    run_benchmark(parser, run, report)


if __name__ == "__main__":
    main()
