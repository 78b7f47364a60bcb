"""Anytime answers in a batch: `query --file` without --exact against --exact, on a cold lazy index.

Issue 39: a batch of questions used to share one deadline, so each of its answers was starved (P@1 9.2
against 19.1 exact). Each question now has its own budget and a floor of contexts per article
(``lazy.FLOOR_ROWS``). This asks the same held-out LAMA T-REx facts (relations the rest of the project
never tuned on) through the CLI, each setting on a fresh cold copy of one lazy index of their evidence
corpus, with the real all-MiniLM-L6-v2 weights kNN-only, and writes P@1, how many answers were partial,
the contexts encoded per answer, the wall time, the CPU and the load beside each figure.

    python benchmarks/bench_batch_budget.py --model ./all-MiniLM-L6-v2 \
        --out benchmarks/results/batch-budget-cpu.json

``--floors 8,16,32,64`` also asks each question with ``--budget F`` alone (F contexts of the subject's
article, no clock): how P@1 grows with the floor, the measurement the floor was picked by.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import cache_dir, environment, load_average, write_results

HELD_OUT = "P20,P27,P101,P937"  # place of death, citizenship, field of work, work location
CLI = [sys.executable, "-m", "bertknn_search"]


def facts(lama: Path, relations: list[str], per_relation: int) -> list[dict[str, str]]:
    """The first ``per_relation`` facts of each relation: question (LAMA's template), subject, gold."""
    templates = {}
    for line in (lama / "relations.jsonl").read_text(encoding="utf-8").splitlines():
        rel = json.loads(line)
        templates[rel["relation"]] = rel["template"]
    out = []
    for relation in relations:
        lines = (lama / "TREx" / f"{relation}.jsonl").read_text(encoding="utf-8").splitlines()
        for line in lines[:per_relation]:
            fact = json.loads(line)
            text = templates[relation].replace("[X]", fact["sub_label"]).replace("[Y]", "[MASK]")
            out.append(
                {
                    "relation": relation,
                    "question": text,
                    "subject": fact["sub_label"],
                    "gold": fact["obj_label"].lower(),
                }
            )
    return out


def ask(index: Path, questions: Path, flags: list[str]) -> tuple[list[dict[str, Any]], float, str]:
    """The JSON answers of ``query --file`` with ``flags``, its wall seconds and its stderr."""
    began = time.perf_counter()
    run = subprocess.run(
        [*CLI, "query", "--file", str(questions), "--index", str(index), "--json", "--no-progress", *flags],
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - began
    if run.returncode:
        raise SystemExit(f"query {' '.join(flags)} failed: {run.stderr.strip()[-2000:]}")
    return [json.loads(line) for line in run.stdout.splitlines() if line.strip()], seconds, run.stderr


def score(asked: list[dict[str, str]], answers: list[dict[str, Any]]) -> dict[str, Any]:
    """P@1 (macro over relations and micro), partial answers, contexts encoded per answer."""
    hits: dict[str, list[bool]] = {}
    encoded, partial, each = [], 0, []
    for fact, answer in zip(asked, answers, strict=True):
        top = answer["bert_knn"][0]["word"] if answer["bert_knn"] else None
        hits.setdefault(fact["relation"], []).append(top == fact["gold"])
        partial += bool(answer["partial"])
        encoded.append(sum(c["encoded"] for c in answer["coverage"].values()))
        total = sum(c["total"] for c in answer["coverage"].values())
        each.append([fact["relation"], encoded[-1], total, int(top == fact["gold"])])
    per_relation = {r: 100 * sum(h) / len(h) for r, h in hits.items()}
    return {
        "p_at_1_macro": round(statistics.fmean(per_relation.values()), 2),
        "p_at_1_micro": round(100 * sum(sum(h) for h in hits.values()) / len(answers), 2),
        "p_at_1_per_relation": {r: round(v, 2) for r, v in per_relation.items()},
        "answers": len(answers),
        "partial": partial,
        "contexts_per_answer_median": statistics.median(encoded) if encoded else 0,
        "contexts_per_answer_min": min(encoded, default=0),
        "p_at_1_of_partial": round(100 * sum(e[3] for e in each if e[1] < e[2]) / max(partial, 1), 2),
        "each": each,  # per fact: relation, contexts encoded of its articles, their contexts, right (1)
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True, help="all-MiniLM-L6-v2 (extracted)")
    parser.add_argument("--lama", type=Path, default=Path(__file__).parents[2] / "shared/data/lama")
    parser.add_argument("--relations", default=HELD_OUT)
    parser.add_argument("--per-relation", type=int, default=150)
    parser.add_argument("--work", type=Path, default=cache_dir() / "batch-budget")
    parser.add_argument("--settings", default="exact,default", help="exact, default, budget-s=S, ...")
    parser.add_argument("--floors", default="", help="also --budget F alone for each F (comma-separated)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not (args.lama / "TREx").is_dir():
        raise SystemExit(f"no LAMA T-REx data at {args.lama} (../shared/data/lama): nothing to measure")
    relations = args.relations.split(",")
    args.work.mkdir(parents=True, exist_ok=True)
    corpus, pristine = args.work / "corpus.jsonl", args.work / "lazy"
    if not pristine.exists():
        common = ["--relations", args.relations, "--per-relation", str(args.per_relation)]
        subprocess.run(
            [*CLI, "eval", "corpus", "--lama", str(args.lama), *common, "--out", str(corpus)], check=True
        )
        subprocess.run(
            [
                *CLI,
                "ingest",
                "wiki",
                str(corpus),
                "--model",
                str(args.model),
                "--layer",
                "6",
                "--contexts",
                "lazy",
                "--index",
                str(pristine),
                "--no-progress",
            ],
            check=True,
        )
    asked = facts(args.lama, relations, args.per_relation)
    questions = args.work / "questions.tsv"
    questions.write_text("".join(f"{f['question']}\t{f['subject']}\n" for f in asked), encoding="utf-8")

    runs: dict[str, list[str]] = {}
    for name in filter(None, args.settings.split(",")):
        if name == "exact":
            runs[name] = ["--exact"]
        elif name == "default":
            runs[name] = []
        elif name.startswith("budget-s="):
            runs[name] = ["--budget-s", name.split("=", 1)[1]]
        else:
            raise SystemExit(f"unknown setting {name!r}")
    runs.update({f"budget={f}": ["--budget", f] for f in filter(None, args.floors.split(","))})

    results: dict[str, Any] = {
        "environment": environment("cpu"),
        "model": str(args.model),
        "relations": relations,
        "per_relation": args.per_relation,
        "runs": {},
    }
    for name, flags in runs.items():
        cold = args.work / "cold"
        shutil.rmtree(cold, ignore_errors=True)
        shutil.copytree(pristine, cold)
        before = load_average()
        answers, seconds, stderr = ask(cold, questions, flags)
        got = score(asked, answers)
        got.update(
            seconds=round(seconds, 1),
            load_before=before,
            load_after=load_average(),
            flags=flags,
            summary=stderr.strip().splitlines()[-1:],
        )
        results["runs"][name] = got
        write_results(args.out, results)
        print(
            f"{name}: P@1 {got['p_at_1_macro']} (micro {got['p_at_1_micro']}), {got['partial']} of"
            f" {got['answers']} partial, median {got['contexts_per_answer_median']} contexts,"
            f" {seconds:.0f} s, load {before[:1]} -> {got['load_after'][:1]}",
            flush=True,
        )


if __name__ == "__main__":
    main()
