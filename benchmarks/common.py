"""Benchmark helpers: random BERT models of real sizes, a synthetic Wikipedia-like corpus, timing, JSON."""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bertknn_search.records import Article
from bertknn_search.stopwords import STOPWORDS

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PUNCT = list(".,;:!?'\"()-&/%$")
VOCAB_SIZE = 30522  # bert-base-uncased: the MLM head the naive baseline pays for is this wide
# Architectures. Weights are random: speed depends on shapes only, never on the values.
MODEL_SIZES: dict[str, dict[str, int]] = {
    "base": {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
    },
    "small": {
        "hidden_size": 256,
        "num_hidden_layers": 12,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
    },
    "tiny": {"hidden_size": 64, "num_hidden_layers": 12, "num_attention_heads": 2, "intermediate_size": 256},
}
LAYER = 11  # the datastore layer (hidden_states[11]) for every size
# The most frequent English stopwords, most frequent first; the rest of NLTK's list follows, rarer.
COMMON_STOPWORDS = (
    "the of and in to a was is for as on by with he that at from his it an were are which this be or has had"
).split()
SUFFIXES = "s ed ing ly er ion al ic ist ity ment ness ous ive ism ian ese ville burg ton land".split()
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["an", "el", "or", "is", "ar", "en"]


def cache_dir() -> Path:
    """Where built models go: outside the repo, so that they never travel with the working tree."""
    return Path(tempfile.gettempdir()) / "bertknn-bench"


def synthetic_words(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct pronounceable lowercase words, none of them a stopword."""
    rng = random.Random(seed)
    words: dict[str, None] = {}
    while len(words) < n:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 2, 3, 3, 3, 4))))
        if word not in STOPWORDS:
            words[word] = None
    return list(words)


def vocabulary(size: int = VOCAB_SIZE) -> list[str]:
    """A WordPiece vocabulary of ``size`` entries: specials, punctuation, digits, stopwords, word pieces
    (``##ing``…) and synthetic whole words, so that tokenisation behaves as on English text."""
    fixed = (
        SPECIALS
        + PUNCT
        + [str(d) for d in range(10)]
        + [f"##{d}" for d in range(10)]
        + [f"##{s}" for s in SUFFIXES]
        + COMMON_STOPWORDS
        + sorted(STOPWORDS - set(COMMON_STOPWORDS))
    )
    fixed = list(dict.fromkeys(fixed))
    return fixed + synthetic_words(size - len(fixed))


def content_words(vocab: Sequence[str]) -> list[str]:
    """The synthetic whole words of ``vocab``, in vocabulary order (which is also their frequency rank)."""
    skip = set(SPECIALS) | set(PUNCT) | STOPWORDS
    return [w for w in vocab if w not in skip and not w.startswith("##") and not w.isdigit()]


def build_model(size: str, out: Path | None = None, seed: int = 0, initializer_range: float = 0.02) -> Path:
    """Save a randomly initialised ``BertForMaskedLM`` of ``size`` with the benchmark vocabulary.

    Reused when already saved. No network: the tokenizer is built from the vocabulary written here.

    Args:
        size: a key of ``MODEL_SIZES``.
        out: directory; defaults to a per-size folder under ``cache_dir()``.
        seed: torch seed for the weights.
        initializer_range: std of the weights; BERT's 0.02 by default (the states of a deep random model
            at 0.02 vary little between contexts, which matters for kNN quality, not for speed).

    Returns:
        The model directory, loadable with ``from_pretrained`` and ``Encoder``.
    """
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast
    from transformers.utils import logging as hf_logging

    out = out or cache_dir() / f"bert-{size}-random-{seed}-{initializer_range}"
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    vocab_file = out / "vocab.txt"
    vocab_file.write_text("\n".join(vocabulary()) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab=str(vocab_file), do_lower_case=True)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=512,
        initializer_range=initializer_range,
        **MODEL_SIZES[size],
    )
    hf_logging.disable_progress_bar()
    BertForMaskedLM(config).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@dataclass
class CorpusGenerator:
    """Synthetic Wikipedia-like articles: Zipfian words, about 42% stopwords, 10-40 words a sentence.

    The shape, not the meaning, matters here: sentence lengths set the model's sequence length, word
    frequencies set BM25 posting-list lengths, and suffixed words become multi-piece (non-maskable) words.
    """

    seed: int = 0
    words: list[str] = field(default_factory=lambda: content_words(vocabulary()))

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        ranks = np.arange(len(self.words), dtype=np.float64)
        weights = 1.0 / (ranks + 2.7)  # Zipf-Mandelbrot, exponent 1, as in running text
        self._cdf = np.cumsum(weights / weights.sum())
        stops = COMMON_STOPWORDS + sorted(STOPWORDS - set(COMMON_STOPWORDS))
        stop_weights = 1.0 / (np.arange(len(stops)) + 1.0)
        self._stops = stops
        self._stop_cdf = np.cumsum(stop_weights / stop_weights.sum())

    def _word(self) -> str:
        rng = self._rng
        if rng.random() < 0.42:
            return self._stops[int(np.searchsorted(self._stop_cdf, rng.random()))]
        word = self.words[min(int(np.searchsorted(self._cdf, rng.random())), len(self.words) - 1)]
        # Inflected or compound words: split into pieces by WordPiece, so they get no context.
        return word + SUFFIXES[int(rng.integers(len(SUFFIXES)))] if rng.random() < 0.15 else word

    def sentence(self, subject: str | None = None) -> str:
        """One sentence of 10-40 words (mean about 23, like Wikipedia prose), ending with a full stop."""
        rng = self._rng
        n = int(np.clip(round(rng.normal(23, 7)), 10, 40))
        words = [self._word() for _ in range(n)]
        if subject:
            words[:3] = [subject, "is", "a"]
        parts = [w + "," if rng.random() < 0.06 and i < n - 1 else w for i, w in enumerate(words)]
        text = " ".join(parts)
        return text[0].upper() + text[1:] + "."

    def title(self, i: int) -> str:
        """A unique title: one or two Zipf-drawn words, then a rare word that only this title uses."""
        head = " ".join(self._word().title() for _ in range(int(self._rng.integers(1, 3))))
        rare = self.words[-1 - i % len(self.words)].title()
        return f"{head} {rare}" if i < len(self.words) else f"{head} {rare} {i}"

    def article(self, i: int) -> Article:
        """Article ``i``: a lognormal number of sentences (median 9, 3 to 60), the title in the first."""
        n = int(np.clip(round(self._rng.lognormal(np.log(9), 0.6)), 3, 60))
        title = self.title(i)
        sentences = [self.sentence(title if s == 0 else None) for s in range(n)]
        return Article(str(i), title, " ".join(sentences))

    def articles(self, n: int, start: int = 0) -> list[Article]:
        return [self.article(i) for i in range(start, start + n)]

    def sentences(self, n: int) -> list[str]:
        return [self.sentence() for _ in range(n)]


# -- timing and results ------------------------------------------------------------------------------
@contextmanager
def timed(into: dict[str, float], key: str) -> Iterator[None]:
    """Add the wall-clock seconds of the block to ``into[key]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        into[key] = into.get(key, 0.0) + time.perf_counter() - start


def percentiles(seconds: Sequence[float]) -> dict[str, float]:
    """p50, p95 and mean of ``seconds``, in milliseconds."""
    ms = np.asarray(seconds, dtype=np.float64) * 1000.0
    if ms.size == 0:
        return {"p50_ms": 0.0, "p95_ms": 0.0, "mean_ms": 0.0}
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p95_ms": float(np.percentile(ms, 95)),
        "mean_ms": float(statistics.fmean(ms.tolist())),
    }


def environment(device: str) -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch
    import transformers

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "load_average": load_average(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32  # False: the fp32 baseline is true fp32
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                env["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass  # not Linux: platform's answer stays
    return env


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages: on a shared machine, how much every time here is inflated."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


class Progress:
    """Prints each phase to stderr as it ends and rewrites the JSON then, so that a run stopped by its
    time bound (or killed) still leaves every phase it finished.

    Attributes:
        results: what is written; ``"complete"`` stays False until ``finish``.
    """

    def __init__(self, out: Path | None, results: dict[str, Any]) -> None:
        self.out = out
        self.results = results
        self.started = time.monotonic()
        results["complete"] = False
        results["phases"] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def done(self, name: str, summary: str, **values: Any) -> None:
        """Record phase ``name`` (``values`` go into the results under their keys) and say so."""
        self.results.update(values)
        load = load_average()
        self.results["phases"].append({"phase": name, "at_s": round(self.elapsed(), 1), "load_average": load})
        print(
            f"[{self.elapsed():7.1f} s, load {load[0] if load else '?'}] {name}: {summary}", file=sys.stderr
        )
        write_results(self.out, self.results)

    def finish(self) -> None:
        self.results["complete"] = True
        self.results["seconds"] = round(self.elapsed(), 1)
        write_results(self.out, self.results)


def write_results(path: Path | None, results: dict[str, Any]) -> None:
    """Write ``results`` as indented JSON to ``path`` (nothing when ``path`` is None)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


def dir_bytes(path: Path) -> int:
    """Total size of the files under ``path``."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def argument_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every benchmark takes; each script adds its own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--model-size", choices=["base", "small", "tiny"], default="base")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    return parser


def run_benchmark(
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
) -> None:
    """Parse the options, run, print the report and write the JSON."""
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # loading bars would bury the report
    results = run(args)
    print(report(results))
    write_results(args.out, results)


def start_serve(
    cmd: Sequence[str], env: dict[str, str], timeout_s: float
) -> tuple[subprocess.Popen[str], str, list[str]]:
    """A ``bertknn-search serve`` command in a child process: the process, the URL of its ``ready:`` line
    ("" if none came within ``timeout_s`` or it ended first) and its stderr lines, which keep growing."""
    proc = subprocess.Popen(list(cmd), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    log: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line)
            if match := re.search(r"ready: (http://\S+)", line):
                found.append(match.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    ready.wait(timeout_s)
    return proc, (found[0] if found else ""), log
