"""Rendering: records -> human-readable text or JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from bertknn_search.records import Answer, IndexStats, Prediction


def to_json(record: Any) -> str:
    """One line of JSON for a dataclass record (paths and infinities made JSON-safe)."""
    return json.dumps(_jsonable(dataclasses.asdict(record)), ensure_ascii=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return None  # the subject's own article has no BM25 score
    if hasattr(value, "__fspath__"):
        return str(value)
    return value


def render_answer(answer: Answer, top: int) -> str:
    """The three rankings side by side, the articles searched and the sentences behind the top answers."""
    lines = [f"Q: {answer.question}"]
    if answer.subject:
        lines[0] += f"   (subject: {answer.subject})"
    if answer.articles:
        arts = ", ".join(
            f"{a.title} [own article]" if math.isinf(a.score) else f"{a.title} [{a.score:.2f}]"
            for a in answer.articles
        )
        lines.append(f"articles: {arts}")
    else:
        lines.append("articles: none found; BERT-kNN falls back to BERT" if answer.n_neighbors == 0 else "")
    lines.append(f"neighbours: {answer.n_neighbors}")
    lines.append(f"{'#':>3}  {'BERT-kNN':<24}{'BERT':<24}{'kNN':<24}")
    for i in range(top):
        cells = [_cell(ranking, i) for ranking in (answer.bert_knn, answer.bert, answer.knn)]
        if not any(cells):
            break
        lines.append(f"{i + 1:>3}  " + "".join(f"{c:<24}" for c in cells))
    for ev in answer.evidence:
        lines.append(f"evidence for {ev.word!r}:")
        for s in ev.sentences:
            marked = f"{s.sentence[: s.start]}[{s.sentence[s.start : s.end]}]{s.sentence[s.end :]}"
            lines.append(f"  - {marked}  ({s.title}, d²={s.distance:.2f})")
    return "\n".join(line for line in lines if line)


def _cell(ranking: list[Prediction], i: int) -> str:
    if i >= len(ranking):
        return ""
    p = ranking[i]
    return f"{p.word[:14]:<15}{p.prob:.4f}"


def render_stats(stats: IndexStats) -> str:
    m = stats.meta
    rows = [
        ("backend", stats.backend),
        ("location", stats.location),
        ("articles", f"{stats.articles:,}"),
        ("sentences", f"{stats.sentences:,}"),
        ("contexts", f"{stats.contexts:,}"),
        ("model", m.model),
        ("layer", str(m.layer)),
        ("dimension", str(m.dim)),
        ("mask policy", m.mask_policy),
        ("store dtype", m.store_dtype),
        ("bytes on disk", f"{stats.bytes_on_disk:,} ({human_bytes(stats.bytes_on_disk)})"),
    ]
    if stats.contexts:
        rows.append(("bytes per context", f"{stats.bytes_on_disk / stats.contexts:,.0f}"))
    return "\n".join(f"{k:<18}{v}" for k, v in rows)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"
