"""Check: two checkouts' ``ingest wiki`` of a dump store the same articles, texts, fingerprints, IR terms.

Each checkout's CLI ingests the dump into its own lazy index (the same tiny model); then every stored
article's id, title, fingerprint, text, sentences (the installed splitter) and IR field texts (unigrams
and bigrams) are compared, and each index's article count in tantivy. Exit status 1 on any difference.

    python benchmarks/compare_ingest.py DUMP --baseline-python /work/main/.venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import build_model

from bertknn_search.backends.embedded.article_index import field_texts
from bertknn_search.ingest.sentences import split_sentences

# Run by each checkout's own python: the store may keep its text in its own form (compressed, say), and
# a lazy index hands out an article it has no contexts of as it was ingested (``unencoded``).
DUMP = """
import json, sqlite3, sys
from bertknn_search.backends.embedded.backend import EmbeddedBackend
with sqlite3.connect(sys.argv[1] + "/index.sqlite") as conn:
    ids = [row[0] for row in conn.execute("SELECT id FROM articles")]
backend = EmbeddedBackend.open(sys.argv[1])
for pending in backend.unencoded(ids):
    a = pending.article
    print(json.dumps([a.id, a.title, pending.fingerprint, a.text]))
backend.close()
"""


def stored(python: str, index: Path) -> dict[str, tuple[str, str, str]]:
    """id -> (title, fingerprint, text) of every article of the lazy index, read by ``python``'s checkout."""
    out = subprocess.run([python, "-c", DUMP, str(index)], check=True, capture_output=True, text=True)
    rows = (json.loads(line) for line in out.stdout.splitlines())
    return {row[0]: tuple(row[1:]) for row in rows}


def tantivy_docs(index: Path) -> int:
    import tantivy

    searcher = tantivy.Index.open(str(index / "articles.tantivy")).searcher()
    return searcher.num_docs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dump", type=Path)
    parser.add_argument("--baseline-python", required=True, help="the python of the other checkout's venv")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    model = build_model("tiny")
    work = Path(tempfile.mkdtemp(prefix="compare-ingest-"))
    pythons = {"this checkout": sys.executable, "baseline": args.baseline_python}
    indexes = {}
    for name, python in pythons.items():
        index = indexes[name] = work / name.replace(" ", "-")
        command = [python, "-m", "bertknn_search", "ingest", "wiki", str(args.dump), "--contexts", "lazy"]
        command += ["--model", str(model)]
        subprocess.run(
            [*command, "--index", str(index), "--workers", str(args.workers), "--no-progress"], check=True
        )
    ours, theirs = (stored(pythons[name], indexes[name]) for name in ("this checkout", "baseline"))
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
