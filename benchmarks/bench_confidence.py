"""Answer confidence (issues 35, 39): ``p`` fitted on LAMA T-REx and checked on whole relations left out.

Real all-MiniLM-L6-v2 weights (no MLM head: kNN only), layer 6, ``single-wordpiece-no-stopwords``, over
the LAMA evidence corpus of the first ``--per-relation`` facts of every T-REx relation in
``../shared/data`` (each fact's evidences cut to ``--evidences``); the questions are those facts'
templates (``eval run``'s). One run measures:

- exact answers (an eager index): every answer's confidence signals (``harness.evaluate``), the fit of
  ``p`` (``eval.calibration.calibrate``), each relation's answers scored by a fit made without it: AUROC,
  ECE, P@1 per band, overall, per relation and per kind of relation;
- partial answers: a lazy index answering the first ``--partial-facts`` facts of each relation under
  ``--budget`` contexts per question; their rows join the fit (so that ``p`` learns what coverage means)
  and are reported apart;
- default batch answers: a fresh lazy index answering the same facts in batches of 128 with the default
  budget (what ``query --file`` does), scored by the left-out fits.

Each kind of relation's check also says what chance allows on so few answers (``eval.sampling``: the
ECE of outcomes drawn from ``p`` itself, the AUROC's bootstrap interval). ``--features`` names the fit's
inputs (the answer's signals alone, or with the question's hardness, ``query.hardness``);
``--compare-features`` checks every set of ``FEATURE_SETS`` the same way, on relations and kinds left out.

``--write-fit`` writes the fit to the package (``bertknn_search/query/confidence_fit.json``); the
reliability diagram of the left-out ``p`` goes beside ``--out``.

    python benchmarks/bench_confidence.py --out benchmarks/results/confidence-cpu-minilm.json \
        --write-fit bertknn_search/query/confidence_fit.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from bench_whole_word import minilm
from common import environment, load_average, write_results
from date_facts import DATE_TEMPLATES, FORMS, date_facts

from bertknn_search.config import Config
from bertknn_search.eval.calibration import (
    ANSWER_FEATURES,
    BERT_ALONE_FEATURES,
    Measured,
    bert_alone_rows,
    calibrate,
    checkpoint_lines,
    choose_bands,
    from_lines,
    kind,
    kinds_left_out,
    left_out_fits,
    partial_answers,
    summary,
)
from bertknn_search.eval.datasets import Fact, read_facts
from bertknn_search.eval.evidence import evidence_files, write_evidence_corpus
from bertknn_search.eval.harness import evaluate
from bertknn_search.eval.index_calibration import never_low_kinds
from bertknn_search.eval.reliability import auc, ece, reliability
from bertknn_search.eval.report import plot_reliability
from bertknn_search.eval.sampling import ece_floor
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.query.answer_kinds import kind_of
from bertknn_search.query.confidence import (
    FEATURES,
    HARDNESS_FEATURES,
    MIN_HIGH_VOTES,
    WORD_FEATURES,
    Fit,
    no_vote_p,
)
from bertknn_search.query.search import Searcher

ROOT = Path(__file__).resolve().parents[1]
LAMA = ROOT.parent / "shared" / "data" / "lama"


def trimmed(
    lama: Path,
    out: Path,
    per_relation: int,
    evidences: int,
    dates: bool = True,
    skip: int = 0,
    date_forms: Sequence[str] = FORMS,
) -> Path:
    """A LAMA folder with the first ``per_relation`` facts of each T-REx file after its first ``skip``
    (facts a fit never saw, to check it on), evidences cut, and (with ``dates``) the date relations of
    ``date_facts``."""
    (out / "TREx").mkdir(parents=True, exist_ok=True)
    for path in sorted((lama / "TREx").glob("*.jsonl")):
        with path.open(encoding="utf-8") as handle:
            rows = [json.loads(line) for line in itertools.islice(handle, skip, skip + per_relation)]
        for row in rows:
            row["evidences"] = row["evidences"][:evidences]
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        (out / "TREx" / path.name).write_text(text, encoding="utf-8")
    relations = (lama / "relations.jsonl").read_text(encoding="utf-8")
    if dates:
        for name, rows in date_facts(lama, per_relation, skip, date_forms).items():
            text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
            (out / "TREx" / f"{name}.jsonl").write_text(text, encoding="utf-8")
            line = {"relation": name, "template": DATE_TEMPLATES[name], "label": name, "type": "N-1"}
            relations = relations.rstrip("\n") + "\n" + json.dumps(line) + "\n"
    (out / "relations.jsonl").write_text(relations, encoding="utf-8")
    return out


def same_kind_effect(checkpoint: Path) -> dict[str, Any]:
    """BERT-kNN's P@1 as answered, and with only answers of the neighbours' majority kind ranked
    (``--same-kind``), per kind of relation, from an evaluation's checkpoint lines (their top words,
    the gold's rank and the majority kind recorded in the confidence signals)."""
    table: dict[str, list[int]] = {}
    for text in checkpoint.read_text(encoding="utf-8").splitlines():
        line = json.loads(text)
        said = line.get("confidence_signals")
        rank = (line.get("ranks") or {}).get("bert_knn")
        if not said or line.get("skipped"):
            continue
        words = (line.get("top") or {}).get("bert_knn") or []
        first = next((i for i, w in enumerate(words) if kind_of(w) == said.get("majority")), None)
        row = table.setdefault(kind(line["relation"]), [0, 0, 0])
        row[0] += 1
        row[1] += rank == 1
        row[2] += first is not None and rank == first + 1
    out = {
        name: {"answers": n, "P@1": round(a / n, 4), "P@1_same_kind": round(b / n, 4)}
        for name, (n, a, b) in table.items()
    }
    n = sum(v[0] for v in table.values())
    out["all"] = {
        "answers": n,
        "P@1": round(sum(v[1] for v in table.values()) / max(n, 1), 4),
        "P@1_same_kind": round(sum(v[2] for v in table.values()) / max(n, 1), 4),
    }
    return out


def answered(
    config: Config, facts: Sequence[Fact], out: Path, batch: int | None = None
) -> tuple[list[Measured], float]:
    """``eval run``'s answers to ``facts`` under ``config``, as calibration rows, and the seconds taken."""
    start = time.perf_counter()
    searcher = Searcher.open(config)
    try:
        result = evaluate(searcher, facts, config, out, batch_size=batch, resume=False)
    finally:
        searcher.close()
    return from_lines(checkpoint_lines(result.checkpoint)), time.perf_counter() - start


def scored_left_out(rows: Sequence[Measured], fits: dict[str, Any]) -> list[float]:
    """Each row's ``p`` from the fit made without its relation."""
    return [float(fits[r.relation].probability([r.signals])[0]) for r in rows]


def finish(
    args: argparse.Namespace,
    results: dict[str, Any],
    fit: Any,
    p: Sequence[float],
    hits: list[bool],
    title: str,
) -> None:
    """The reliability diagrams of ``p`` and of kinds left out (with ``--out``), the fit (with
    ``--write-fit``), the results."""
    if args.out:
        plot_reliability(reliability(p, hits), ece(p, hits), args.out.with_suffix(".png"), title)
        check = results["calibration"]
        if check.get("reliability_kinds_left_out"):  # each kind scored by a fit that never saw it
            where = args.out.with_name(f"{args.out.stem}-kinds.png")
            kinds_ece = check["kinds_left_out"]["all"]["ece"]
            plot_reliability(check["reliability_kinds_left_out"], kinds_ece, where, "p, kinds left out")
    if args.write_fit:
        fit.save(args.write_fit)
    write_results(args.out, results)


def bert_alone(args: argparse.Namespace, lines: Sequence[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """BERT's own answers (no kNN) in ``lines``: their ``p`` as BERT's top-1 probability itself, the bands
    chosen on it (``choose_bands``; no fit, so every answer is out of sample), checked overall and per kind
    and written to ``--bert-fit``; beside it, for comparison, a fit of ``p`` on the top-1 probability and
    the kind checked on relations and kinds left out. None for a model without an MLM head."""
    rows = bert_alone_rows(lines)
    if len({r.relation for r in rows}) < 2 or len({r.hit for r in rows}) < 2:
        return None
    p = np.array([r.signals.top1 for r in rows])
    hits = [r.hit for r in rows]
    eligible = [r.signals.votes >= MIN_HIGH_VOTES and r.signals.kind_agrees for r in rows]
    high, medium = choose_bands(p, hits, eligible)
    about = {
        "model": f"{name} (BERT alone), layer {args.layer}, {args.mask_policy}",
        "p": "BERT's own top-1 probability (no fit: a fit of it checked worse on relations and kinds"
        " left out)",
        "data": f"BERT's own answers to the questions of {args.data or 'this run'} ({len(rows):,})",
        "fitted_by": "benchmarks/bench_confidence.py --bert-fit (bands only)",
        "applies_to": {"methods": ["bert"], "models": [name.lower()]},
    }
    top1 = Fit((), (), (), (), 0.0, high, medium, about, p_from="top1")
    check: dict[str, Any] = {"bands": {"high": high, "medium": medium}, "all": summary(rows, p, top1)}
    for name_ in sorted({kind(r.relation) for r in rows}):
        mine = [i for i, r in enumerate(rows) if kind(r.relation) == name_]
        check[name_] = summary([rows[i] for i in mine], p[mine], top1)
    head = check["all"]
    info = {"left_out": {k: head[k] for k in ("answers", "P@1", "auroc", "ece")}}
    info["bands_P@1"] = {level: head["bands"][level]["P@1"] for level in ("high", "medium", "low")}
    top1 = dataclasses.replace(top1, about={**about, **info})
    if args.bert_fit:
        top1.save(args.bert_fit)
    _, fitted = calibrate(rows, BERT_ALONE_FEATURES)
    return {
        "fit": top1.as_json(),
        "top1": check,
        "reliability": reliability(p, hits),
        "fitted_for_comparison": {
            "features": list(BERT_ALONE_FEATURES),
            "bands": fitted["bands"],
            "left_out": fitted["left_out"],
            "kinds_left_out": fitted.get("kinds_left_out"),
        },
    }


def kind_offsets(rows: Sequence[Measured], p_kind: Sequence[float]) -> dict[str, Any]:
    """How much of each kind's ECE (kinds left out) is one offset for the whole kind: each kind's ``p``
    shifted by the one logit that makes its mean ``p`` its P@1 (what a fit would need to know of a kind it
    never saw: how well the model answers it), and the ECE left after that shift, beside the floor."""
    pv = np.clip(np.asarray(p_kind, dtype=np.float64), 1e-6, 1 - 1e-6)
    out: dict[str, Any] = {}
    for name in sorted({kind(r.relation) for r in rows}):
        mine = np.array([kind(r.relation) == name for r in rows])
        hits = np.array([r.hit for r in rows])[mine]
        logit = np.log(pv[mine] / (1 - pv[mine]))
        target = float(np.clip(hits.mean(), 1e-3, 1 - 1e-3))
        low, high = -20.0, 20.0
        for _ in range(60):  # the shift whose mean p is the kind's P@1 (mean p rises with the shift)
            mid = (low + high) / 2
            low, high = (mid, high) if np.mean(1 / (1 + np.exp(-(logit + mid)))) < target else (low, mid)
        shifted = 1 / (1 + np.exp(-(logit + (low + high) / 2)))
        out[name] = {
            "P@1": round(float(hits.mean()), 4),
            "mean_p": round(float(pv[mine].mean()), 4),
            "ece": round(float(ece(pv[mine], hits) or 0), 4),
            "logit_shift": round((low + high) / 2, 3),
            "ece_after_shift": round(float(ece(shifted, hits) or 0), 4),
            "ece_floor": ece_floor(pv[mine]),
        }
    return out


# The fit's inputs to compare (``--compare-features``): the answer's signals alone, with how common a word
# it is, and with the question's hardness (``query.hardness``), BERT's part of it, the kNN's part, or all.
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "answer": ANSWER_FEATURES,
    "answer+word": (*ANSWER_FEATURES, *WORD_FEATURES),
    "answer+bert": (*ANSWER_FEATURES, "bert_top1", "bert_entropy"),
    "answer+knn": (*ANSWER_FEATURES, "knn_entropy", "log_distinct", "log_nearest", "log_mean_distance"),
    "answer+hardness": (*ANSWER_FEATURES, *HARDNESS_FEATURES),
}


def date_forms(text: str) -> tuple[str, ...]:
    """``--date-forms``: a comma list of ``date_facts.FORMS``."""
    forms = tuple(f.strip() for f in text.split(",") if f.strip())
    if not forms or not set(forms) <= set(FORMS):
        raise argparse.ArgumentTypeError(f"{text!r}: not a comma list of {', '.join(FORMS)}")
    return forms


def never_low_of(rows: Sequence[Measured]) -> tuple[str, ...]:
    """The kinds a fit of these answers never calls "low": ``eval calibrate``'s rule for a new fit."""
    return never_low_kinds(any(r.signals.bert_p is not None for r in rows))


def features_named(text: str) -> tuple[str, ...]:
    """``--features``: a name in ``FEATURE_SETS`` or a comma-separated list of ``FEATURES`` names."""
    named = FEATURE_SETS.get(text) or tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in named if name not in FEATURES]
    if unknown or not named:
        raise SystemExit(
            f"--features {text!r}: not a set ({', '.join(FEATURE_SETS)}) nor a list of inputs"
            f" ({', '.join(FEATURES)})"
        )
    return named


def no_vote_answers(rows: Sequence[Measured]) -> dict[str, Any] | None:
    """The answers no neighbour votes for (BERT put them first; ``confidence.no_vote_p``), on whole
    articles and partial ones: how often right, and how two rules read them — BERT's own probability
    of the answer (the BERT-alone rule as it is) and ``no_vote_p`` (it, discounted by the share of the
    articles the neighbours saw). Neither is fitted, so every answer is out of sample. None where there
    are none (kNN alone: the top answer always has a vote)."""
    chosen = [r for r in rows if no_vote_p(r.signals) is not None]
    if not chosen:
        return None
    groups = {
        "all": chosen,
        "whole": [r for r in chosen if not r.signals.partial],
        "partial": [r for r in chosen if r.signals.partial],
    }
    table: dict[str, Any] = {}
    for name, part in groups.items():
        hits = [r.hit for r in part]
        table[name] = {"answers": len(part), "right": int(sum(hits))}
        for rule, read in (("bert_p", lambda s: s.bert_p), ("no_vote_p", no_vote_p)):
            p = [float(read(r.signals) or 0.0) for r in part]
            ranked, gap = auc(p, hits), ece(p, hits)
            table[name][rule] = {
                "mean_p": round(float(np.mean(p)), 4) if p else None,
                "auroc": None if ranked is None else round(ranked, 4),
                "ece": None if gap is None else round(gap, 4),
            }
    return table


def compare_features(rows: Sequence[Measured]) -> dict[str, Any]:
    """Each of ``FEATURE_SETS`` fitted and checked as ``calibrate`` does (its own bands): every answer
    scored by a fit without its relation, and by a fit without its kind of relation; overall and per kind
    (with what chance allows)."""
    out: dict[str, Any] = {}
    for name, features in FEATURE_SETS.items():
        _, check = calibrate(rows, features, never_low=never_low_of(rows))
        out[name] = {
            "features": list(features),
            "bands": check["bands"],
            "relations_left_out": check["left_out"],
            "relations_left_out_by_kind": check["kinds"],
            "kinds_left_out": check.get("kinds_left_out"),
        }
    return out


def from_checkpoint(args: argparse.Namespace) -> None:
    """Fit and check ``p`` on the answers of evaluations' checkpoints (``--from-checkpoint``): every
    answer of the first, the partial answers of the others (budget runs)."""
    load = load_average()
    first, *others = args.from_checkpoint
    lines = checkpoint_lines(first)
    exact = from_lines(lines)
    partial = partial_answers(others)
    rows = [*exact, *partial]
    run = json.loads((first.parent / "run.json").read_text(encoding="utf-8"))
    name = Path(args.model or "model").name
    method = "kNN alone" if args.method == "knn" else "BERT-kNN, lambda 0.3"
    about = {
        "model": f"{name} ({method}), layer {args.layer}, {args.mask_policy}",
        "data": args.data or f"the answers of {first} ({len(rows):,})",
        "fitted_by": "benchmarks/bench_confidence.py --from-checkpoint",
        "applies_to": {"methods": [args.method], "models": [name.lower()]},
    }
    features = features_named(args.features)
    about["features_chosen"] = args.features
    fit, report = calibrate(rows, features, about, never_low_of(rows))
    fits = left_out_fits(rows, features)
    p_rel, p_kind = scored_left_out(rows, fits), kinds_left_out(rows, features)[0]
    undated = [i for i, r in enumerate(rows) if kind(r.relation) != "dates"]
    results = {
        "environment": environment("cpu"),
        "load_average_before": load,
        "checkpoints": [str(p) for p in args.from_checkpoint],
        "run": run,
        "fit": fit.as_json(),
        "calibration": report,
        "exact_left_out": summary(exact, scored_left_out(exact, fits), fit),
        "partial_left_out": summary(partial, scored_left_out(partial, fits), fit) if partial else None,
        "same_kind": same_kind_effect(first),
        "no_vote": no_vote_answers(rows),
        "bert_alone": bert_alone(args, lines, name),
        "feature_sets": compare_features(rows) if args.compare_features else None,
        "kind_offsets": kind_offsets(rows, p_kind),
        # what the numbers are without the date relations, which no kNN-alone fit ranks with dates left out
        "without_dates": {
            "relations_left_out": summary([rows[i] for i in undated], np.asarray(p_rel)[undated], fit),
            "kinds_left_out": summary([rows[i] for i in undated], p_kind[undated], fit),
        },
        "load_average_after": load_average(),
    }
    p_rows = scored_left_out(exact, fits) if args.out else []
    finish(
        args,
        results,
        fit,
        p_rows,
        [r.hit for r in exact],
        "exact answers, p from fits without their relation",
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--per-relation", type=int, default=80)
    parser.add_argument("--evidences", type=int, default=4)
    parser.add_argument(
        "--skip", type=int, default=0, help="leave out each relation's first SKIP facts (held-out facts)"
    )
    parser.add_argument("--partial-facts", type=int, default=40, help="facts per relation, partial and batch")
    parser.add_argument("--budget", type=int, nargs="*", default=[16, 8, 2])
    parser.add_argument("--work", type=Path, default=Path("/tmp/bertknn-bench-confidence"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--write-fit", type=Path, help="write the fit here (the package's shipped fit)")
    parser.add_argument("--no-batch", action="store_true", help="skip the default batch run")
    parser.add_argument("--model", help="model folder (default: all-MiniLM-L6-v2, kNN alone)")
    parser.add_argument("--layer", type=int, default=6, help="layer of --model's keys (BERT-base: 11)")
    parser.add_argument("--method", choices=["knn", "interpolated"], default="knn", help="the fit's method")
    parser.add_argument(
        "--from-checkpoint",
        type=Path,
        nargs="+",
        help="fit on 'eval run' checkpoints (facts.jsonl: every answer of the first, the partial ones of"
        " the others) instead of building and answering (e.g. this bench's own eval-exact and"
        " eval-budget-N); --model names the model for the fit's applies_to",
    )
    parser.add_argument(
        "--mask-policy",
        default="single-wordpiece-no-stopwords",
        help="the index's mask policy, for the fit's about (--from-checkpoint; a built index has this one)",
    )
    parser.add_argument("--data", help="what the answers are, for the fit's about.data")
    parser.add_argument(
        "--date-forms",
        type=date_forms,
        default=FORMS,
        help=f"the forms of date sentences to build facts from (comma list of {', '.join(FORMS)};"
        " BERT-base's shipped fits: 'born on')",
    )
    parser.add_argument("--bert-fit", type=Path, help="write the fit of BERT's own answers here")
    parser.add_argument(
        "--features",
        default="answer",
        help=f"the fit's inputs: one of {', '.join(FEATURE_SETS)} or a comma list of FEATURES names",
    )
    parser.add_argument(
        "--compare-features",
        action="store_true",
        help="also check every one of FEATURE_SETS on relations and kinds left out (--from-checkpoint)",
    )
    args = parser.parse_args()
    if args.from_checkpoint:
        from_checkpoint(args)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    load = load_average()
    lama = trimmed(
        LAMA,
        args.work / "lama",
        args.per_relation,
        args.evidences,
        skip=args.skip,
        date_forms=args.date_forms,
    )
    relations = sorted(p.stem for p in (lama / "TREx").glob("*.jsonl"))
    corpus = args.work / "corpus.jsonl"
    summary_ = write_evidence_corpus(
        evidence_files(lama=lama, relations=relations), corpus, args.per_relation
    )
    model = args.model or str(minilm())
    name = Path(model).name
    base = Config(
        model=model,
        layer=args.layer,
        mask_policy=args.mask_policy,
        index=args.work / "idx",
        contexts="eager",
    )
    if not (base.index / "index.sqlite").exists():  # the eager index is reused by a re-run
        ingest(corpus, base, progress=False)
    facts = read_facts(lama=lama, corpora=["T-REx"], relations=relations, per_relation=args.per_relation)
    exact, seconds = answered(base.replace(exact=True), facts, args.work / "eval-exact")
    exact_lines = checkpoint_lines(args.work / "eval-exact" / "facts.jsonl")
    subset = read_facts(lama=lama, corpora=["T-REx"], relations=relations, per_relation=args.partial_facts)
    partial: list[Measured] = []
    partial_runs = []
    for budget in args.budget:
        config = dataclasses.replace(base, index=args.work / f"lazy-{budget}", contexts="lazy", budget=budget)
        shutil.rmtree(config.index, ignore_errors=True)
        ingest(corpus, config, progress=False)
        rows, took = answered(config, subset, args.work / f"eval-budget-{budget}")
        mine = [dataclasses.replace(r, key=f"{r.key}#budget-{budget}") for r in rows if r.signals.partial]
        partial += mine
        partial_runs.append(
            {"budget": budget, "answers": len(rows), "partial": len(mine), "seconds": round(took, 1)}
        )
    about = {
        "model": f"{name} ({'kNN alone' if args.method == 'knn' else 'BERT-kNN, lambda 0.3'}), layer"
        f" {args.layer}, {args.mask_policy}",
        "data": f"LAMA T-REx, first {args.per_relation} facts of each relation, and date facts built"
        f" from T-REx evidences ({', '.join(args.date_forms)}: benchmarks/date_facts.py); evidence corpus",
        "fitted_by": "benchmarks/bench_confidence.py",
        "applies_to": {"methods": [args.method], "models": [name.lower()]},
    }
    if args.data:
        about["data"] = args.data
    features = features_named(args.features)
    fit, report = calibrate([*exact, *partial], features, about, never_low_of([*exact, *partial]))
    fits = left_out_fits([*exact, *partial], features)
    p_exact = scored_left_out(exact, fits)
    p_partial = scored_left_out(partial, fits)
    # What query --file does on a cold lazy index: batches of 128, the default budget.
    batch_rows: list[Measured] = []
    batch_seconds = 0.0
    if not args.no_batch:
        batch_config = dataclasses.replace(base, index=args.work / "lazy-default", contexts="lazy")
        shutil.rmtree(batch_config.index, ignore_errors=True)
        ingest(corpus, batch_config, progress=False)
        batch_rows, batch_seconds = answered(batch_config, subset, args.work / "eval-batch", batch=128)
    p_batch = scored_left_out(batch_rows, fits)
    results: dict[str, Any] = {
        "environment": environment("cpu"),
        "load_average_before": load,
        "settings": {
            "model": name,
            "layer": base.layer,
            "mask_policy": base.mask_policy,
            "k": base.k,
            "temperature": base.temperature,
            "n_articles": base.n_articles,
            "relations": relations,
            "per_relation": args.per_relation,
            "evidences": args.evidences,
            "partial_facts": args.partial_facts,
        },
        "corpus": {"articles": summary_.articles, "sentences": summary_.sentences, "facts": len(facts)},
        "seconds_exact": round(seconds, 1),
        "fit": fit.as_json(),
        "calibration": report,
        "exact_left_out": summary(exact, p_exact, fit),
        "partial_runs": partial_runs,
        "partial_left_out": summary(partial, p_partial, fit),
        "same_kind": same_kind_effect(args.work / "eval-exact" / "facts.jsonl"),
        "bert_alone": bert_alone(args, exact_lines, name),
        "default_batch": {
            "answers": len(batch_rows),
            "partial": sum(r.signals.partial for r in batch_rows),
            "seconds": round(batch_seconds, 1),
            **summary(batch_rows, p_batch, fit),
        },
    }
    results["load_average_after"] = load_average()
    title = "exact answers, p from fits without their relation"
    finish(args, results, fit, p_exact, [r.hit for r in exact], title)


if __name__ == "__main__":
    main()
