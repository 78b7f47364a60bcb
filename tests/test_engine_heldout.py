"""Held-out check: real OpenSearch and Elasticsearch, and the embedded store, against BERT-kNN written anew.

Two real nodes are started the way a user starts them (``bertknn-search engine start NAME`` as a
subprocess, ready when it prints its ``ready:`` line, stopped with SIGTERM), the test corpus is ingested
into each, and the same questions go through ``Searcher.score_batch`` on the embedded index, OpenSearch
and Elasticsearch. The same answers are computed a second time by ``Reference`` below: Kassner & Schütze's
method written out with numpy, torch and transformers alone (the tiny model loaded with
``BertForMaskedLM.from_pretrained``), importing none of the project's search, kNN, interpolation,
retrieval, encoder, context-making or backend code. It reuses only two project pieces, so that its inputs
are the project's inputs rather than a rival definition of them:

- the IR vocabulary (``bertknn_search.terms.tokenize`` and ``query_terms``, and the stopword list): which
  strings are terms is a definition, not part of the method;
- the sentence splitter ingest uses (``bertknn_search.ingest.sentences.split_sentences``, sentencex).

Everything else is written here from the documented choices (docs/method.md,
shared/notes/method-facts.md): BM25 with Lucene's formula and one-byte length norms over a unigram and a
bigram field of "title\\ntext" (stopword n-grams kept as a placeholder that counts in the length), the
subject's own article(s) by exact case-insensitive title, the datastore of every one-wordpiece,
non-punctuation, non-[UNK] word of every sentence masked in turn (``[CLS] sentence [SEP]``, the state of
``hidden_states[layer]`` at the mask, stored as float16), exact squared-L2 kNN inside the retrieved
articles, p_kNN ∝ Σ exp(−d/l) and p = λ·p_kNN + (1−λ)·p_BERT (p_BERT alone when nothing was found).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import unicodedata
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import IO

import numpy as np
import pytest
import torch
from transformers import BertForMaskedLM, BertTokenizerFast

from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.nodes.launch import free_port
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question
from bertknn_search.stopwords import STOPWORDS
from bertknn_search.terms import query_terms, tokenize
from tests.conftest import REQUIRE_ENGINES

ENGINES = ("opensearch", "elasticsearch")
READY_S = 180.0
TOLERANCE = 2e-3  # max |difference| over the vocabulary of p_kNN and of p
MASK = "[MASK]"
K1, B = 1.2, 0.75
STOP_TERM = "_"  # what a stopword n-gram is indexed as: never queried, counted in the field length


# -- the engines, started as a user starts them ---------------------------------------------------------
@dataclass
class Node:
    """One ``bertknn-search engine start`` process and what it printed."""

    name: str
    port: int
    proc: subprocess.Popen[str]
    lines: queue.Queue[str | None]
    log: IO[str]
    log_path: Path
    url: str | None = None


def _drain(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _ports(count: int) -> list[int]:
    """HTTP ports whose nodes' ranges (P and the transport port P+100) do not overlap each other."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if all(abs(port - p) > 101 for p in ports):
            ports.append(port)
    return ports


def _start(name: str, port: int, root: Path) -> Node:
    log_path = root / f"{name}.stderr"
    log = log_path.open("w", encoding="utf-8")
    cmd = [sys.executable, "-m", "bertknn_search", "engine", "start", name, "--port", str(port)]
    cmd += ["--data", str(root / name), "--heap", "512m"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    lines: queue.Queue[str | None] = queue.Queue()
    assert proc.stdout is not None
    threading.Thread(target=_drain, args=(proc.stdout, lines), daemon=True).start()
    return Node(name, port, proc, lines, log, log_path)


def _ready(node: Node, deadline: float) -> str:
    """The node's URL once its ready line came; fails or skips (REQUIRE_ENGINES) with the reason if not."""
    if node.url is not None:
        return node.url
    try:
        line = node.lines.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        line = ""
        why = f"no ready line within {READY_S:.0f} s"
    else:
        why = "it exited before it was ready" if line is None else f"it printed {line!r}"
    if line and line.startswith("ready: "):
        node.url = line.split()[1]
        return node.url
    node.log.flush()
    said = node.log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    message = f"bertknn-search engine start {node.name} failed: {why}; stderr: {' | '.join(said[-3:])}"
    if REQUIRE_ENGINES:
        pytest.fail(message + " (BERTKNN_REQUIRE_ENGINES is set: engines are required here)")
    pytest.skip(message)


def _stop(node: Node) -> None:
    """SIGTERM and wait: ``engine start`` stops its JVM itself, though only once its start is over (up to
    its own 180 s wait, then 30 s to stop). Past that, its JVM (in a session of its own, found by the
    node's unique port) and then the command are killed, so no node outlives the test."""
    if node.proc.poll() is None:
        node.proc.send_signal(signal.SIGTERM)
        try:
            node.proc.wait(READY_S + 60)
        except subprocess.TimeoutExpired:
            found = subprocess.run(["pgrep", "-f", f"http.port={node.port} "], capture_output=True, text=True)
            for pid in found.stdout.split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
            node.proc.kill()
            node.proc.wait(10)
    node.log.close()


@pytest.fixture(scope="module")
def heldout_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Node]]:
    """Both engines, started at once before the other fixtures build (the test waits for the ready lines)."""
    root = tmp_path_factory.mktemp("heldout-engines")
    nodes = {name: _start(name, port, root) for name, port in zip(ENGINES, _ports(len(ENGINES)))}
    try:
        yield nodes
    finally:
        for node in nodes.values():
            _stop(node)


# -- BERT-kNN written anew ------------------------------------------------------------------------------
def _lucene_int_to_byte4(i: int) -> int:
    """Lucene's ``SmallFloat.intToByte4``: a field length as one byte (exact below 24, then 4 bits)."""
    free = 24  # 255 - longToInt4(Integer.MAX_VALUE)
    if i < free:
        return i
    v = i - free
    bits = v.bit_length()
    if bits < 4:
        return free + v
    shift = bits - 4
    return free + (((v >> shift) & 0x07) | ((shift + 1) << 3))


def _lucene_byte4_to_int(b: int) -> int:
    free = 24
    if b < free:
        return b
    i = b - free
    bits, shift = i & 0x07, (i >> 3) - 1
    return free + (bits if shift == -1 else (bits | 0x08) << shift)


def lucene_length(n: int) -> int:
    """The field length BM25 sees for a field of ``n`` tokens (after the one-byte norm)."""
    return _lucene_byte4_to_int(_lucene_int_to_byte4(n))


@dataclass
class Field:
    """One BM25 field over all articles: per article its term counts and (norm-rounded) length."""

    counts: list[Counter[str]]
    lengths: list[int]
    avgdl: float
    df: Counter[str]

    @classmethod
    def of(cls, docs: list[list[str]]) -> Field:
        counts = [Counter(d) for d in docs]
        df: Counter[str] = Counter()
        for c in counts:
            df.update(c.keys())
        return cls(counts, [lucene_length(len(d)) for d in docs], sum(map(len, docs)) / len(docs), df)

    def score(self, term: str, doc: int) -> float:
        tf = self.counts[doc].get(term, 0)
        if not tf:
            return 0.0
        n, total = self.df[term], len(self.counts)
        idf = math.log(1.0 + (total - n + 0.5) / (n + 0.5))
        norm = K1 * (1.0 - B + B * self.lengths[doc] / self.avgdl)
        return idf * tf * (K1 + 1.0) / (tf + norm)


@dataclass(frozen=True)
class Expected:
    hits: list[str]
    p_knn: np.ndarray
    p: np.ndarray
    top1: int
    n_neighbors: int


class Reference:
    """BERT-kNN over the corpus, from the paper and the project's documented choices."""

    def __init__(self, corpus: Path, config: Config) -> None:
        assert config.mask_policy == "single-wordpiece" and config.distance == "squared-l2"
        assert config.use_ir and config.gate == "none"
        self.config = config
        self.articles = [json.loads(line) for line in corpus.read_text("utf-8").splitlines() if line.strip()]
        self.tokenizer = BertTokenizerFast.from_pretrained(config.model)
        self.model = BertForMaskedLM.from_pretrained(config.model).eval()
        self.vocab_size = int(self.model.config.vocab_size)
        self.max_length = min(config.max_length, int(self.model.config.max_position_embeddings))
        vocab = {i: w for w, i in self.tokenizer.get_vocab().items()}
        special = set(self.tokenizer.all_special_ids)
        self.answerable = np.array(
            [
                i not in special and bool(vocab.get(i)) and not vocab[i].startswith("[unused")
                for i in range(self.vocab_size)
            ]
        )
        self._index_articles()
        self._build_datastore()

    # IR --------------------------------------------------------------------------------------------
    def _index_articles(self) -> None:
        unigram_docs, bigram_docs = [], []
        for a in self.articles:
            tokens = [STOP_TERM if t in STOPWORDS else t for t in tokenize(f"{a['title']}\n{a['text']}")]
            unigram_docs.append(tokens)
            bigram_docs.append(
                [STOP_TERM if STOP_TERM in (x, y) else f"{x}_{y}" for x, y in pairwise(tokens)]
            )
        self.unigrams, self.bigrams = Field.of(unigram_docs), Field.of(bigram_docs)

    def bm25(self, query: str, n: int) -> list[str]:
        unigrams, bigrams = query_terms(query)
        scored = []
        for d, a in enumerate(self.articles):
            s = sum(self.unigrams.score(t, d) for t in unigrams)
            s += sum(self.bigrams.score(t, d) for t in bigrams)
            if s > 0:
                scored.append((-s, a["id"]))
        return [aid for _, aid in sorted(scored)[:n]]

    def retrieve(self, q: Question) -> list[str]:
        n = self.config.n_articles
        if q.subject:
            key = q.subject.strip().lower()
            own = sorted(a["id"] for a in self.articles if a["title"].strip().lower() == key)
            if own:
                return own[:n]
        if q.subject and q.subject.strip():
            query = q.subject.strip()
        else:
            query = q.text.replace(MASK, " ").strip().rstrip(".?! \t\n")
        return self.bm25(query, n)

    # Datastore -------------------------------------------------------------------------------------
    def _build_datastore(self) -> None:
        tok = self.tokenizer
        width = self.max_length - 2
        rows: list[tuple[list[int], int]] = []
        owners, values = [], []
        for a in self.articles:
            for sentence in split_sentences(a["text"]):
                enc = tok(sentence, add_special_tokens=False, return_offsets_mapping=True)
                ids, offsets, words = enc["input_ids"], enc["offset_mapping"], enc.word_ids()
                for pos, w in enumerate(words):
                    one_piece = (pos == 0 or words[pos - 1] != w) and (
                        pos + 1 == len(words) or words[pos + 1] != w
                    )
                    if not one_piece or ids[pos] == tok.unk_token_id:
                        continue
                    text = sentence[offsets[pos][0] : offsets[pos][1]]
                    if all(unicodedata.category(ch)[0] in "PS" for ch in text):
                        continue
                    lo = 0 if len(ids) <= width else min(max(pos - width // 2, 0), len(ids) - width)
                    window = list(ids[lo : lo + width])
                    window[pos - lo] = tok.mask_token_id
                    rows.append(([tok.cls_token_id, *window, tok.sep_token_id], pos - lo + 1))
                    owners.append(a["id"])
                    values.append(ids[pos])
        keys = np.zeros((len(rows), self.model.config.hidden_size), np.float16)
        for lo in range(0, len(rows), 64):
            batch = rows[lo : lo + 64]
            keys[lo : lo + len(batch)] = self._states(batch).astype(np.float16)
        self.keys, self.owners, self.values = keys.astype(np.float32), np.array(owners), np.array(values)

    def _states(self, rows: list[tuple[list[int], int]]) -> np.ndarray:
        """hidden_states[layer] at the mask of each (ids, mask position) row."""
        return self._forward(rows)[0]

    def _forward(self, rows: list[tuple[list[int], int]]) -> tuple[np.ndarray, np.ndarray]:
        width = max(len(ids) for ids, _ in rows)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (row, _) in enumerate(rows):
            ids[r, : len(row)] = torch.tensor(row)
            attention[r, : len(row)] = 1
        at = (torch.arange(len(rows)), torch.tensor([m for _, m in rows]))
        with torch.no_grad():
            out = self.model(input_ids=ids, attention_mask=attention, output_hidden_states=True)
        state = out.hidden_states[self.config.layer][at].double().numpy()
        return state, torch.softmax(out.logits[at].double(), dim=-1).numpy()

    # Answers ---------------------------------------------------------------------------------------
    def answer(self, q: Question) -> Expected:
        ids = self.tokenizer(q.text.strip())["input_ids"]
        assert ids.count(self.tokenizer.mask_token_id) == 1
        state, p_bert = self._forward([(ids, ids.index(self.tokenizer.mask_token_id))])
        state, p_bert = state[0], p_bert[0]
        hits = self.retrieve(q)
        inside = np.flatnonzero(np.isin(self.owners, hits))
        p_knn = np.zeros(self.vocab_size)
        near = np.zeros(0, np.int64)
        if inside.size:
            d = ((self.keys[inside].astype(np.float64) - state) ** 2).sum(axis=1)
            near = np.argsort(d, kind="stable")[: self.config.k]
            weights = np.exp(-(d[near] - d[near].min()) / self.config.temperature)
            p_knn = np.bincount(self.values[inside][near], weights, self.vocab_size) / weights.sum()
            lam = self.config.lam
            p = lam * p_knn + (1 - lam) * p_bert
        else:
            p = p_bert
        top1 = int(np.argmax(np.where(self.answerable, p, -1.0)))
        return Expected(hits, p_knn, p, top1, int(near.size))


# -- the check ------------------------------------------------------------------------------------------
def heldout_questions(facts: list[Fact], n: int = 6) -> list[Question]:
    """KB questions (subject → own article), free questions (BM25 top 3) and a few edge cases."""
    qs = []
    for f in facts[:n]:
        qs.append(Question(f"{f.person.title()} was born in {MASK}.", f.person.title()))
        qs.append(Question(f"Many people in {MASK} knew {f.person.title()} as a famous {f.job}."))
    first = facts[0]
    qs += [
        Question(f"{MASK} was born in {first.city.title()}.", first.person.upper()),  # any case of a title
        Question(f"{first.person.title()} worked as a {MASK}.", f"the {first.job} {first.person}"),  # BM25
        Question(f"{first.city.title()} is a small town near the {MASK}."),
        Question(f"The town is north of {MASK}!"),
        Question(f"{MASK} zzzunseen qqqunknown."),  # no article at all: BERT alone
    ]
    return qs


def check(backend: str, config: Config, qs: list[Question], expected: list[Expected]) -> dict[str, float]:
    """Assert ``backend``'s answers are the reference's; the largest differences of p_kNN and p."""
    searcher = Searcher.open(config)
    try:
        scored = searcher.score_batch(qs)
        worst = {"p_knn": 0.0, "p": 0.0}
        for q, s, e in zip(qs, scored, expected):
            what = f"{backend}: {q.text!r} (subject {q.subject!r})"
            assert [h.id for h in s.hits or []] == e.hits, what
            assert len(s.neighbors) == e.n_neighbors, what
            assert s.p_knn.shape == s.p.shape == e.p.shape, what
            for name, got, want in (("p_knn", s.p_knn, e.p_knn), ("p", s.p, e.p)):
                diff = float(np.max(np.abs(got - want)))
                worst[name] = max(worst[name], diff)
                assert diff <= TOLERANCE, f"{what}: {name} differs by {diff:.3g}"
            top, _ = searcher.ranked(s.p, s, 1)
            assert top == [e.top1], f"{what}: top-1 {top} != {e.top1}"
        return worst
    finally:
        searcher.close()


@pytest.mark.slow
@pytest.mark.opensearch
def test_engines_and_embedded_answer_as_bert_knn_written_anew(
    heldout_nodes: dict[str, Node], built_index: Config, base_config: Config, corpus: Path, facts: list[Fact]
) -> None:
    qs = heldout_questions(facts)
    reference = Reference(corpus, base_config)
    expected = [reference.answer(q) for q in qs]
    assert sum(e.n_neighbors > 0 for e in expected) >= len(qs) - 1  # the questions reach the kNN step
    assert sum(len(e.hits) == base_config.n_articles for e in expected) >= 8  # and BM25's top 3
    # The embedded index first, while the engines are still starting.
    worst = {"embedded": check("embedded", built_index, qs, expected)}

    deadline = time.monotonic() + READY_S

    def ingested(name: str) -> Config:
        url = _ready(heldout_nodes[name], deadline)
        config = base_config.replace(backend=name, opensearch_prefix="heldout", **{f"{name}_url": url})
        ingest(corpus, config, progress=False)
        return config

    # Each engine is filled as soon as it is ready, both at once: most of an ingest is the engine's.
    with ThreadPoolExecutor(len(ENGINES)) as pool:
        filling = {name: pool.submit(ingested, name) for name in ENGINES}
        configs = {name: f.result() for name, f in filling.items()}
    for name, config in configs.items():
        worst[name] = check(name, config, qs, expected)
    print("held-out check, max |difference| over the vocabulary:", worst)
