"""Anytime answers on a lazy index: budget -> agreement with the exact answer, and time to the first answer.

A cold question on a lazy index encodes ``budget`` contexts of its articles (those ``encode_order`` ranks
first for it) and answers over them. Three parts, each bounded, each writing its section of ``--out``
(a part not run keeps the section an earlier run wrote):

- **agreement** (the real all-MiniLM-L6-v2 weights, layer 6, no MLM head: answers are kNN alone). The
  corpus is the real enwiki fragment; its ``--articles`` longest articles are encoded whole once
  (``exact=True``, cached under ``--work`` and resumable: a run stopped by ``--max-seconds`` goes on where
  it stopped next time) and every LAMA template (distinct texts of ``relations.jsonl``, [X] = the title,
  [Y] = [MASK], subject = the title, so IR picks the article itself) is asked exactly over it. Then, for
  every budget and ordering strategy, each question's *first* answer on a cold article is replayed: the
  rows ``order_rows`` ranks first for it (as ``LazyDatastore._pick`` takes them), their stored keys, and
  the product's ``exact_knn``, ``knn_probs`` and ``rank``. So is the *second* question on the same
  article (the previous template asked first): the first question's rows plus the best ``budget`` of the
  rest for it. Encoding every (question, budget, strategy) for real would be millions of contexts;
  the replay is checked against the real path (a fresh copy of the cold index per question, the real
  ``Config(budget=N)`` searcher and ``lazy.ORDER``) on ``--validate`` question pairs, which also gives the
  MiniLM time per question: the rows stored and the top-1 of both questions must match the replay (up to
  the encoder's bf16 rounding, which depends on what a row is batched with: a near tie may flip).
- **timing** (BERT-base shapes: a random ``BertForMaskedLM`` of BERT-base size with MiniLM's real uncased
  WordPiece vocabulary, so real sentences tokenize as with bert-base-uncased). A lazy index of the whole
  fragment (text pass), the model loaded once as in the server; for every question a fresh copy of the
  cold index: a subject question over the longest article (then a second template on the same article),
  and a free question whose BM25 top-3 are three cold articles; the repeats go over the budgets in turn,
  so that the shared machine's load falls on all of them. The exact answer's time is extrapolated from
  the fitted rate (the longest article whole is ~15k contexts, over 10 minutes here).
- **warm** (BERT-base shapes): the timing part's articles encoded whole on the lazy index (random keys,
  stored as ``exact`` stores them) against an eager index holding the same keys, asked in turn.

    python benchmarks/bench_anytime.py --out benchmarks/results/anytime-cpu.json      # all three parts
    python benchmarks/bench_anytime.py --parts agreement --out ...   # the first run encodes ~10 minutes
    python benchmarks/bench_anytime.py --parts timing,warm --out ...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from anytime_agreement import agreement
from anytime_setup import (
    FREE,
    NOWHERE,
    RELATIONS,
    TARGET_AGREEMENT,
    TARGET_FREE_S,
    TARGET_SUBJECT_S,
    base_model_dir,
    cloze,
    cold_copy,
    fragment_articles,
    minilm_dir,
    open_searcher,
    say,
    templates,
    text_pass,
)
from bench_lazy import FRAGMENT, StageClock, warm_in_turn
from common import LAYER, Progress, cache_dir, environment, percentiles, write_results

from bertknn_search.backends import open_backend
from bertknn_search.backends.encode_order import STRATEGIES
from bertknn_search.config import CPU_BUDGET, Config
from bertknn_search.encoding.encoder import Encoder
from bertknn_search.ingest.contexts import build_blocks, make_rows
from bertknn_search.ingest.pipeline import index_meta
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.records import Article, EncodedArticle, Question


# -- part 2: timing ----------------------------------------------------------------------------------
def timing(args: argparse.Namespace, progress: Progress) -> None:
    work = args.work
    minilm = minilm_dir(work)
    model = base_model_dir(work, minilm, args.seed)
    articles = fragment_articles(args.source)
    by_title = {a.title: a for a in articles}
    longest = max(articles, key=lambda a: (len(a.text), a.id))
    tpls = templates(args.relations, args.templates)
    cfg = Config(model=str(model), layer=LAYER, device="cpu", contexts="lazy")
    pristine = work / "base-lazy"
    encoder = Encoder(str(model), LAYER, "cpu", cfg.max_length, "auto")
    seconds = text_pass(articles, cfg.replace(index=pristine), encoder)
    scratch = work / "scratch-timing"
    section: dict[str, Any] = {
        "model": "random BertForMaskedLM of BERT-base shapes, MiniLM's (bert-base-uncased's) vocabulary",
        "precision": encoder.precision,
        "text_pass_seconds": seconds or None,
        "budgets": list(args.timing_budgets),
        "default_budget": CPU_BUDGET,
    }
    with cold_copy(pristine, scratch, cfg, encoder) as searcher:
        searcher.answer(NOWHERE)  # first-call allocations, as a server has done before its first question
        meta = searcher.backend.meta()
        rows = make_rows([split_sentences(longest.text)], encoder, meta.mask_policy, meta.max_length)
    section["subject_article"] = {"title": longest.title, "contexts": len(rows)}
    progress.done("timing: model and cold index", f"{longest.title}: {len(rows):,} contexts", timing=section)

    subject_qs = [cloze(t, longest.title) for _, t in tpls[: args.timing_repeats + 1]]
    free_qs = [
        cloze(t, title, subject=False) for t, title in FREE[: args.timing_repeats] if title in by_title
    ]
    budgets = list(args.timing_budgets)
    by_budget: dict[str, dict[int, list[dict[str, Any]]]] = {"subject": {}, "free": {}}
    # Repeats in turn over the budgets (the order reversed every other one), so that the shared machine's
    # load drifts over all budgets alike.
    for r, (q, nxt) in enumerate(_pairs(subject_qs)):
        for b in budgets if r % 2 == 0 else budgets[::-1]:
            config = cfg.replace(budget=b)
            by_budget["subject"].setdefault(b, []).append(
                cold_run(config, pristine, scratch, encoder, q, nxt)
            )
            if r < len(free_qs):
                by_budget["free"].setdefault(b, []).append(
                    cold_run(config, pristine, scratch, encoder, free_qs[r], None)
                )
        for kind, runs in by_budget.items():
            section[kind] = {str(b): summarize(runs[b]) for b in budgets if b in runs}
        progress.done(
            f"timing: repeat {r + 1}",
            ", ".join(
                f"{b}: {section['subject'][str(b)]['seconds']['p50_ms'] / 1000:.2f} s" for b in budgets
            ),
            timing=section,
        )
    section["fit"] = fit([run for runs in by_budget["subject"].values() for run in runs])
    section["exact_extrapolated"] = extrapolate(section, len(rows))
    progress.done("timing: exact (extrapolated)", json.dumps(section["exact_extrapolated"]), timing=section)


def warm(args: argparse.Namespace, progress: Progress) -> None:
    """Warm lazy questions against eager ones over the timing part's articles (BERT-base shapes)."""
    model = base_model_dir(args.work, minilm_dir(args.work), args.seed)
    articles = fragment_articles(args.source)
    by_id = {a.id: a for a in articles}
    longest = max(articles, key=lambda a: (len(a.text), a.id))
    tpls = templates(args.relations, args.templates)
    cfg = Config(model=str(model), layer=LAYER, device="cpu", contexts="lazy")
    encoder = Encoder(str(model), LAYER, "cpu", cfg.max_length, "auto")
    pristine = args.work / "base-lazy"
    text_pass(articles, cfg.replace(index=pristine), encoder)
    subject_q = cloze(tpls[0][1], longest.title)
    free_qs = [cloze(t, title, subject=False) for t, title in FREE]
    with cold_copy(pristine, args.work / "scratch-warm", cfg, encoder) as searcher:
        ids = {h.id: None for q in free_qs for h in searcher.retrieve(q)}
    chosen = [longest, *(by_id[i] for i in ids if i != longest.id)]
    results = warm_vs_eager(args, cfg, encoder, chosen, subject_q, free_qs)
    progress.done(
        "warm vs eager",
        f"subject {results['subject']['warm_over_eager_p50']:.2f},"
        f" free {results['free']['warm_over_eager_p50']:.2f}",
        warm=results,
    )


def _pairs(qs: Sequence[Question]) -> list[tuple[Question, Question]]:
    return [(qs[i], qs[i + 1]) for i in range(len(qs) - 1)]


def cold_run(
    config: Config, pristine: Path, scratch: Path, encoder: Encoder, q: Question, then: Question | None
) -> dict[str, Any]:
    """``q`` on a fresh cold copy of the index (then ``then`` on the same copy): seconds, contexts, stages."""
    with cold_copy(pristine, scratch, config, encoder) as searcher:
        clock = StageClock(searcher.backend.store)
        try:
            started = time.perf_counter()
            answer = searcher.answer(q)
            seconds = time.perf_counter() - started
            run = {
                "question": q.text,
                "seconds": seconds,
                "contexts": searcher.backend.encoded_contexts,
                "encode_seconds": clock.seconds["encode"],
                "articles": [h.title for h in answer.articles],
                "coverage": {aid: dataclasses.asdict(c) for aid, c in answer.coverage.items()},
                "partial": answer.partial,
            }
            if then is not None:
                before = searcher.backend.encoded_contexts
                started = time.perf_counter()
                searcher.answer(then)
                run["second_seconds"] = time.perf_counter() - started
                run["second_contexts"] = searcher.backend.encoded_contexts - before
        finally:
            clock.close()
    say(
        f"cold {config.budget}: {run['seconds']:.2f} s, {run['contexts']} contexts"
        f" ({run['encode_seconds']:.2f} s encoding) over {', '.join(run['articles'])}"
        + (f"; second question {run['second_seconds']:.2f} s" if "second_seconds" in run else "")
    )
    return run


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = {
        "seconds": percentiles([r["seconds"] for r in runs]),
        "contexts": float(np.mean([r["contexts"] for r in runs])),
        "encode_seconds": float(np.mean([r["encode_seconds"] for r in runs])),
        "outside_encoder_seconds": float(np.mean([r["seconds"] - r["encode_seconds"] for r in runs])),
        "encoder_contexts_per_s": float(
            sum(r["contexts"] for r in runs) / max(sum(r["encode_seconds"] for r in runs), 1e-9)
        ),
        "runs": runs,
    }
    if all("second_seconds" in r for r in runs):
        out["second_seconds"] = percentiles([r["second_seconds"] for r in runs])
    return out


def fit(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Seconds = fixed + contexts / rate, least squares over the subject runs; the budget of 3 s from it."""
    x = np.array([r["contexts"] for r in runs], dtype=np.float64)
    y = np.array([r["seconds"] for r in runs], dtype=np.float64)
    slope, fixed = np.polyfit(x, y, 1)
    return {
        "fixed_seconds": float(fixed),
        "contexts_per_s": float(1 / slope),
        "budget_at_3s": float((TARGET_SUBJECT_S - fixed) / slope),
        "encoder_contexts_per_s": float(
            sum(r["contexts"] for r in runs) / max(sum(r["encode_seconds"] for r in runs), 1e-9)
        ),
    }


def extrapolate(section: dict[str, Any], total: int) -> dict[str, float]:
    """The exact answer's time: every context at the fitted rate, plus the fixed part."""
    f = section["fit"]
    return {
        "contexts": total,
        "contexts_per_s": f["contexts_per_s"],
        "seconds": f["fixed_seconds"] + total / f["contexts_per_s"],
    }


def warm_vs_eager(
    args: argparse.Namespace,
    cfg: Config,
    encoder: Encoder,
    articles: Sequence[Article],
    subject_q: Question,
    free_qs: Sequence[Question],
) -> dict[str, Any]:
    """Warm lazy (articles stored whole, as ``exact`` leaves them) against eager, the same random keys."""
    rng = np.random.default_rng(args.seed)
    lazy_cfg = cfg.replace(index=args.work / "scratch-warm-lazy", contexts="lazy")
    eager_cfg = cfg.replace(index=args.work / "scratch-warm-eager", contexts="eager")
    sentences = [split_sentences(a.text) for a in articles]
    rows = make_rows(sentences, encoder, cfg.mask_policy, cfg.max_length)
    keys = rng.standard_normal((len(rows), encoder.dim), dtype=np.float32).astype(np.float16)
    blocks = build_blocks(list(articles), sentences, rows, keys, cfg)
    for c in (lazy_cfg, eager_cfg):
        shutil.rmtree(c.index, ignore_errors=True)
        backend = open_backend(c, create=index_meta(c, encoder))
        try:
            if c.contexts == "eager":
                backend.add_articles(blocks)
            else:
                backend.add_articles([EncodedArticle(b.article, None, b.fingerprint) for b in blocks])
                backend.put_contexts(blocks)  # whole: what an exact question (or warm) stores
        finally:
            backend.close()
    lazy_s, eager_s = open_searcher(lazy_cfg, encoder), open_searcher(eager_cfg, encoder)
    out: dict[str, Any] = {"articles": [a.title for a in articles], "contexts": len(rows)}
    try:
        for kind, qs in (("subject", [subject_q]), ("free", free_qs)):
            for s in (lazy_s, eager_s):
                for q in qs:
                    s.answer(q)  # the lazy side checks, once, that nothing is missing; both warm up
            assert all(c.complete for c in lazy_s.backend.coverage([a.id for a in articles]).values())
            warm, eager = warm_in_turn(lazy_s, eager_s, list(qs), args.warm_rounds)
            out[kind] = {
                "warm": percentiles(warm),
                "eager": percentiles(eager),
                "warm_over_eager_p50": percentiles(warm)["p50_ms"] / percentiles(eager)["p50_ms"],
                "encoded_while_warm": lazy_s.backend.encoded_contexts,
            }
    finally:
        lazy_s.close()
        eager_s.close()
        for c in (lazy_cfg, eager_cfg):
            shutil.rmtree(c.index, ignore_errors=True)
    return out


# -- report ------------------------------------------------------------------------------------------


def report(r: dict[str, Any]) -> str:
    lines = [f"anytime answers ({r['env']['cpu']}, load {r['env']['load_average']})"]
    a = r.get("agreement", {})
    if "first" in a:
        budgets = a["budgets"]
        lines.append(
            f" agreement with the exact top-1, {a['questions']} questions over {len(a['articles'])} articles"
            f" ({min(x['contexts'] for x in a['articles']):,}-{max(x['contexts'] for x in a['articles']):,}"
            f" contexts), MiniLM; {a['exact_stopword_share']:.0%} of exact answers are stopwords, 'content':"
            f" the {a['content_questions']} other questions; 'stopwd': stopword share of first answers"
        )
        lines.append(f"  {'budget':<17}" + "".join(f"{b:>8}" for b in budgets))
        for case, name in (("first", "first"), ("second", "second"), ("first_content", "content")):
            for s, by in a[case].items():
                lines.append(f"  {name:<8}{s:<9}" + "".join(f"{by[str(b)]:>8.1%}" for b in budgets))
        for s, shares in a["first_stopword_share"].items():
            lines.append(f"  stopwd  {s:<9}" + "".join(f"{x:>8.1%}" for x in shares))
        for s, by in a["neighbour_recall"].items():
            lines.append(f"  recall  {s:<9}" + "".join(f"{by[str(b)]:>8.1%}" for b in budgets))
        v = a.get("validation")
        if v:
            lines.append(
                f"  real path: {v['runs']} runs, top-1 as replayed {v['first_match']} first /"
                f" {v['second_match']} second, rows {v['rows_match']}"
            )
    t = r.get("timing", {})
    if "subject" in t:
        lines.append(
            f" BERT-base shapes ({t['precision']}), cold first answer, p50 s (contexts):"
            f" subject over {t['subject_article']['title']} ({t['subject_article']['contexts']:,} contexts),"
            " free over 3 articles"
        )
        for b in t["budgets"]:
            s, f = t["subject"].get(str(b)), t["free"].get(str(b))
            if s is None or f is None:
                continue
            lines.append(
                f"  {b:>5}: subject {s['seconds']['p50_ms'] / 1000:6.2f} ({s['contexts']:.0f}), second"
                f" question {s.get('second_seconds', {}).get('p50_ms', 0) / 1000:6.2f};"
                f" free {f['seconds']['p50_ms'] / 1000:6.2f} ({f['contexts']:.0f});"
                f" encoder {s['encoder_contexts_per_s']:.1f} contexts/s"
            )
        if "fit" in t:
            f = t["fit"]
            lines.append(
                f"  fit: {f['fixed_seconds']:.2f} s + contexts / {f['contexts_per_s']:.1f} per s;"
                f" 3 s holds {f['budget_at_3s']:.0f} contexts"
            )
        if "exact_extrapolated" in t:
            e = t["exact_extrapolated"]
            lines.append(f"  exact: ~{e['seconds']:.0f} s ({e['contexts']:,} contexts, extrapolated)")
    if "warm" in r:
        for kind in ("subject", "free"):
            w = r["warm"][kind]
            lines.append(
                f" warm {kind} (BERT-base shapes): {w['warm']['p50_ms']:.0f} ms vs eager"
                f" {w['eager']['p50_ms']:.0f} ms ({w['warm_over_eager_p50']:.2f})"
            )
    lines += targets(r)
    return "\n".join(lines)


def targets(r: dict[str, Any]) -> list[str]:
    """The issue's targets against the results: the largest budget in time, the smallest at 90%."""
    lines = []
    t = r.get("timing", {})
    for kind, limit in (("subject", TARGET_SUBJECT_S), ("free", TARGET_FREE_S)):
        ok = [b for b in t.get("budgets", []) if t[kind][str(b)]["seconds"]["p50_ms"] <= 1000 * limit]
        if kind in t:
            lines.append(
                f" largest budget with a cold {kind} answer <= {limit:.0f} s at p50: {max(ok, default=None)}"
            )
    a = r.get("agreement", {})
    for s, by in a.get("first", {}).items():
        enough = [b for b in a["budgets"] if by[str(b)] >= TARGET_AGREEMENT]
        lines.append(
            f" smallest budget with {TARGET_AGREEMENT:.0%} agreement, {s}: {min(enough, default=None)}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="agreement,timing,warm", help="of agreement, timing, warm")
    parser.add_argument("--source", type=Path, default=FRAGMENT, help="an enwiki XML dump (fragment)")
    parser.add_argument("--relations", type=Path, default=RELATIONS, help="LAMA's relations.jsonl")
    parser.add_argument("--articles", type=int, default=10, help="the longest articles asked about")
    parser.add_argument("--templates", type=int, default=40, help="distinct templates per article")
    parser.add_argument(
        "--budgets", type=_ints, default=[16, 32, 48, 64, 96, 128, 256, 512, 1024, 2048, 4096, 8192]
    )
    parser.add_argument("--strategies", type=lambda s: s.split(","), default=list(STRATEGIES))
    parser.add_argument("--validate", type=int, default=6, help="question pairs asked for real")
    parser.add_argument(
        "--mask-policy", default="single-wordpiece", help="the agreement part's index (Config.mask_policy)"
    )
    parser.add_argument("--validate-budgets", type=_ints, default=[64, 512])
    parser.add_argument("--timing-budgets", type=_ints, default=[16, 32, 48, 64, 96, 128, 256])
    parser.add_argument("--timing-repeats", type=int, default=5, help="cold questions per budget and kind")
    parser.add_argument("--warm-rounds", type=int, default=24, help="times each warm question is asked")
    parser.add_argument("--max-seconds", type=float, default=840.0, help="no exact article is started after")
    parser.add_argument(
        "--work", type=Path, default=cache_dir() / "anytime", help="models and cached indexes"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    args.work.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    results: dict[str, Any] = {}
    if args.out is not None and args.out.exists():  # keep the part this run does not redo
        kept = json.loads(args.out.read_text(encoding="utf-8"))
        results.update({p: kept[p] for p in ("agreement", "timing", "warm") if p in kept and p not in parts})
    results.update(benchmark="anytime", env=environment("cpu"), parts=parts)
    progress = Progress(args.out, results)
    if "agreement" in parts:
        agreement(args, progress)
    if "timing" in parts:
        timing(args, progress)
    if "warm" in parts:
        warm(args, progress)
    progress.finish()
    print(report(results))
    write_results(args.out, results)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


if __name__ == "__main__":
    main()
