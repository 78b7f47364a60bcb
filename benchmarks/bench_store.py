"""Store codecs: bytes per context and kNN agreement with float32 keys (top-k overlap, p_kNN's answer).

Keys are real encoder states (``hidden_states[11]`` at the mask, float32) of a random-weight BERT over the
synthetic corpus; no trained checkpoint is reachable offline. Trained BERT differs in one way that matters
to a scalar quantizer: a few "outlier" dimensions hold values many times larger than the rest (Kovaleva et
al. 2021, "BERT Busters"). Each codec is therefore measured twice: on the states as they are, and with two
such dimensions added, to show how it copes with them.

For each held-out context (the query), the candidates are the contexts of its own article and two others
(the IR step's top 3) or, with ``all``, the whole store (the no-IR mode). Agreement with float32 keys:
- ``overlap@k``: |top-k ∩ float32 top-k| / k, for k = 10 and 128;
- ``recall@k_in_4k``: share of the float32 top-k found in the codec's top 4k (what a re-ranking stage
  over k·4 candidates could recover if exact keys were kept somewhere);
- ``same_top1``: p_kNN (l = 6, squared L2) ranks the same word first.

    python benchmarks/bench_store.py --articles 12
    python benchmarks/bench_store.py --device cuda --articles 200
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
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

from bertknn_search.backends import codec
from bertknn_search.encoding.encoder import Encoder
from bertknn_search.ingest.contexts import MaskedRow, make_rows
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.query.knn import knn_probs

KS = (10, 128)
RERANK_FACTOR = 4
TEMPERATURE = 6.0


def float32_states(model_dir: Path, rows: list[MaskedRow], device: str, batch_size: int) -> np.ndarray:
    """Layer-11 states at the mask in float32 (the encoder's own path rounds them to float16)."""
    import torch
    from transformers import AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the top block is left out on purpose; its load report is noise
    model = AutoModelForMaskedLM.from_pretrained(
        str(model_dir), num_hidden_layers=LAYER, attn_implementation="sdpa", dtype=torch.float32
    )
    trunk = model.base_model.to(device).eval()
    out = np.zeros((len(rows), trunk.config.hidden_size), np.float32)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].input_ids))
    with torch.inference_mode():
        for lo in range(0, len(order), batch_size):
            idx = order[lo : lo + batch_size]
            width = max(len(rows[i].input_ids) for i in idx)
            ids = torch.zeros((len(idx), width), dtype=torch.long)
            attention = torch.zeros_like(ids)
            for j, i in enumerate(idx):
                ids[j, : len(rows[i].input_ids)] = torch.tensor(rows[i].input_ids)
                attention[j, : len(rows[i].input_ids)] = 1
            hidden = trunk(input_ids=ids.to(device), attention_mask=attention.to(device)).last_hidden_state
            at = (
                torch.arange(len(idx), device=device),
                torch.tensor([rows[i].mask_position for i in idx], device=device),
            )
            out[idx] = hidden[at].float().cpu().numpy()
    return out


def add_outliers(states: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Two dimensions pushed to about −12 typical standard deviations, nearly constant across contexts."""
    sigma = float(np.median(states.std(axis=0)))
    out = states.copy()
    for dim in (states.shape[1] // 3, 2 * states.shape[1] // 3):
        out[:, dim] = -12.0 * sigma + 0.5 * sigma * rng.standard_normal(len(states))
    return out


# -- codecs: the project's, and alternatives measured against it ----------------------------------------
def project_codec(dtype: str) -> Callable[[np.ndarray], np.ndarray]:
    """Round-trip through ``bertknn_search.backends.codec`` (float16 input, as the store receives it)."""

    def roundtrip(block: np.ndarray) -> np.ndarray:
        half = block.astype(np.float16)
        return codec.decode(codec.encode(half, dtype), len(half), block.shape[1], dtype)

    return roundtrip


def int8_minmax_per_vector(block: np.ndarray) -> np.ndarray:
    """Alternative: asymmetric 8-bit codes per vector (its min and max as two float32): dim + 8 bytes."""
    lo = block.min(axis=1, keepdims=True)
    step = np.maximum(block.max(axis=1, keepdims=True) - lo, 1e-12) / 255.0
    return (np.rint((block - lo) / step) * step + lo).astype(np.float32)


def int8_minmax_per_dimension(block: np.ndarray) -> np.ndarray:
    """Alternative: 8-bit codes per dimension over one article's block (min and max per dimension stored
    with the block, 2·dim float16 per article)."""
    lo = block.min(axis=0, keepdims=True)
    step = np.maximum(block.max(axis=0, keepdims=True) - lo, 1e-12) / 255.0
    return (np.rint((block - lo) / step) * step + lo).astype(np.float32)


CODECS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], str]] = {
    "float16": (project_codec("float16"), "2·dim"),
    "int8 (codec: per-vector absmax)": (project_codec("int8"), "dim + 4"),
    "int8 per-vector min/max (alternative)": (int8_minmax_per_vector, "dim + 8"),
    "int8 per-dimension min/max per article (alternative)": (int8_minmax_per_dimension, "dim + 4·dim/n"),
}


# -- agreement -----------------------------------------------------------------------------------------
def squared_distances(queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """(Q, N) squared L2 distances, in float64 so that the expansion loses nothing that matters."""
    q = queries.astype(np.float64)
    k = keys.astype(np.float64)
    return (q * q).sum(1)[:, None] + (k * k).sum(1)[None, :] - 2.0 * q @ k.T


def nearest(d: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` smallest of ``d``, smallest first."""
    k = min(k, len(d))
    part = np.argpartition(d, k - 1)[:k]
    return part[np.argsort(d[part], kind="stable")]


def top_word(d: np.ndarray, values: np.ndarray, vocab_size: int) -> int:
    """p_kNN's first word over the 128 nearest."""
    idx = nearest(d, 128)
    return int(np.argmax(knn_probs(d[idx], values[idx], vocab_size, TEMPERATURE)))


def agreement(
    exact: np.ndarray, approx: np.ndarray, pools: list[np.ndarray], values: np.ndarray
) -> dict[str, float]:
    """Mean agreement of kNN by ``approx`` distances with kNN by ``exact`` ones, each row in its pool.

    Args:
        exact, approx: (Q, N) squared distances from each query to every stored key.
        pools: per query, the stored positions it may return.
        values: (N,) the stored words.
    """
    vocab = int(values.max()) + 1
    scores: dict[str, list[float]] = {}
    for de, da, pool in zip(exact, approx, pools):
        de, da = de[pool], da[pool]
        for k in KS:
            truth = nearest(de, k)
            scores.setdefault(f"overlap@{k}", []).append(
                len(np.intersect1d(truth, nearest(da, k))) / len(truth)
            )
            wide = nearest(da, k * RERANK_FACTOR)
            scores.setdefault(f"recall@{k}_in_{k * RERANK_FACTOR}", []).append(
                len(np.intersect1d(truth, wide)) / len(truth)
            )
        same = top_word(de, values[pool], vocab) == top_word(da, values[pool], vocab)
        scores.setdefault("same_top1", []).append(float(same))
    out = {name: float(np.mean(v)) for name, v in scores.items()}
    out.update({f"min_{name}": float(np.min(v)) for name, v in scores.items() if name.startswith("overlap")})
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    model_dir = build_model(args.model_size)
    gen = CorpusGenerator(seed=args.seed)
    sentences = [split_sentences(a.text) for a in gen.articles(args.articles)]
    encoder = Encoder(str(model_dir), LAYER, args.device)
    rows = make_rows(sentences, encoder, "single-wordpiece", encoder.max_length)
    started = time.perf_counter()
    states = float32_states(model_dir, rows, args.device, args.batch_size)
    encode_s = time.perf_counter() - started
    article = np.array([r.article for r in rows])
    values = np.array([r.token_id for r in rows])

    # Held-out queries; each searches its own article plus two others, as after the IR step.
    held = rng.choice(len(rows), size=min(args.queries, len(rows) // 4), replace=False)
    stored = np.setdiff1d(np.arange(len(rows)), held)
    pools: dict[str, list[np.ndarray]] = {"ir_top3_articles": [], "all_contexts": []}
    for q in held:
        others = rng.choice(np.setdiff1d(np.arange(args.articles), [article[q]]), size=2, replace=False)
        pools["ir_top3_articles"].append(np.flatnonzero(np.isin(article[stored], [article[q], *others])))
        pools["all_contexts"].append(np.arange(len(stored)))

    results: dict[str, Any] = {
        "benchmark": "store",
        "env": environment(args.device),
        "model_size": args.model_size,
        "articles": args.articles,
        "contexts": len(rows),
        "queries": len(held),
        "mean_ir_pool": float(np.mean([len(p) for p in pools["ir_top3_articles"]])),
        "encode_s": encode_s,
        "dim": int(states.shape[1]),
        "states": {},
    }
    for variant, keys in (("as encoded", states), ("with 2 outlier dims", add_outliers(states, rng))):
        per_codec = results["states"][variant] = {}
        for name, (roundtrip, size) in CODECS.items():
            # Every codec sees one article's block at a time, as the store writes them.
            approx = np.zeros_like(keys)
            for a in range(args.articles):
                sel = np.flatnonzero(article == a)
                approx[sel] = roundtrip(keys[sel])
            per_codec[name] = {"bytes_per_vector": size, "max_abs_error": float(np.abs(approx - keys).max())}
            exact_d = squared_distances(keys[held], keys[stored])
            approx_d = squared_distances(keys[held], approx[stored])
            for setting, pool in pools.items():
                per_codec[name][setting] = agreement(exact_d, approx_d, pool, values[stored])
    results["decode_us_per_1000_vectors"] = decode_speed(states[:1000])
    return results


def decode_speed(block: np.ndarray) -> dict[str, float]:
    """Microseconds to decode 1,000 stored vectors with the project's codec."""
    out = {}
    for dtype in codec.DTYPES:
        blob = codec.encode(block.astype(np.float16), dtype)
        started = time.perf_counter()
        for _ in range(50):
            codec.decode(blob, len(block), block.shape[1], dtype)
        out[dtype] = (time.perf_counter() - started) / 50 * 1e6 * 1000 / len(block)
    return out


def report(r: dict[str, Any]) -> str:
    lines = [
        f"store benchmark: {r['contexts']} contexts, BERT-{r['model_size']} (random weights, dim {r['dim']}),"
        f" {r['queries']} held-out queries, IR pool ≈ {r['mean_ir_pool']:.0f} contexts"
    ]
    for variant, per_codec in r["states"].items():
        lines.append(f" states {variant}:")
        for name, c in per_codec.items():
            lines.append(
                f"  {name}: {c['bytes_per_vector']} bytes/vector, max abs error {c['max_abs_error']:.4f}"
            )
            for setting in ("ir_top3_articles", "all_contexts"):
                a = c[setting]
                lines.append(
                    f"    {setting:<17} overlap@10 {a['overlap@10']:.3f} (min {a['min_overlap@10']:.2f})"
                    f"  overlap@128 {a['overlap@128']:.3f} (min {a['min_overlap@128']:.2f})"
                    f"  recall@10_in_40 {a['recall@10_in_40']:.3f}  same_top1 {a['same_top1']:.3f}"
                )
    speed = r["decode_us_per_1000_vectors"]
    lines.append("  decode, µs per 1,000 vectors: " + ", ".join(f"{k} {v:.0f}" for k, v in speed.items()))
    return "\n".join(lines)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--articles", type=int, default=12, help="corpus size (about 240 contexts each)")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=128)
    run_benchmark(parser, run, report)


if __name__ == "__main__":
    main()
