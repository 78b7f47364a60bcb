"""Answer confidence (issue 35): which signal tells right answers from wrong ones, and P@1 per band.

Real all-MiniLM-L6-v2 weights (no MLM head: kNN only), layer 6, ``single-wordpiece-no-stopwords``, over
the LAMA evidence corpus of the first ``--per-relation`` T-REx facts of ``--relations`` (each fact's
evidences cut to ``--evidences``); the facts are those same facts' template questions (``eval run``'s).
One run measures:

- per answer, every signal of ``confidence.signals`` and whether top-1 is right (``eval.calibration``);
  each [0, 1] signal's thresholds fitted on the calibration half, P@1 per band on the held-out half, and
  the shipped thresholds (``confidence.HIGH``/``MEDIUM`` on votes) on both halves;
- partial against exact: a fresh lazy index answering the first ``--partial-facts`` facts of each relation
  under ``--budget`` contexts per question (lead-first order), against the eager index's exact answers
  to the same facts;
- the tiny demo model's invented facts (it has an MLM head: BERT-kNN mixes p_BERT in), with the shipped
  thresholds.

LAMA's Google-RE files are not in ../shared/data (see its SOURCES.md), so T-REx only.

    python benchmarks/bench_confidence.py --out benchmarks/results/confidence-cpu-minilm.json
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

from bench_whole_word import minilm, trimmed_lama
from common import environment, load_average, write_results

from bertknn_search.config import Config
from bertknn_search.demo import make_facts, run_demo
from bertknn_search.eval.calibration import Measured, bands, calibrate, measure
from bertknn_search.eval.datasets import Fact, read_facts
from bertknn_search.eval.evidence import evidence_files, write_evidence_corpus
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.query.confidence import HIGH, MEDIUM
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question

ROOT = Path(__file__).resolve().parents[1]
LAMA = ROOT.parent / "shared" / "data" / "lama"
RELATIONS = "P19,P20,P27,P103,P106,P1412,P413,P937"


def measured(config: Config, facts: Sequence[Fact]) -> tuple[list[Measured], float]:
    """Every fact's measured answer under ``config``, and the seconds it took."""
    start = time.perf_counter()
    searcher = Searcher.open(config)
    try:
        rows = list(measure(searcher, facts))
    finally:
        searcher.close()
    return rows, time.perf_counter() - start


def shipped(rows: Sequence[Measured]) -> dict[str, Any]:
    """P@1 per band with the shipped thresholds, on all answers."""
    return bands([r.signals.votes for r in rows], [r.hit for r in rows], HIGH, MEDIUM)


def per_relation(rows: Sequence[Measured]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for relation in sorted({r.relation for r in rows}):
        mine = [r for r in rows if r.relation == relation]
        out[relation] = {"answers": len(mine), "P@1": round(sum(r.hit for r in mine) / len(mine), 4)}
        out[relation]["bands"] = shipped(mine)
    return out


def partial_vs_exact(
    corpus: Path, base: Config, facts: Sequence[Fact], exact: Sequence[Measured], budget: int, work: Path
) -> dict[str, Any]:
    """A fresh lazy index answering ``facts`` under ``budget``, against the eager index's answers."""
    config = dataclasses.replace(base, index=work / f"lazy-{budget}", contexts="lazy", budget=budget)
    shutil.rmtree(config.index, ignore_errors=True)
    ingest(corpus, config, progress=False)
    rows, seconds = measured(config, facts)
    by_key = {r.key: r for r in exact}
    pairs = [(r, by_key[r.key]) for r in rows if r.key in by_key]
    partial = [(p, e) for p, e in pairs if p.partial]

    def rate(hits: list[bool]) -> float | None:
        return round(sum(hits) / len(hits), 4) if hits else None

    return {
        "budget": budget,
        "answers": len(pairs),
        "partial_answers": len(partial),
        "seconds": round(seconds, 1),
        "P@1 budget (all)": rate([p.hit for p, _ in pairs]),
        "P@1 exact (all)": rate([e.hit for _, e in pairs]),
        "P@1 budget (partial ones)": rate([p.hit for p, _ in partial]),
        "P@1 exact (same facts)": rate([e.hit for _, e in partial]),
        "partial right, exact wrong": sum(p.hit and not e.hit for p, e in partial),
        "partial wrong, exact right": sum(e.hit and not p.hit for p, e in partial),
        "same top-1": sum(p.word == e.word for p, e in partial),
        "bands (budget)": shipped([p for p, _ in pairs]),
    }


def tiny(work: Path) -> dict[str, Any]:
    """The demo's tiny model over its invented facts: born in / worked as, with the shipped thresholds."""
    demo = run_demo(work / "demo", progress=False)
    questions = [Question(f"{f.person.title()} was born in [MASK].", f.person.title()) for f in make_facts()]
    questions += [Question(f"{f.person.title()} worked as a [MASK].", f.person.title()) for f in make_facts()]
    golds = [f.city for f in make_facts()] + [f.job for f in make_facts()]
    searcher = Searcher.open(demo.config)
    try:
        answers = searcher.answer_batch(questions)
    finally:
        searcher.close()
    rows = []
    for answer, gold in zip(answers, golds):
        score = answer.confidence.score if answer.confidence else 0.0  # None: no answer
        rows.append((score, bool(answer.bert_knn) and answer.bert_knn[0].word == gold))
    return {
        "answers": len(rows),
        "P@1": round(sum(h for _, h in rows) / len(rows), 4),
        "bands": bands([s for s, _ in rows], [h for _, h in rows], HIGH, MEDIUM),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--relations", default=RELATIONS)
    parser.add_argument("--per-relation", type=int, default=150)
    parser.add_argument("--evidences", type=int, default=4)
    parser.add_argument("--partial-facts", type=int, default=50, help="facts per relation for partial/exact")
    parser.add_argument("--budget", type=int, nargs="+", default=[16])
    parser.add_argument("--work", type=Path, default=Path("/tmp/bertknn-bench-confidence"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    relations = args.relations.split(",")
    args.work.mkdir(parents=True, exist_ok=True)
    load = load_average()
    lama = trimmed_lama(LAMA, args.work / "lama", args.per_relation, args.evidences)
    corpus = args.work / "corpus.jsonl"
    summary = write_evidence_corpus(evidence_files(lama=lama, relations=relations), corpus, args.per_relation)
    base = Config(
        model=str(minilm()), layer=6, mask_policy="single-wordpiece-no-stopwords", index=args.work / "idx"
    )
    if not (base.index / "index.sqlite").exists():  # the eager index is reused by a re-run
        ingest(corpus, base, progress=False)
    facts = read_facts(lama=lama, corpora=["T-REx"], relations=relations, per_relation=args.per_relation)
    rows, seconds = measured(base, facts)
    results: dict[str, Any] = {
        "environment": environment("cpu"),
        "load_average_before": load,
        "settings": {
            "model": "all-MiniLM-L6-v2",
            "layer": base.layer,
            "mask_policy": base.mask_policy,
            "k": base.k,
            "temperature": base.temperature,
            "n_articles": base.n_articles,
            "relations": relations,
            "per_relation": args.per_relation,
            "evidences": args.evidences,
            "shipped": {"signal": "votes", "high": HIGH, "medium": MEDIUM},
        },
        "corpus": {"articles": summary.articles, "sentences": summary.sentences, "facts": len(facts)},
        "answers": len(rows),
        "seconds_answering": round(seconds, 1),
        "fitted": calibrate(rows),
        "shipped": calibrate(rows, {"votes": (HIGH, MEDIUM)})["signals"]["votes"],
        "per_relation": per_relation(rows),
    }
    subset = read_facts(lama=lama, corpora=["T-REx"], relations=relations, per_relation=args.partial_facts)
    results["partial_vs_exact"] = [
        partial_vs_exact(corpus, base, subset, rows, budget, args.work) for budget in args.budget
    ]
    results["tiny_demo"] = tiny(args.work)
    results["load_average_after"] = load_average()
    (args.work / "answers.jsonl").write_text(
        "".join(json.dumps(r.as_dict()) + "\n" for r in rows), encoding="utf-8"
    )
    write_results(args.out, results)


if __name__ == "__main__":
    main()
