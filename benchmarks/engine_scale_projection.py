"""English Wikipedia on OpenSearch, projected from ``bench_engine_scale.py``'s measurements.

Reads one or two results files of ``bench_engine_scale.py`` (the largest run is scaled; a second, smaller
run gives the growth of the nodes' live heap) and prints, for the lazy store and an eager one, on one node
and on the 3-node cluster: disk (one copy and every copy), shards, heap and ingest hours, each cell saying
what it was scaled from. Linear scaling in the text is assumed (Lucene's merges make it a little worse
past the measured size: the tantivy text pass lost 16% from 100k to 1M articles).

    python benchmarks/engine_scale_projection.py benchmarks/results/engines-scale-100k.json \\
        benchmarks/results/engines-scale-5k.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

WIKI_ARTICLES = 6.7e6
WIKI_TEXT_MB = 20_000.0  # English Wikipedia's clean text, ~3,000 characters an article
WIKI_CONTEXTS = 1.8e9  # 242 contexts per 553 words (bench_lazy's BERT-base count), 600 words an article
H100_CONTEXTS_S = 10_821.0  # ingest() end to end with BERT-base on one H100 (benchmarks/README.md, Ingest)
SHARD_GB = 50.0  # the upper end of OpenSearch's advice for a shard's size
GB = 1e9


def live_heap(row: dict[str, Any]) -> float:
    """The largest node's heap after a full collection, after the ingest (bytes)."""
    return float(max((row["heap"].get("after_full_gc") or {"-": 0}).values()))


def project(big: dict[str, Any], small: dict[str, Any] | None) -> list[str]:
    scale = WIKI_TEXT_MB / big["corpus"]["text_mb"]
    lines = [
        f"scaled from {big['corpus']['articles']:,} articles ({big['corpus']['text_mb']:.1f} MB of text) x"
        f" {scale:.1f} to {WIKI_ARTICLES / 1e6:.1f} M articles, {WIKI_TEXT_MB / 1e3:.0f} GB of text;"
        f" {WIKI_CONTEXTS / 1e9:.1f} B contexts",
        "",
        "| store | layout | disk, one copy | every copy | shards | heap (live, largest node) | ingest |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: |",
    ]
    eager = big.get("eager", {})
    for name, row in big["ingest"].items():
        one = (row["disk"]["bytes"] if "bytes" in row["disk"] else row["disk"]["primaries"]["bytes"]) * scale
        copies = (row["disk"].get("total", {}).get("bytes") or one / scale) * scale
        if name != "embedded" and "opensearch-3" not in name:
            copies = one  # one node: the replica is not assigned
        hours = WIKI_TEXT_MB / row["mb_per_s"] / 3600
        heap = "-"
        if "heap" in row:
            now = live_heap(row)
            if small and name in small["ingest"] and "heap" in small["ingest"][name]:
                before, n0 = live_heap(small["ingest"][name]), small["corpus"]["articles"]
                slope = (now - before) / (big["corpus"]["articles"] - n0)
                heap = f"{(now + slope * (WIKI_ARTICLES - big['corpus']['articles'])) / 2**30:.1f} GiB"
            else:
                heap = f"{now / 2**20:.0f} MiB at the measured size"
        shards = "tantivy" if name == "embedded" else f"articles 1 (~{one / GB:.0f} GB)"
        lines.append(
            f"| lazy | {name} | {one / GB:.0f} GB | {copies / GB:.0f} GB | {shards} | {heap}"
            f" | {hours:.1f} h |"
        )
    for name, row in eager.items():
        per = row.get("bytes_per_context_merged", row["bytes_per_context"])
        one = per * WIKI_CONTEXTS
        copies = one * (2 if name == "opensearch-3" else 1)
        shards = (
            "-" if name == "embedded" else f"contexts {math.ceil(one / GB / SHARD_GB):,} of {SHARD_GB:.0f} GB"
        )
        rate = row.get("contexts_per_add_s")
        engine_h = WIKI_CONTEXTS / rate / 3600 if rate else float("nan")
        encoder_h = WIKI_CONTEXTS / H100_CONTEXTS_S / 3600
        lines.append(
            f"| eager ({per:,.0f} B/context) | {name} | {one / 1e12:.1f} TB | {copies / 1e12:.1f} TB"
            f" | {shards} | - | encoder {encoder_h:.0f} h on an H100;"
            f" writes {engine_h:,.0f} h at {rate or 0:,.0f}/s |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", type=Path, help="bench_engine_scale.py's results (the largest run)")
    parser.add_argument("smaller", type=Path, nargs="?", help="a smaller run of it, for the heap's growth")
    args = parser.parse_args()
    try:
        big = json.loads(args.results.read_text())
        small = json.loads(args.smaller.read_text()) if args.smaller else None
    except (OSError, ValueError) as exc:
        raise SystemExit(f"cannot read the results: {exc}") from None
    try:
        print("\n".join(project(big, small)))
    except (KeyError, TypeError, ZeroDivisionError) as exc:
        raise SystemExit(f"not a bench_engine_scale.py results file (missing {exc})") from None


if __name__ == "__main__":
    main()
