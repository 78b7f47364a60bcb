"""Two processes on the same cores: an ingest alone vs beside a second one, with spinning or sleeping waits.

Runs the real CLI (``bertknn-search ingest wiki``) as subprocesses on the tiny demo model and a synthetic
corpus, so the numbers include what a user sees. Each setting is timed alone and as a pair started together;
the ratio pair/alone is what matters (the machine may be shared: compare ratios, not seconds).

    .venv/bin/python benchmarks/bench_shared_cores.py --out benchmarks/results/shared-cores.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bertknn_search.demo import CITIES, FILLER, PEOPLE, build_tiny_model

SETTINGS = {
    "default (OMP_WAIT_POLICY=PASSIVE)": {},
    "spinning waits (OMP_WAIT_POLICY=ACTIVE, the old default)": {"OMP_WAIT_POLICY": "ACTIVE"},
    "one thread each (OMP_NUM_THREADS=1)": {"OMP_NUM_THREADS": "1"},
}


def write_corpus(path: Path, n: int) -> None:
    rng = random.Random(1)
    words = FILLER + PEOPLE + CITIES
    with path.open("w", encoding="utf-8") as out:
        for i in range(n):
            text = " ".join(
                " ".join(rng.choice(words) for _ in range(rng.randint(6, 14))).capitalize() + "."
                for _ in range(4)
            )
            out.write(json.dumps({"id": str(i), "title": f"Article {i}", "text": text}) + "\n")


def start(corpus: Path, model: Path, index: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    shutil.rmtree(index, ignore_errors=True)
    args = [sys.executable, "-m", "bertknn_search", "ingest", "wiki", str(corpus), "--index", str(index)]
    args += ["--model", str(model), "--device", "cpu", "--max-length", "64", "--no-progress"]
    return subprocess.Popen(args, env={**os.environ, **env}, stdout=subprocess.DEVNULL)


def timed(procs: list[subprocess.Popen[bytes]]) -> float:
    began = time.perf_counter()
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit(f"ingest failed with exit code {proc.returncode}")
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--articles", type=int, default=300)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load = os.getloadavg()  # other work on the machine, for the record
    base = os.environ.get("OMP_WAIT_POLICY")
    os.environ.pop("OMP_WAIT_POLICY", None)  # each setting says its own
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = build_tiny_model(work / "model")
        corpus = work / "corpus.jsonl"
        write_corpus(corpus, args.articles)
        results = {}
        for name, env in SETTINGS.items():
            alone = timed([start(corpus, model, work / "alone", env)])
            pair = timed([start(corpus, model, work / f"pair{i}", env) for i in range(2)])
            results[name] = {
                "alone_s": round(alone, 1),
                "pair_s": round(pair, 1),
                "ratio": round(pair / alone, 2),
            }
            print(f"{name}: alone {alone:.1f} s, two at once {pair:.1f} s ({pair / alone:.1f}x)", flush=True)
    if base is not None:
        os.environ["OMP_WAIT_POLICY"] = base
    report = {"articles": args.articles, "cpus": os.cpu_count(), "load_before": load, "results": results}
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
