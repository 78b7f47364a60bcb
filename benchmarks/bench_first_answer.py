"""The default cold first answer on a CPU: a budget of seconds against the old budget of 64 contexts.

BERT-base shapes (a random ``BertForMaskedLM`` of BERT-base size with MiniLM's real uncased WordPiece
vocabulary, as ``bench_anytime``'s timing part), fp32 or what ``--precision`` says, a lazy index of the real
enwiki fragment, the model loaded once (as a server holds it). Each repeat asks, on fresh cold copies of
the index, a subject question over the longest article and a free question over three cold articles, once
with the old default (``Config(budget=64)``, contexts alone) and once with the default settings (the floor,
``lazy.FLOOR_ROWS`` contexts an article, then ``CPU_BUDGET_S`` seconds, at most ``CPU_BUDGET`` contexts), in
turn, so that the shared
machine's load falls on both alike.

    python benchmarks/bench_first_answer.py --out benchmarks/results/first-answer-cpu.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from anytime_setup import (
    FREE,
    NOWHERE,
    RELATIONS,
    base_model_dir,
    cloze,
    cold_copy,
    fragment_articles,
    minilm_dir,
    templates,
    text_pass,
)
from bench_lazy import FRAGMENT
from common import LAYER, cache_dir, environment, load_average, percentiles, write_results

from bertknn_search.backends.lazy import FLOOR_ROWS
from bertknn_search.config import CPU_BUDGET, CPU_BUDGET_S, Config
from bertknn_search.encoding.encoder import Encoder
from bertknn_search.records import Question

OLD_BUDGET = 64  # the default before seconds (issue 35)


def ask(config: Config, pristine: Path, scratch: Path, encoder: Encoder, q: Question) -> dict[str, Any]:
    with cold_copy(pristine, scratch, config, encoder) as searcher:
        started = time.perf_counter()
        answer = searcher.answer(q)
        seconds = time.perf_counter() - started
        return {"seconds": seconds, "contexts": searcher.backend.encoded_contexts, "partial": answer.partial}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=cache_dir() / "anytime")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--precision", default="fp32", help="fp32 (this CPU has no bf16 units), auto, ...")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--model",
        choices=("bert-base-shapes", "minilm"),
        default="bert-base-shapes",
        help="bert-base-shapes (random weights, BERT-base's cost) or minilm (the real all-MiniLM-L6-v2,"
        " layer 6: six layers of 384, about 9 times cheaper a context)",
    )
    args = parser.parse_args()

    minilm = minilm_dir(args.work)
    model, layer = (
        (minilm, 6) if args.model == "minilm" else (base_model_dir(args.work, minilm, args.seed), LAYER)
    )
    articles = fragment_articles(FRAGMENT)
    by_title = {a.title: a for a in articles}
    longest = max(articles, key=lambda a: (len(a.text), a.id))
    subject_qs = [cloze(t, longest.title) for _, t in templates(RELATIONS, args.repeats)]
    free_qs = [cloze(t, title, subject=False) for t, title in FREE if title in by_title][: args.repeats]
    base = Config(model=str(model), layer=layer, device="cpu", contexts="lazy", precision=args.precision)
    encoder = Encoder(str(model), layer, "cpu", base.max_length, args.precision)
    pristine = args.work / f"{args.model}-lazy"
    text_pass(articles, base.replace(index=pristine), encoder)
    scratch = args.work / "scratch-first-answer"
    with cold_copy(pristine, scratch, base, encoder) as searcher:
        searcher.answer(NOWHERE)  # first-call allocations, as a server has done before its first question

    settings = {"contexts": base.replace(budget=OLD_BUDGET), "default": base}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        k: {name: [] for name in settings} for k in ("subject", "free")
    }
    loads = [load_average()]
    for r in range(args.repeats):
        names = list(settings) if r % 2 == 0 else list(settings)[::-1]
        for kind, q in (("subject", subject_qs[r % len(subject_qs)]), ("free", free_qs[r % len(free_qs)])):
            for name in names:
                run = ask(settings[name], pristine, scratch, encoder, q)
                runs[kind][name].append(run)
                print(f"{kind} {name}: {run['seconds']:.2f} s, {run['contexts']} contexts", flush=True)
        loads.append(load_average())

    results: dict[str, Any] = {
        "environment": environment("cpu"),
        "model": (
            "the real all-MiniLM-L6-v2, layer 6"
            if args.model == "minilm"
            else "random BertForMaskedLM of BERT-base shapes, MiniLM's (bert-base-uncased's) vocabulary"
        ),
        "precision": encoder.precision,
        "subject_article": longest.title,
        "old_default": f"budget={OLD_BUDGET} contexts",
        "new_default": f"the floor ({FLOOR_ROWS} an article), {CPU_BUDGET_S} s more, {CPU_BUDGET} at most",
        "load_average": loads,
    }
    for kind, by_name in runs.items():
        results[kind] = {
            name: {
                "seconds": percentiles([x["seconds"] for x in rs]),
                "contexts_mean": sum(x["contexts"] for x in rs) / len(rs),
                "runs": rs,
            }
            for name, rs in by_name.items()
        }
        old, new = (results[kind][n]["seconds"]["p50_ms"] for n in ("contexts", "default"))
        results[kind]["p50_ratio_default_to_contexts"] = round(new / old, 3)
    write_results(args.out, results)
    for kind in runs:
        r = results[kind]
        print(
            f"{kind}: p50 {r['contexts']['seconds']['p50_ms'] / 1000:.2f} s with 64 contexts,"
            f" {r['default']['seconds']['p50_ms'] / 1000:.2f} s with the default"
            f" ({r['default']['contexts_mean']:.0f} contexts)"
        )


if __name__ == "__main__":
    main()
