"""``bench_anytime``'s agreement part: how often a cold question's first answer (a budget of contexts,
replayed from an exact index) has the exact answer's top-1; see ``bench_anytime`` for the method."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from anytime_setup import (
    MINILM_LAYER,
    Encoded,
    Replay,
    cloze,
    cold_copy,
    fragment_articles,
    load_encoded,
    minilm_dir,
    open_searcher,
    ordering,
    ranked,
    say,
    second_rows,
    templates,
    text_pass,
)
from common import Progress, percentiles

from bertknn_search.config import Config
from bertknn_search.encoding.encoder import Encoder
from bertknn_search.query.search import Searcher
from bertknn_search.records import Article, Question
from bertknn_search.stopwords import STOPWORDS


# -- part 1: agreement -------------------------------------------------------------------------------
def build_exact(
    searcher: Searcher, articles: Sequence[Article], tpl: str, deadline: float, log: dict[str, Any]
) -> bool:
    """Encode each article whole by asking its first question with ``exact=True``; False: out of time."""
    for a in articles:
        cov = searcher.backend.coverage([a.id]).get(a.id)
        if cov is not None and cov.complete:
            continue
        if time.monotonic() > deadline:
            say(f"exact index: out of time before {a.title}; run again to go on")
            return False
        before = searcher.backend.encoded_contexts
        started = time.perf_counter()
        searcher.answer(cloze(tpl, a.title))
        seconds = time.perf_counter() - started
        contexts = searcher.backend.encoded_contexts - before
        if cov is None:  # cold: a clean time for the exact answer
            log[a.id] = {"title": a.title, "seconds": seconds, "contexts": contexts}
        say(f"exact {a.title}: {contexts:,} contexts in {seconds:.1f} s ({contexts / seconds:.0f}/s)")
    return True


def agreement(args: argparse.Namespace, progress: Progress) -> None:
    deadline = time.monotonic() + args.max_seconds
    work = args.work
    minilm = minilm_dir(work)
    articles = fragment_articles(args.source)
    longest = sorted(articles, key=lambda a: (-len(a.text), a.id))[: args.articles]
    tpls = templates(args.relations, args.templates)
    cfg = Config(
        model=str(minilm), layer=MINILM_LAYER, device="cpu", contexts="lazy", mask_policy=args.mask_policy
    )
    name = "minilm" if args.mask_policy == "single-wordpiece" else f"minilm-{args.mask_policy}"
    pristine = work / f"{name}-lazy"
    encoder = Encoder(str(minilm), MINILM_LAYER, "cpu", cfg.max_length, "auto")
    seconds = text_pass(articles, cfg.replace(index=pristine), encoder)
    section: dict[str, Any] = {
        "model": "all-MiniLM-L6-v2 (real weights, layer 6, no MLM head: kNN top-1)",
        "mask_policy": args.mask_policy,
        "precision": encoder.precision,
        "templates": len(tpls),
        "text_pass_seconds": seconds or None,
    }
    progress.done("agreement: cold lazy index", f"{len(articles)} articles", agreement=section)

    exact_dir = work / f"{name}-exact"
    if not exact_dir.exists():
        shutil.copytree(pristine, exact_dir)
    times_file = work / f"{name}-exact-times.json"
    exact_log = json.loads(times_file.read_text()) if times_file.exists() else {}
    exact = open_searcher(cfg.replace(index=exact_dir, exact=True), encoder)
    try:
        complete = build_exact(exact, longest, tpls[0][1], deadline, exact_log)
        times_file.write_text(json.dumps(exact_log, indent=2))
        if not complete:
            section["incomplete"] = "the exact index is not finished: run the agreement part again"
            progress.done("agreement: exact index", "incomplete", agreement=section)
            return
        encoded = [load_encoded(exact, a) for a in longest]
        section["articles"] = [
            {"id": e.article.id, "title": e.article.title, "contexts": e.total} for e in encoded
        ]
        section["exact_minilm"] = list(exact_log.values())
        progress.done(
            "agreement: exact index",
            ", ".join(f"{e.article.title} {e.total:,}" for e in encoded),
            agreement=section,
        )
        curve, questions = replay_all(args, exact, encoded, tpls)
        section.update(curve)
        progress.done(
            "agreement: replay",
            f"{len(questions)} questions; exact-replay mismatches {curve['exact_replay_mismatches']}",
            agreement=section,
        )
        if args.validate > 0:
            section["validation"] = validate(args, cfg, pristine, Replay(exact), questions)
            v = section["validation"]
            progress.done(
                "agreement: real path",
                f"{v['runs']} runs; top-1 as replayed {v['first_match']}/{v['runs']} first,"
                f" {v['second_match']}/{v['runs']} second; rows as replayed {v['rows_match']}/{v['runs']}",
                agreement=section,
            )
    finally:
        exact.close()


@dataclass
class Asked:
    """One question of the curve, with what the replay needs to ask it again for real."""

    q: Question
    prev: Question  # the question asked before it on the same article (its second-question case)
    art: Encoded
    exact: str | None
    orders: dict[str, np.ndarray]
    prev_orders: dict[str, np.ndarray]


def replay_all(
    args: argparse.Namespace, exact: Searcher, encoded: Sequence[Encoded], tpls: Sequence[tuple[str, str]]
) -> tuple[dict[str, Any], list[Asked]]:
    """Every question's exact top-1 (the product's, over the whole article) and its replayed first and
    second answers for every strategy and budget."""
    replay = Replay(exact)
    strategies = [*args.strategies, "random"]
    recall: dict[str, dict[int, list[float]]] = {s: {b: [] for b in args.budgets} for s in strategies}
    warm_s: list[float] = []
    mismatches = 0
    asked: list[Asked] = []
    per_question: list[dict[str, Any]] = []
    order_s = dict.fromkeys(strategies, 0.0)
    for art in encoded:
        qs = [cloze(t, art.article.title, relation=rel) for rel, t in tpls]
        states = [replay.state(q) for q in qs]
        orders: list[dict[str, np.ndarray]] = []
        for i, q in enumerate(qs):
            by: dict[str, np.ndarray] = {}
            for s in strategies:
                started = time.perf_counter()
                by[s] = ranked(q, art, s, args.seed + i)
                order_s[s] += time.perf_counter() - started
            orders.append(by)
        for i, (q, state) in enumerate(zip(qs, states)):
            started = time.perf_counter()
            truth = exact.answer(q).knn
            warm_s.append(time.perf_counter() - started)
            word = truth[0].word if truth else None
            full = np.arange(art.total)
            mismatches += replay.top1(state, art, full) != word
            nearest = art.rows_of(*_cols(replay.neighbours(state, art, full)))
            j = (i - 1) % len(qs)
            entry: dict[str, Any] = {"article": art.article.title, "question": q.text, "exact": word}
            entry["first"], entry["second"] = {}, {}
            for s in strategies:
                entry["first"][s], entry["second"][s] = [], []
                for b in args.budgets:
                    rows = orders[i][s][:b]
                    entry["first"][s].append(replay.top1(state, art, rows))
                    recall[s][b].append(float(np.isin(nearest, rows).mean()))
                    both = second_rows(orders[j][s][:b], orders[i][s], b)
                    entry["second"][s].append(replay.top1(state, art, both))
            per_question.append(entry)
            asked.append(Asked(q, qs[j], art, word, orders[i], orders[j]))
        say(f"replayed {art.article.title}: {len(qs)} questions")
    totals = [a.art.total for a in asked]
    content = [e for e in per_question if e["exact"] not in STOPWORDS]
    answers: dict[str, int] = {}
    for e in per_question:
        answers[str(e["exact"])] = answers.get(str(e["exact"]), 0) + 1
    return {
        "questions": len(asked),
        "budgets": list(args.budgets),
        "first": _agree(per_question, "first", strategies, args.budgets),
        "second": _agree(per_question, "second", strategies, args.budgets),
        # Questions whose exact answer is not a stopword (MiniLM's exact answers mostly are).
        "content_questions": len(content),
        "first_content": _agree(content, "first", strategies, args.budgets),
        "first_stopword_share": {
            s: [
                float(np.mean([e["first"][s][i] in STOPWORDS for e in per_question]))
                for i in range(len(args.budgets))
            ]
            for s in strategies
        },
        "neighbour_recall": {
            s: {str(b): float(np.mean(v)) for b, v in by.items()} for s, by in recall.items()
        },
        "mean_fraction_encoded": {
            str(b): float(np.mean([min(b, t) / t for t in totals])) for b in args.budgets
        },
        "exact_replay_mismatches": int(mismatches),
        "exact_stopword_share": 1 - len(content) / len(per_question),
        "exact_answers_top": dict(sorted(answers.items(), key=lambda kv: -kv[1])[:15]),
        "distinct_exact_answers": len(answers),
        "warm_minilm": percentiles(warm_s),
        "order_ms_per_question": {s: 1000 * t / len(asked) for s, t in order_s.items()},
        "per_question": [compact(e) for e in per_question],
    }, asked


def compact(entry: dict[str, Any]) -> dict[str, Any]:
    """A question's answers for the JSON: per strategy, the top-1 words by budget in one string."""
    words = {
        case: {s: " ".join(str(w) for w in ws) for s, ws in entry[case].items()}
        for case in ("first", "second")
    }
    return {**entry, **words}


def _agree(
    entries: Sequence[dict[str, Any]], case: str, strategies: Sequence[str], budgets: Sequence[int]
) -> dict[str, dict[str, float]]:
    """Strategy -> budget -> the fraction of ``entries`` whose ``case`` answer is the exact one."""
    return {
        s: {
            str(b): float(np.mean([e[case][s][i] == e["exact"] for e in entries]))
            for i, b in enumerate(budgets)
        }
        for s in strategies
        if entries
    }


def _cols(nb: Any) -> tuple[np.ndarray, np.ndarray]:
    return nb.sentence_ids, nb.starts


def validate(
    args: argparse.Namespace, cfg: Config, pristine: Path, replay: Replay, asked: Sequence[Asked]
) -> dict[str, Any]:
    """The replay against the real path: a fresh cold index, ``prev`` then ``q``, for a sample of pairs."""
    encoder = replay.searcher.encoder
    step = max(len(asked) // args.validate, 1)
    sample = list(asked[::step])[: args.validate]
    runs: list[dict[str, Any]] = []
    scratch = args.work / "scratch-validate"
    for a in sample:
        for s in args.strategies:
            for b in args.validate_budgets:
                with ordering(s), cold_copy(pristine, scratch, cfg.replace(budget=b), encoder) as searcher:
                    started = time.perf_counter()
                    got_first = searcher.answer(a.prev)
                    first_s = time.perf_counter() - started
                    pending = searcher.backend.store.unencoded([a.art.article.id])
                    stored = pending[0].done if pending else np.arange(a.art.total)
                    started = time.perf_counter()
                    got_second = searcher.answer(a.q)
                    second_s = time.perf_counter() - started
                    encoded = searcher.backend.encoded_contexts
                want_first = replay.top1(replay.state(a.prev), a.art, a.prev_orders[s][:b])
                both = second_rows(a.prev_orders[s][:b], a.orders[s], b)
                want_second = replay.top1(replay.state(a.q), a.art, both)
                runs.append(
                    {
                        "article": a.art.article.title,
                        "first": a.prev.text,
                        "second": a.q.text,
                        "strategy": s,
                        "budget": b,
                        "first_seconds": first_s,
                        "second_seconds": second_s,
                        "contexts_encoded": int(encoded),
                        "first_top1": _top(got_first),
                        "first_replayed": want_first,
                        "second_top1": _top(got_second),
                        "second_replayed": want_second,
                        "rows_as_replayed": bool(np.array_equal(stored, np.sort(a.prev_orders[s][:b]))),
                        "coverage_after_first": got_first.coverage[a.art.article.id].encoded,
                    }
                )
                r = runs[-1]
                say(
                    f"real {s} {b}: {r['first_seconds']:.2f} s + {r['second_seconds']:.2f} s,"
                    f" top-1 {r['first_top1']}/{r['first_replayed']},"
                    f" {r['second_top1']}/{r['second_replayed']},"
                    f" rows {'=' if r['rows_as_replayed'] else '!='}"
                )
    seconds = {
        f"{s}/{b}": percentiles([r["first_seconds"] for r in runs if (r["strategy"], r["budget"]) == (s, b)])
        for s in args.strategies
        for b in args.validate_budgets
    }
    return {
        "runs": len(runs),
        "first_match": sum(r["first_top1"] == r["first_replayed"] for r in runs),
        "second_match": sum(r["second_top1"] == r["second_replayed"] for r in runs),
        "rows_match": sum(r["rows_as_replayed"] for r in runs),
        "first_seconds_minilm": seconds,
        "per_run": runs,
    }


def _top(answer: Any) -> str | None:
    return answer.knn[0].word if answer.knn else None
