"""Grid search over N, k, l and λ from one encoding pass; writes the best setting as a settings file."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bertknn_search import progress_lines
from bertknn_search.config import Config, settings_file_values
from bertknn_search.errors import ConfigError
from bertknn_search.eval.datasets import Fact
from bertknn_search.eval.harness import Prepared, batches, prepare, vocab_mask
from bertknn_search.eval.metrics import NO_ARTICLE
from bertknn_search.query.gates import SIGNALS, confidence, learn_thresholds
from bertknn_search.query.knn import knn_probs
from bertknn_search.query.search import Searcher
from bertknn_search.records import Neighbors
from bertknn_search.values import Candidates, ValueSpace

GRID_KEYS = ("n_articles", "k", "temperature", "lam")
CASTS = {"n_articles": int, "k": int, "temperature": float, "lam": float}


def top1_hits(p: np.ndarray, gold: Sequence[int], allowed: np.ndarray | None) -> np.ndarray:
    """Whether each row's most probable id is gold, with ``interpolate.rank``'s rules.

    Args:
        p: (L, V) distributions, one per λ.
        gold: the ids that count as correct.
        allowed: optional (V,) bool candidate mask.

    Returns:
        (L,) bool. Ties go to the lower id (argmax does that); an all-zero row has no answer.
    """
    scores = p if allowed is None else np.where(allowed, p, -1.0)
    best = scores.argmax(axis=1)
    return np.isin(best, list(gold)) & (scores[np.arange(len(best)), best] > 0)


def grid_search(
    searcher: Searcher,
    facts: Sequence[Fact],
    grid: Mapping[str, Sequence[float]],
    out_path: Path,
    *,
    config: Config | None = None,
    common_vocab: Collection[str] | None = None,
    batch_size: int | None = None,
    progress: bool = False,
    gate: str | None = None,
) -> dict[str, Any]:
    """Find the (N, k, l, λ) with the best BERT-kNN mean P@1, macro-averaged over relations.

    Each question is encoded once and retrieved once with the largest N; neighbours are searched once per
    N with the largest k, and smaller k take the nearest prefix, so every (k, l, λ) is cheap. Facts
    without any retrieved context are left out (as ``evaluate`` does by default).

    Args:
        searcher: an open Searcher.
        facts: the tuning facts (the paper used SQuAD and ConceptNet).
        grid: values per key of ``GRID_KEYS``; a missing key keeps ``config``'s value.
        out_path: receives the best setting, a JSON file ``Config.with_settings_file`` reads. Every
            setting's score goes next to it, to ``<stem>.grid.json``.
        config: the other settings (distance, use_ir, batch size); default ``searcher.config``.
        common_vocab: restrict answers and candidates to LAMA's common vocabulary.
        batch_size: questions per model call.
        progress: show a progress bar.
        gate: also learn adaptive-retrieval thresholds at the best setting, for every signal the facts
            have (popularity needs PopQA's or the index's): per relation and for all ("*"), maximising
            adaptive accuracy (``gates.learn_thresholds``). The file then holds them and turns ``gate``
            on ("none": thresholds only, for ``eval run`` to report). None learns none.

    Returns:
        ``{"best": settings, "score": P@1, "facts": scored facts, "read": facts read, "skipped": reason ->
        count, "ties": settings sharing the best score, "grid": [settings + score, ...]}``, and with
        ``gate`` ``"gates"``: signal -> relation -> threshold, dev adaptive accuracy, BERT's and
        BERT-kNN's accuracy, the share retrieved and the facts. Settings are
        keyed by Config field; the file written spells them as the flags (``lambda``, ``n-articles``).
        Among tied settings the first in grid order wins (the values listed first).

    Raises:
        ConfigError: an unknown key, an empty value list, a value ``Config`` rejects, or no scorable fact.
    """
    config = config or searcher.config
    if gate in ("top1", "entropy") and not searcher.encoder.has_head:
        raise ConfigError(f"--gate {gate} needs BERT's distribution, and this model has no masked-LM head")
    values = _grid_values(grid, config)
    common = vocab_mask(searcher, common_vocab) if common_vocab is not None else None
    ready, unscorable = prepare(searcher, facts, common)
    # Special tokens are never answers, as in the rankings ``evaluate`` scores.
    answerable = Candidates(searcher.answerable)
    allowed = answerable if common is None else common & answerable
    shape = tuple(len(v) for v in values.values())
    hits = np.zeros((*shape, len(ready)), dtype=bool)
    scored = np.zeros(len(ready), dtype=bool)
    bert_hits = np.zeros(len(ready), dtype=bool)
    signals: dict[str, list[float | None]] = {signal: [] for signal in SIGNALS}
    size, j = batch_size or config.batch_for(searcher.encoder.placement.device.type), 0
    with tqdm(total=len(ready), disable=not progress, desc="grid", file=progress_lines.stream()) as bar:
        for batch in batches(ready, size):
            questions = [p.question for p in batch]
            states, p_bert = searcher.encode(questions)
            if gate is not None:
                signals["popularity"] += searcher.gate_signal("popularity", questions, p_bert)
                if p_bert is not None:
                    for name, found in confidence(p_bert, searcher.answerable).items():
                        signals[name] += found.tolist()
            for item, state, pb in zip(batch, states, [None] * len(batch) if p_bert is None else p_bert):
                scored[j] = _fact_hits(searcher, item, state, pb, values, config, allowed, hits[..., j])
                bert_hits[j] = pb is not None and bool(top1_hits(pb[None, :], item.gold, allowed.mask)[0])
                j += 1
            bar.update(len(batch))
    skipped = Counter(reason for _, reason in unscorable)
    if (~scored).any():
        skipped[NO_ARTICLE] = int((~scored).sum())
    if not scored.any():
        reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items()))
        raise ConfigError(f"no tuning fact could be scored: {len(facts)} read, all skipped ({reasons})")
    scores = _macro(hits[..., scored], [p.fact for p, s in zip(ready, scored) if s])
    table = [
        {**dict(zip(GRID_KEYS, combo)), "score": float(scores[index])}
        for index, combo in zip(np.ndindex(shape), itertools.product(*values.values()))
    ]
    # The first maximum in grid order wins, so ties go to the values listed first.
    best = max(table, key=lambda row: row["score"])
    settings: dict[str, Any] = {key: best[key] for key in GRID_KEYS}
    learned = {}
    if gate is not None:
        at = np.unravel_index(table.index(best), shape)
        kept = np.flatnonzero(scored)
        relations = [ready[i].fact.relation for i in kept]
        # A model without an MLM head records no confidence signals: those gates learn nothing.
        for signal, found in ((s, f) for s, f in signals.items() if len(f) == len(ready)):
            picked = [found[i] for i in kept]
            if any(v is not None for v in picked):
                learned[signal] = learn_thresholds(
                    signal, picked, relations, bert_hits[kept].tolist(), hits[at][kept].tolist()
                )
        settings["gate_thresholds"] = tuple(
            sorted((s, r, row["threshold"]) for s, rows in learned.items() for r, row in rows.items())
        )
        if gate != "none" and gate not in learned:
            raise ConfigError(
                f"--gate {gate}: no tuning fact has a {gate} (popularity comes from PopQA's s_pop or the"
                " index's article popularity); choose another gate"
            )
        settings["gate"] = gate
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(settings_file_values(settings), indent=2) + "\n", encoding="utf-8")
    result = {
        "best": {key: best[key] for key in GRID_KEYS},
        "score": best["score"],
        "facts": int(scored.sum()),
        "read": len(facts),
        "skipped": dict(sorted(skipped.items())),
        "ties": sum(row["score"] == best["score"] for row in table),
        "mlm_head": searcher.encoder.has_head,
        "grid": table,
    }
    if gate is not None:
        result["gate"] = gate
        result["gates"] = learned
    out_path.with_name(out_path.stem + ".grid.json").write_text(
        json.dumps(result, indent=2) + "\n", encoding="utf-8"
    )
    return result


def _fact_hits(
    searcher: Searcher,
    item: Prepared,
    state: np.ndarray,
    p_bert: np.ndarray | None,
    values: dict[str, list[Any]],
    config: Config,
    allowed: Candidates | None,
    out: np.ndarray,
) -> bool:
    """Fill ``out`` (N, k, l, λ) with the top-1 hits of one fact; False when it has no retrieved context."""
    ns, ks, temps = values["n_articles"], values["k"], values["temperature"]
    lams = np.asarray(values["lam"], dtype=np.float64)[:, None]
    vocab_size, squared = searcher.encoder.vocab_size, config.distance == "squared-l2"
    top = searcher.retrieve(item.question, max(ns)) if config.use_ir else None
    pb = None if p_bert is None else p_bert.astype(np.float64)[None, :]
    cache: dict[tuple[str, ...] | None, Neighbors] = {}
    for a, n in enumerate(ns):
        hits = None if top is None else top[:n]
        key = None if hits is None else tuple(h.id for h in hits)
        if key not in cache:  # N beyond what IR found, or no IR at all: same articles, same neighbours
            cache[key] = searcher.neighbors(state, hits, max(ks))
        nb = cache[key]
        for b, k in enumerate(ks):
            for c, temp in enumerate(temps):
                space = ValueSpace.of(nb.token_ids[:k], vocab_size)
                positions = space.index(nb.token_ids[:k])
                p_knn = knn_probs(nb.distances[:k], positions, space.size, temp, squared)
                # interpolate() falls back to BERT when there are no neighbours, and is kNN alone for a
                # model without an MLM head (every λ alike); so does this.
                if pb is None:
                    p = np.repeat(p_knn[None, :], len(lams), axis=0)
                else:
                    wide = np.stack([space.pad(row) for row in pb])
                    p = lams * p_knn + (1 - lams) * wide if p_knn.any() else np.repeat(wide, len(lams), 0)
                gold = [g for g in map(space.position, item.gold) if g is not None]
                out[a, b, c, :] = top1_hits(p, gold, None if allowed is None else allowed.over(space))
    return any(len(nb) > 0 for nb in cache.values())


def _grid_values(grid: Mapping[str, Sequence[float]], config: Config) -> dict[str, list[Any]]:
    unknown = sorted(set(grid) - set(GRID_KEYS))
    if unknown:
        raise ConfigError(f"grid keys {unknown} are not tunable here; use {list(GRID_KEYS)}")
    values = {key: [CASTS[key](v) for v in grid.get(key, [getattr(config, key)])] for key in GRID_KEYS}
    for key, vals in values.items():
        if not vals:
            raise ConfigError(f"grid key {key!r} has no values")
        for v in vals:
            config.replace(**{key: v})  # validates the range, with Config's own message
    return values


def _macro(hits: np.ndarray, facts: Sequence[Fact]) -> np.ndarray:
    """Mean over relations of the per-relation mean of ``hits`` (..., n_facts) -> (...)."""
    columns: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, fact in enumerate(facts):
        columns[(fact.corpus, fact.relation)].append(i)
    return np.mean([hits[..., idx].mean(axis=-1) for idx in columns.values()], axis=0)
