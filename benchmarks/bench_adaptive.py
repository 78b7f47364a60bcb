"""What adaptive retrieval saves: questions answered with and without a gate, end to end, in one run.

Both arms run ``Searcher.answer_batch`` (the path ``query --file`` and the server use) over the same
questions, in alternating rounds so that a machine shared with other work slows them alike. The gated arm
uses a gate whose threshold is set to stop about ``--stop`` of the questions (a quantile of their signal
measured first), or the thresholds of a ``--settings`` file from ``eval grid``. Reported: seconds per
question for each arm, their ratio, the share that retrieved, and how the ungated arm's time splits into
the encoder pass (always paid) and IR + kNN + evidence (what a gate can save).

    python benchmarks/bench_adaptive.py --index idx --lama LAMA/data --relations P19,P103 --per-relation 100
    python benchmarks/bench_adaptive.py --index idx --popqa popqa.json --split test --gate popularity
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import environment, run_benchmark

from bertknn_search import session
from bertknn_search.errors import QuestionError
from bertknn_search.eval.datasets import read_facts
from bertknn_search.eval.relations import parse_relations
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", type=Path, required=True)
    p.add_argument("--lama", type=Path)
    p.add_argument("--popqa", type=Path)
    p.add_argument("--split", default="test")
    p.add_argument("--relations")
    p.add_argument("--per-relation", type=int)
    p.add_argument("--gate", choices=["popularity", "top1", "entropy"], default="top1")
    p.add_argument("--stop", type=float, default=0.5, help="share of questions the gate should stop")
    p.add_argument("--settings", type=Path, help="eval grid's settings file (its thresholds and gate)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path)
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    facts = read_facts(
        lama=args.lama,
        popqa=args.popqa,
        split=args.split,
        relations=parse_relations(args.relations),
        per_relation=args.per_relation,
    )
    questions = [Question(f.question, f.subject, f.popularity, f.relation) for f in facts]
    config = session.open_index({"index": args.index, "device": args.device}, settings=args.settings).config
    searcher = Searcher.open(config)
    try:
        questions = [q for q in questions if _encodable(searcher, q)]
        if args.settings is None:
            _, p_bert = searcher.encode(questions)
            found = searcher.gate_signal(args.gate, questions, p_bert)
            values = np.array([np.nan if v is None else v for v in found])
            # Stop the --stop share: the most popular or confident (the least uncertain, for entropy).
            quantile = 1 - args.stop if args.gate != "entropy" else args.stop
            threshold = float(np.nanquantile(values, quantile))
            gated = config.with_gate_threshold(args.gate, threshold)
        else:
            gated = config
        plain = config.replace(gate="none")
        times: dict[str, list[float]] = {"plain": [], "gated": []}
        retrieved, stages = 0.0, {"ir_knn": 0.0}
        for _ in range(args.rounds):
            for name, cfg in (("plain", plain), ("gated", gated)):
                arm = Searcher(cfg, searcher.backend, searcher.encoder)
                start = time.perf_counter()
                for lo in range(0, len(questions), args.batch):
                    answers = arm.answer_batch(questions[lo : lo + args.batch])
                    if name == "gated":
                        retrieved += sum(a.gate is None or a.gate.retrieve for a in answers)
                times[name].append(time.perf_counter() - start)
        # The always-paid part: one encoder pass over the questions; the rest of the plain arm is retrieval.
        start = time.perf_counter()
        for lo in range(0, len(questions), args.batch):
            searcher.encode(questions[lo : lo + args.batch])
        stages["encoder"] = time.perf_counter() - start
        for lo in range(0, len(questions), args.batch):
            scored = searcher.score_batch(questions[lo : lo + args.batch], plain)
            stages["ir_knn"] += sum(s.seconds for s in scored)
    finally:
        searcher.close()
    n = len(questions)
    plain_s, gated_s = float(np.median(times["plain"])) / n, float(np.median(times["gated"])) / n
    return {
        "environment": environment(args.device),
        "questions": n,
        "gate": gated.gate,
        "thresholds": [list(t) for t in gated.gate_thresholds if t[0] == gated.gate],
        "retrieved_share": retrieved / (n * args.rounds),
        "plain_ms_per_question": 1000 * plain_s,
        "gated_ms_per_question": 1000 * gated_s,
        "gated_over_plain": gated_s / plain_s,
        "encoder_ms_per_question": 1000 * stages["encoder"] / n,
        "ir_knn_ms_per_question": 1000 * stages["ir_knn"] / n,
        "rounds": times,
    }


def _encodable(searcher: Searcher, q: Question) -> bool:
    try:
        searcher.encoder.prepare(q.text)
    except QuestionError:  # too long for the model: dropped, as eval does
        return False
    return True


def report(r: dict[str, Any]) -> str:
    share = 100 * r["retrieved_share"]
    return "\n".join(
        [
            f"{r['questions']} questions, gate {r['gate']} {r['thresholds']}: {share:.1f}% retrieved",
            f"per question: plain {r['plain_ms_per_question']:.1f} ms,"
            f" gated {r['gated_ms_per_question']:.1f} ms ({r['gated_over_plain']:.2f}x);"
            f" of plain: encoder {r['encoder_ms_per_question']:.1f} ms,"
            f" IR + kNN {r['ir_knn_ms_per_question']:.1f} ms",
        ]
    )


if __name__ == "__main__":
    run_benchmark(parser(), run, report)
