"""The paper's Tables 2 and 3 with the real BERT-base: the sample, the datastore's corpus, and the tables.

The runs themselves are `bertknn-search` commands (`benchmarks/paper_tables.sh` lists them in order);
this script does what the CLI does not:

- ``sample``: a LAMA folder (`TREx/`, `Squad/`, `relations.jsonl`) with the first ``--per-relation`` facts
  of each T-REx relation, each fact's evidences cut to the first ``--evidences``, and a LAMA-UHN folder
  holding the UHN facts among them (UHN is T-REx filtered, in T-REx's order, so these are a prefix of each
  UHN file). Every column is then scored on the same facts, and the datastore holds their evidence.
- ``distractors``: the enwiki fragment's articles of at most ``--max-chars`` characters, as JSONL for
  `ingest wiki`: text the subjects' articles must be told apart from.
- ``tables``: P@1/5/10 per relation and corpus from `eval run` folders, beside the paper's numbers. The
  BERT column is read from every fact with a BERT rank, also those whose IR step found no article (BERT
  alone needs no datastore, so its runs use a tiny index and count every fact).

Example:
    python benchmarks/paper_tables.py sample --lama ../shared/data/lama --lama-uhn ../shared/data/lama-uhn \
        --per-relation 4 --evidences 2 --out /work/data/h48b/sample
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from bertknn_search.ingest.readers import read_articles

KS = (1, 5, 10)
# The paper's Table 2 (BERT-base uncased, full vocabulary; P@1): BERT / kNN / BERT-kNN.
PAPER_T2 = {
    "T-REx": (29.1, 34.4, 38.7),
    "Google-RE": (9.8, 51.1, 48.6),
    "SQuAD": (14.1, 25.5, 24.9),
    "LAMA": (27.7, None, 39.4),
    "LAMA-UHN": (20.6, None, 34.8),
}
# Petroni et al. 2019, BERT-base cased, LAMA's common vocabulary (P@1).
PETRONI = {"T-REx": 31.1, "Google-RE": 9.8, "SQuAD": 14.1}
# Table 3 (BERT-kNN P@1 on LAMA): layer 12 / 11 / 10, and layer 11 without IR.
PAPER_T3 = {"layer 12": 36.8, "layer 11": 39.4, "layer 10": 34.7, "layer 11, no IR": 26.9}


def _rows(path: Path, limit: int, evidences: int) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        rows = [json.loads(line) for line in itertools.islice(handle, limit)]
    for row in rows:
        if isinstance(row.get("evidences"), list):
            row["evidences"] = row["evidences"][:evidences]
    return rows


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def sample(args: argparse.Namespace) -> None:
    out: Path = args.out
    lama, uhn = out / "lama", out / "lama-uhn"
    chosen: dict[str, int] = {}
    uuids: set[str] = set()
    only = set(args.relations.split(",")) if args.relations else None
    for path in sorted((args.lama / "TREx").glob("*.jsonl")):
        if only is not None and path.stem not in only:
            continue
        rows = _rows(path, args.per_relation, args.evidences)
        _write(lama / "TREx" / path.name, rows)
        chosen[path.stem] = len(rows)
        uuids |= {str(r["uuid"]) for r in rows}
    shutil.copy(args.lama / "relations.jsonl", lama / "relations.jsonl")
    squad = args.lama / "Squad" / "test.jsonl"
    if squad.is_file() and only is None:
        _write(lama / "Squad" / "test.jsonl", _rows(squad, args.squad or sys.maxsize, args.evidences))
    kept: dict[str, int] = {}
    for path in sorted((args.lama_uhn / "TREx_UHN").glob("*.jsonl")):
        if path.stem not in chosen:
            continue  # P276, P279, P1001: no T-REx file here, so no sample to take them from
        rows = [r for r in _rows(path, sys.maxsize, args.evidences) if str(r["uuid"]) in uuids]
        _write(uhn / "TREx_UHN" / path.name, rows)
        kept[path.stem] = len(rows)
    print(
        f"T-REx: {sum(chosen.values())} facts of {len(chosen)} relations (first {args.per_relation} each,"
        f" evidences cut to {args.evidences}); LAMA-UHN: {sum(kept.values())} of them; written to {out}"
    )
    (out / "sample.json").write_text(
        json.dumps(
            {"per_relation": args.per_relation, "evidences": args.evidences, "trex": chosen, "uhn": kept}
        )
    )


def distractors(args: argparse.Namespace) -> None:
    kept = [a for a in read_articles(args.wiki) if 0 < len(a.text) <= args.max_chars][: args.limit]
    with args.out.open("w", encoding="utf-8") as out:
        for a in kept:
            out.write(json.dumps({"id": f"enwiki-{a.id}", "title": a.title, "text": a.text}) + "\n")
    median = statistics.median(len(a.text) for a in kept)
    print(f"{len(kept)} enwiki articles of at most {args.max_chars} characters (median {median:.0f})")


def _lines(run: Path) -> list[dict[str, Any]]:
    with (run / "facts.jsonl").open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def scores(run: Path, models: tuple[str, ...], every_fact: bool) -> dict[str, Any]:
    """P@k in % per relation and per corpus (macro over relations), as `eval run` averages them.

    ``every_fact``: count facts that found no article too (right for BERT alone, which needs none).
    """
    per: dict[tuple[str, str], dict[str, list[int | None]]] = {}
    for line in _lines(run):
        ranks = line.get("ranks") or {}
        if line.get("skipped") and not (every_fact and line["skipped"] == "no-article" and ranks):
            continue
        cell = per.setdefault((line["corpus"], line["relation"]), {m: [] for m in models})
        for m in models:
            cell[m].append(ranks.get(m))
    relations: dict[str, dict[str, Any]] = {}
    for (corpus, relation), cell in sorted(per.items()):
        relations.setdefault(corpus, {})[relation] = {
            "n": len(cell[models[0]]),
            **{
                m: {k: 100 * statistics.mean(r is not None and r <= k for r in cell[m]) for k in KS}
                for m in models
            },
        }
    corpora = {
        c: {m: {k: statistics.mean(r[m][k] for r in rels.values()) for k in KS} for m in models}
        | {"n": sum(r["n"] for r in rels.values()), "relations": len(rels)}
        for c, rels in relations.items()
    }
    return {"relations": relations, "corpora": corpora}


def tables(args: argparse.Namespace) -> None:
    found = {}
    for spec in args.run:
        name, _, path = spec.partition("=")
        models = tuple(args.models.split(","))
        every = name.startswith("bert")
        found[name] = scores(Path(path), ("bert",) if every else models, every)
    text = json.dumps(found, indent=1)
    if args.out:
        args.out.write_text(text)
    for name, s in found.items():
        for corpus, c in s["corpora"].items():
            cols = " ".join(
                f"{m} {c[m][1]:.1f}/{c[m][5]:.1f}/{c[m][10]:.1f}" for m in c if m not in ("n", "relations")
            )
            print(f"{name:24} {corpus:9} n={c['n']:4} rel={c['relations']:2}  {cols}")
    if args.per_relation:
        print(per_relation(found, args.per_relation))


def per_relation(found: dict[str, Any], corpus: str) -> str:
    """A Markdown row per relation of ``corpus``: each run's P@1 per model, with its facts scored."""
    heads = [(run, m) for run, s in found.items() if corpus in s["relations"] for m in s["corpora"][corpus]]
    heads = [(run, m) for run, m in heads if m not in ("n", "relations")]
    names = sorted(
        {r for s in found.values() for r in s["relations"].get(corpus, {})}, key=lambda r: int(r[1:])
    )
    lines = ["| relation | " + " | ".join(f"{run} {m} (n)" for run, m in heads) + " |"]
    lines.append("| --- |" + " ---: |" * len(heads))
    for rel in names:
        cells = []
        for run, m in heads:
            row = found[run]["relations"][corpus].get(rel)
            cells.append("–" if row is None else f"{row[m][1]:.1f} ({row['n']})")
        lines.append(f"| {rel} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


PAPER_SETTING = {"n_articles": 3, "k": 128, "temperature": 6.0, "lam": 0.3}
SWEEPS = {"lam": "λ", "k": "k", "temperature": "l", "n_articles": "N"}


def _grid(path: Path) -> dict[tuple[Any, ...], float]:
    found = json.loads(path.read_text(encoding="utf-8"))
    return {tuple(g[n] for n in PAPER_SETTING): 100 * g["score"] for g in found["grid"]}


def ablation(args: argparse.Namespace) -> None:
    """One setting varied at a time around the paper's, macro over both halves' relations (each half
    holds the same number of relations, so their mean is the macro over all); then the setting chosen
    on one half, scored on the other (whole relations held out), against the paper's on that half."""
    halves = [_grid(p) for p in args.grid]
    paper = tuple(PAPER_SETTING.values())
    out: dict[str, Any] = {"paper_setting": PAPER_SETTING, "sweeps": {}, "held_out": []}
    for name, label in SWEEPS.items():
        i = list(PAPER_SETTING).index(name)
        values = sorted({key[i] for key in halves[0]})
        row = {}
        for v in values:
            key = (*paper[:i], v, *paper[i + 1 :])
            row[v] = statistics.mean(h[key] for h in halves)
        out["sweeps"][name] = row
        print(f"{label}: " + ", ".join(f"{v:g} {p:.1f}" for v, p in row.items()))
    for j, chosen in enumerate(halves):
        other = halves[1 - j]
        best = max(chosen.values())
        # Ties: the first in grid order, as eval grid picks.
        pick = next(key for key, v in chosen.items() if v == best)
        ties = sum(v == best for v in chosen.values())
        row = {
            "chosen_on": str(args.grid[j]),
            "setting": dict(zip(PAPER_SETTING, pick)),
            "ties": ties,
            "chosen_score": best,
            "held_out_score": other[pick],
            "paper_setting_held_out": other[paper],
        }
        out["held_out"].append(row)
        print(
            f"chosen on half {j + 1} ({ties} ties at {best:.1f}): {row['setting']} -> held-out half"
            f" {other[pick]:.1f} (paper's setting there {other[paper]:.1f})"
        )
    if args.out:
        args.out.write_text(json.dumps(out, indent=1), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sample")
    p.add_argument("--lama", type=Path, required=True)
    p.add_argument("--lama-uhn", type=Path, required=True)
    p.add_argument("--per-relation", type=int, default=4)
    p.add_argument("--evidences", type=int, default=2)
    p.add_argument("--squad", type=int, default=0, help="first N SQuAD facts (0: all)")
    p.add_argument("--relations", help="only these T-REx relations (and no SQuAD), comma-separated")
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("distractors")
    p.add_argument("--wiki", type=Path, required=True)
    p.add_argument("--max-chars", type=int, default=3000)
    p.add_argument("--limit", type=int, default=40)
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("tables")
    p.add_argument(
        "run", nargs="+", help="NAME=EVAL_RUN_FOLDER (a NAME starting 'bert' scores BERT on every fact)"
    )
    p.add_argument("--models", default="bert,knn,bert_knn")
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--per-relation", metavar="CORPUS", help="also print P@1 per relation of CORPUS (Markdown)"
    )
    p = sub.add_parser("ablation")
    p.add_argument(
        "grid", nargs=2, type=Path, help="eval grid --json outputs of the two halves of the relations"
    )
    p.add_argument("--out", type=Path)
    args = parser.parse_args()
    commands = {"sample": sample, "distractors": distractors, "tables": tables, "ablation": ablation}
    commands[args.command](args)


if __name__ == "__main__":
    main()
