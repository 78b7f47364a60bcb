"""A converted model checked by a few fixed masked-LM answers ("The capital of France is [MASK]." -> paris).

Run in the plain-torch runtime (the one a question uses) on the folder's own files: a wrong mapping
(an untransposed kernel, swapped LayerNorm parameters, a tokenizer that does not lower-case) gives noise,
not these answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bertknn_search.models.catalog import Check


@dataclass(frozen=True)
class Answered:
    """What the model put first for a check, and where the expected answer ranked (None: not in its top)."""

    check: Check
    top: tuple[tuple[str, float], ...]
    rank: int | None

    @property
    def ok(self) -> bool:
        return self.rank is not None and self.rank < self.check.within

    def line(self) -> str:
        best = ", ".join(f"{word} {p:.3f}" for word, p in self.top[:3])
        verdict = "ok" if self.ok else f"expected {self.check.answer!r} in the top {self.check.within}"
        return f"{self.check.sentence} -> {best} ({verdict})"


def answer_checks(folder: Path, checks: tuple[Check, ...], top: int = 10) -> list[Answered]:
    """Each check's top answers from the model in ``folder`` (fp32, on the CPU, one batch)."""
    import torch

    from bertknn_search.encoding.bert_torch import load
    from bertknn_search.encoding.tokenizer_file import FileTokenizer

    tokenizer = FileTokenizer(folder)
    model, _missing = load(folder, torch.float32)
    rows = tokenizer([c.sentence for c in checks])["input_ids"]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [int(tokenizer.pad_token_id or 0)] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.inference_mode():
        logits = model(ids, mask).logits
    out = []
    for row, check in enumerate(checks):
        position = rows[row].index(tokenizer.mask_token_id)
        probs = torch.softmax(logits[row, position].float(), dim=-1)
        values, best = probs.topk(top)
        words = tokenizer.convert_ids_to_tokens(best.tolist())
        ranked = tuple(zip(words, values.tolist()))
        rank = next((i for i, (word, _) in enumerate(ranked) if word == check.answer), None)
        out.append(Answered(check, ranked, rank))
    return out
