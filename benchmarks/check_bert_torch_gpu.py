"""The plain-torch BERT runtime on a GPU: parity with transformers, whether a row's bf16 numbers depend on
its batch, and the forward's time against transformers' (a batch of keys, as ingest runs them).

Random weights of the tiny demo shapes and of BERT-base (speed and rounding depend on shapes). Prints one
JSON object; ``--out`` writes it too.

    python benchmarks/check_bert_torch_gpu.py --out benchmarks/results/bert-torch-gpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bertknn_search.encoding.bert_torch import load

SHAPES = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 12, "num_attention_heads": 2, "intermediate_size": 128},
    "base": {},  # BertConfig's defaults are BERT-base's
}


def save(shape: dict[str, Any], out: Path) -> Path:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(**shape)).save_pretrained(out)
    return out


def batch(vocab: int, lengths: list[int], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    width = max(lengths)
    ids = torch.randint(5, vocab, (len(lengths), width), generator=g)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    return (ids * mask).to(device), mask.to(device)


def worst(a: Any, b: Any, mask: torch.Tensor) -> float:
    real = mask.bool()
    hidden = max(
        (x[real].float() - y[real].float()).abs().max().item()
        for x, y in zip(a.hidden_states, b.hidden_states)
    )
    return max(hidden, (a.logits[real].float() - b.logits[real].float()).abs().max().item())


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def seconds(fn: Any, repeats: int = 10) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def check(folder: Path, device: str) -> dict[str, Any]:
    from transformers import AutoModelForMaskedLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out: dict[str, Any] = {}
    models = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        ours = load(folder, dtype)[0].to(device)
        ref = AutoModelForMaskedLM.from_pretrained(str(folder), attn_implementation="sdpa", dtype=dtype)
        models[name] = (ours, ref.to(device).eval())
    vocab = models["fp32"][0].config.vocab_size
    limit = models["fp32"][0].config.max_position_embeddings
    ids, mask = batch(vocab, [limit, 7, 40, 3], device)
    with torch.inference_mode():
        run = {
            k: [m(input_ids=ids, attention_mask=mask, output_hidden_states=True) for m in pair]
            for k, pair in models.items()
        }
    exact = run["fp32"][1]
    out["fp32_ours_vs_transformers"] = worst(run["fp32"][0], exact, mask)
    out["bf16_ours_vs_fp32"] = worst(run["bf16"][0], exact, mask)
    out["bf16_transformers_vs_fp32"] = worst(run["bf16"][1], exact, mask)
    # Does a row's bf16 state depend on its batch? Each row alone against the whole batch.
    lengths = [int(x) for x in torch.randint(8, 60, (128,), generator=torch.Generator().manual_seed(2))]
    ids, mask = batch(vocab, lengths, device)
    ours = models["bf16"][0]
    for block in (None, 1024, 4096):
        ours.set_row_block(block)
        with torch.inference_mode():
            whole = ours.bert(ids, mask).last_hidden_state
            diff = 0.0
            for i in range(0, 128, 9):
                alone = ours.bert(
                    ids[i : i + 1, : lengths[i]], mask[i : i + 1, : lengths[i]]
                ).last_hidden_state
                diff = max(diff, (alone[0].float() - whole[i, : lengths[i]].float()).abs().max().item())
            out[f"bf16_alone_vs_batch_block_{block}"] = diff
            out[f"bf16_keys_batch_128_ms_block_{block}"] = round(
                1e3 * seconds(lambda: ours.bert(ids, mask)), 2
            )
    ours.set_row_block(None)
    ref = models["bf16"][1]
    with torch.inference_mode():
        whole = ref.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        diff = 0.0
        for i in range(0, 128, 9):
            alone = ref.bert(
                input_ids=ids[i : i + 1, : lengths[i]], attention_mask=mask[i : i + 1, : lengths[i]]
            )
            diff = max(
                diff, (alone.last_hidden_state[0].float() - whole[i, : lengths[i]].float()).abs().max().item()
            )
        out["bf16_transformers_alone_vs_batch"] = diff
        out["bf16_transformers_keys_batch_128_ms"] = round(
            1e3 * seconds(lambda: ref.bert(input_ids=ids, attention_mask=mask)), 2
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape in SHAPES.items():
            results[name] = check(save(shape, Path(tmp) / name), "cuda")
            print(name, json.dumps(results[name]), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
