"""Confidence fits checked on answers none of them was fitted or chosen on (issue 49).

``bench_confidence.py`` checks a fit on relations and kinds of relation left out, but the fit's inputs,
their form and its cuts were chosen on those same answers. This scores the answers of an evaluation of
other facts (``bench_confidence.py --skip N``: each relation's facts after the first N, which the
shipped fits never saw) with each fit as it is — no refit — and reports, overall and per kind of
relation, what ``bench_confidence.py`` reports: P@1, mean ``p``, AUROC, ECE with its floor by chance,
and P@1 per level.

    python benchmarks/bench_confidence.py --model ~/.cache/bertknn-search/models/bert-base-uncased \\
        --layer 11 --method interpolated --per-relation 15 --skip 35 --evidences 1 --budget 8 \\
        --partial-facts 10 --no-batch --work HELD
    python benchmarks/confidence_heldout.py HELD/eval-exact/facts.jsonl HELD/eval-budget-8/facts.jsonl \\
        --fit new=bertknn_search/query/confidence_fit_bert_knn.json --fit before=OLD.json \\
        --out benchmarks/results/confidence-heldout-cpu-bert-base.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from common import environment, load_average

from bertknn_search.eval.calibration import (
    Measured,
    by_kind,
    checkpoint_lines,
    from_lines,
    partial_answers,
    summary_by_chance,
)
from bertknn_search.query.confidence import Fit


def scored(exact: list[Measured], partial: list[Measured], fit: Fit) -> dict[str, Any]:
    """``summary_by_chance`` of the fit's own ``p``: over all the answers and each kind's, and over the
    exact and the partial ones."""
    rows = [*exact, *partial]
    p = fit.probability([r.signals for r in rows])
    return {
        "all_answers": {"all": summary_by_chance(rows, p, fit), **by_kind(rows, p, fit)},
        "exact": summary_by_chance(exact, p[: len(exact)], fit),
        "partial": summary_by_chance(partial, p[len(exact) :], fit) if partial else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoints", type=Path, nargs="+", help="exact answers first, then budget runs")
    parser.add_argument("--fit", action="append", required=True, help="NAME=PATH of a fit file, repeatable")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    load = load_average()
    exact = from_lines(checkpoint_lines(args.checkpoints[0]))
    partial = partial_answers(args.checkpoints[1:])
    fits = {name: Fit.read(Path(path)) for name, _, path in (f.partition("=") for f in args.fit)}
    results: dict[str, Any] = {
        "environment": environment("cpu"),
        "load_average_before": load,
        "checkpoints": [str(p) for p in args.checkpoints],
        "answers": {"exact": len(exact), "partial": len(partial)},
        "fits": {},
    }
    for name, fit in fits.items():
        results["fits"][name] = {
            "features": list(fit.features),
            "bands": {"high": fit.high, "medium": fit.medium, "never_low": list(fit.never_low)},
            **scored(exact, partial, fit),
        }
        head = results["fits"][name]["all_answers"]
        for group, said in head.items():
            bands = said["bands"]
            print(
                f"{name:8s} {group[:30]:30s} n={said['answers']:4d} P@1 {said['P@1']:.3f} mean p"
                f" {said['mean_p']:.2f} AUROC {said['auroc']} ECE {said['ece']}"
                f" (chance p95 {said['chance']['ece_floor']['p95']}) high"
                f" {bands['high']['hits']}/{bands['high']['answers']} low"
                f" {bands['low']['hits']}/{bands['low']['answers']}"
            )
    results["load_average_after"] = load_average()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
