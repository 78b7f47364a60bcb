"""Memory of a cold question on a long article: the rows held while encoding, not the article's length.

One article of ``--mib`` MiB of Wikipedia-shaped text (the size ``POST /articles`` and the CLI allow at
most) in a lazy index. Each measurement runs in its own process and reports its peak RSS above the same
process's RSS just before the step, so the model and the libraries are not counted:

- **rows as inputs**: ``make_rows`` over the whole article, every masked row as a model input (what a
  cold encode held before rows became a table);
- **row table**: ``make_row_table``, the compact table a cold encode holds now;
- **cold question**: a subject question with ``--budget`` contexts, the whole path (split, table, rank,
  encode, store, answer).

    python benchmarks/bench_cold_memory.py --model-size tiny --mib 2 \\
        --out benchmarks/results/cold-memory-cpu.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import CorpusGenerator, argument_parser, build_model, environment, run_benchmark

STEP = r"""
import json, resource, sys
sys.path.insert(0, {bench!r})
from pathlib import Path
from bertknn_search.config import Config
from bertknn_search.encoding.encoder import Encoder
from bertknn_search.ingest.contexts import make_row_table, make_rows
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.records import Question
from bertknn_search.query.search import Searcher

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

what, model, index, title, budget = {args!r}
config = Config(model=model, layer=11, index=Path(index), device="cpu", budget=budget)
if what == "cold question":
    searcher = Searcher.open(config)
    searcher.encoder.mlm
    searcher.encoder.vocab
    text = None
else:
    encoder = Encoder(model, 11, "cpu", 512)
    encoder.mlm
    text = Path(index).parent.joinpath("article.txt").read_text()
    sentences = [split_sentences(text)]
before = rss_kib()
if what == "rows as inputs":
    rows = len(make_rows(sentences, encoder, "single-wordpiece", 512))
elif what == "row table":
    rows = len(make_row_table(sentences, encoder, "single-wordpiece", 512))
else:
    answer = searcher.answer(Question(title + " was born in [MASK].", title))
    rows = [c.total for c in answer.coverage.values()][0]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"rows": rows, "before_mib": before / 1024, "peak_mib": peak / 1024,
                   "held_mib": (peak - before) / 1024}}))
"""


def run(args: Any) -> dict[str, Any]:
    from bertknn_search.config import Config
    from bertknn_search.ingest.pipeline import ingest
    from bertknn_search.records import Article

    model = build_model(args.model_size)
    gen = CorpusGenerator(seed=args.seed)
    title = gen.title(0)
    sentences: list[str] = []
    size = 0
    while size < args.mib * 1024 * 1024 * 0.98:
        paragraph = " ".join(gen.sentence(title if len(sentences) % 7 == 0 else None) for _ in range(6))
        sentences.append(paragraph)
        size += len(paragraph) + 1
    text = "\n".join(sentences)
    results: dict[str, Any] = {"environment": environment("cpu"), "mib": len(text) / 2**20, "steps": {}}
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "index"
        (Path(tmp) / "article.txt").write_text(text)
        config = Config(model=str(model), index=index, device="cpu", contexts="lazy")
        ingest([Article("1", title, text)], config, progress=False)
        bench = str(Path(__file__).resolve().parent)
        for what in ("row table", "rows as inputs", "cold question"):
            code = STEP.format(bench=bench, args=(what, str(model), str(index), title, args.budget))
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            results["steps"][what] = json.loads(out.stdout.strip().splitlines()[-1])
    return results


def report(results: dict[str, Any]) -> str:
    lines = [f"one article of {results['mib']:.2f} MiB", f"{'step':<16}{'rows':>10}{'held MiB':>10}"]
    for what, r in results["steps"].items():
        lines.append(f"{what:<16}{r['rows']:>10,}{r['held_mib']:>10.1f}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argument_parser(__doc__)
    parser.add_argument("--mib", type=float, default=2.0, help="the article's size")
    parser.add_argument("--budget", type=int, default=256, help="contexts the cold question encodes")
    run_benchmark(parser, run, report)
