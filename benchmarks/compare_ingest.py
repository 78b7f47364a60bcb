"""Check: two checkouts' ``ingest wiki`` of a dump store the same articles, texts, fingerprints, IR terms.

Each CLI ingests the dump into its own lazy index (the same tiny model); then every stored article's id,
title, fingerprint, text, sentences (the installed splitter) and IR field texts (unigrams and bigrams) are
compared, and each index's article count in tantivy. Exit status 1 on any difference.

    python benchmarks/compare_ingest.py DUMP --baseline-cli /work/main/.venv/bin/bertknn-search
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from common import build_model

from bertknn_search.backends.article_index import field_texts
from bertknn_search.ingest.sentences import split_sentences

ROWS = "SELECT a.id, a.title, a.fingerprint, t.text FROM articles a JOIN texts t ON t.article = a.rowid"


def stored(index: Path) -> dict[str, tuple[str, str, str]]:
    with sqlite3.connect(index / "index.sqlite") as conn:
        return {row[0]: row[1:] for row in conn.execute(ROWS)}


def tantivy_docs(index: Path) -> int:
    import tantivy

    searcher = tantivy.Index.open(str(index / "articles.tantivy")).searcher()
    return searcher.num_docs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dump", type=Path)
    parser.add_argument(
        "--baseline-cli", required=True, help="the other checkout's bertknn-search executable"
    )
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    model = build_model("tiny")
    work = Path(tempfile.mkdtemp(prefix="compare-ingest-"))
    clis = {"this checkout": [sys.executable, "-m", "bertknn_search"], "baseline": [args.baseline_cli]}
    indexes = {}
    for name, cli in clis.items():
        index = indexes[name] = work / name.replace(" ", "-")
        command = [*cli, "ingest", "wiki", str(args.dump), "--contexts", "lazy", "--model", str(model)]
        subprocess.run(
            [*command, "--index", str(index), "--workers", str(args.workers), "--no-progress"], check=True
        )
    ours, theirs = stored(indexes["this checkout"]), stored(indexes["baseline"])
    differ = [i for i in sorted(ours.keys() | theirs.keys()) if ours.get(i) != theirs.get(i)]
    terms = sum(
        field_texts(t, x) == field_texts(*theirs[i][::2]) for i, (t, _, x) in ours.items() if i in theirs
    )
    sentences = sum(
        split_sentences(x) == split_sentences(theirs[i][2]) for i, (_, _, x) in ours.items() if i in theirs
    )
    docs = {name: tantivy_docs(index) for name, index in indexes.items()}
    print(
        f"{len(ours):,} articles stored here, {len(theirs):,} by the baseline; {len(differ)} differ in"
        f" id, title, fingerprint or text; IR field texts equal for {terms:,}, sentences for {sentences:,};"
        f" tantivy documents {docs}"
    )
    subprocess.run(["rm", "-rf", str(work)], check=True)
    same = not differ and terms == sentences == len(ours) == len(theirs) and len(set(docs.values())) == 1
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
