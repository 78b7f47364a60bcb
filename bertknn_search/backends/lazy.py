"""LazyDatastore: a Backend whose contexts are encoded the first time a query's IR step picks an article.

A query only ever searches the top-N articles, so encoding an article when it is first needed gives
exactly the answers an eager index of the same corpus gives, while ingest becomes a text-and-IR pass and
the store holds only what has been asked about. The stored contexts are those ingest would have written:
the same splitter, rows, encoder and fingerprint.

On a CPU a long article is minutes of encoding. With a budget, a question has a budget of the
article's contexts encoded first (in ``encode_order``'s order), and answers over those, saying so; each
part is stored, so the next question, a server's idle time or ``warm`` goes on where it stopped. An
article encoded to its end is stored as an eager index stores it, with the same rows; its keys equal an
eager index's to float rounding (in bf16, a key depends a little on the rows batched with it, which can
flip a near tie between two answers).
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np

from bertknn_search.backends.article_rows import rows_in_slices, split_in_slices
from bertknn_search.backends.base import Store
from bertknn_search.backends.encode_order import Lexicon, order_rows
from bertknn_search.backends.memory_parts import MemoryParts
from bertknn_search.config import Config
from bertknn_search.encoding.encoder import Encoder
from bertknn_search.encoding.placement import check_precision
from bertknn_search.errors import LazyIndexError
from bertknn_search.ingest.contexts import RowTable
from bertknn_search.records import (
    ArticleHit,
    ContextBlock,
    Coverage,
    EncodedArticle,
    EncodeHooks,
    EncodePlan,
    EncodeProgress,
    IndexMeta,
    IndexStats,
    Neighbors,
    PendingArticle,
)

TOUCH_EVERY_S = 60.0
# With a front end waiting to slip questions in between (a server), a batch of rows takes about this
# long through the model: the model lets them in between two transformer blocks
# (``Encoder.between_blocks``), so a question that arrives during a cold encode waits for one block of
# a batch, a few milliseconds. Smaller batches cost throughput on a CPU; bigger ones, that wait.
STEP_S = 0.15
# Encoded rows are stored at least this often (and when a call ends or is stopped): each store is one
# transaction, so a kill loses at most this much work and never leaves a part half-written.
FLUSH_S = 5.0
# How a question's rows are ranked (encode_order.STRATEGIES): the benchmark compares them; "lead" won at
# every budget a CPU affords.
ORDER = "lead"
ROWS_CACHED = 16  # articles whose split sentences and rows are kept between calls (long ones revisited)
# A step without a front end waiting holds at most this many batches of rows: model inputs are made per
# step, so a long article's encode holds a step's inputs, never the whole article's.
STEP_BATCHES = 8
# Under a budget of seconds, a first step before the encoder's rate is known (this process has not encoded
# yet) holds this many rows: a fraction of a second for BERT-base on a CPU, then steps fit the time left.
DEADLINE_FIRST_ROWS = 8


@dataclass
class _Article:
    """What encoding an article needs, kept between calls: its sentences, rows and their lexicon."""

    sentences: list[str]
    rows: RowTable  # every row of the article, in make_rows order
    _lexicon: Lexicon | None = None

    @property
    def lexicon(self) -> Lexicon:
        if self._lexicon is None:  # only a budget ranks rows; exact and idle work never need it
            spans = np.stack([self.rows.sentence, self.rows.start, self.rows.end], axis=1)
            self._lexicon = Lexicon.of(self.sentences, spans)
        return self._lexicon


@dataclass
class _Work:
    """One article being encoded: its rows, which are stored, and what this call encodes of it."""

    pending: PendingArticle
    article: _Article
    todo: np.ndarray  # row numbers not stored yet

    @property
    def sentences(self) -> list[str]:
        return self.article.sentences

    @property
    def rows(self) -> RowTable:
        return self.article.rows

    @property
    def id(self) -> str:
        return self.pending.article.id


class LazyDatastore:
    """Wraps a store: ``ensure_contexts`` and ``knn`` encode what is missing, everything else delegates.

    On a store that cannot be written (a read-only volume) contexts are encoded into memory for this
    process and never stored.

    Attributes:
        encoded_contexts: contexts this object has encoded since it was opened (for reports).
    """

    def __init__(self, store: Store, encoder: Encoder, config: Config) -> None:
        self.store = store
        self.parts: Store = MemoryParts(store) if store.read_only else store
        self.encoder = encoder
        self.config = config
        self.encoded_contexts = 0
        self.encoded_articles = 0
        self._touched: dict[str, float] = {}  # article id -> when this process last recorded a use
        self._rows: OrderedDict[tuple[str, str], _Article] = OrderedDict()
        self._rate = 0.0  # rows per second of the last encoder step: sizes the next step's batches
        self._busy: dict[str, int] = {}  # article id -> encode calls now running on it (a server's)

    @property
    def name(self) -> str:
        return str(getattr(self.store, "name", "backend"))

    @property
    def location(self) -> str:
        return self.store.location

    def meta(self) -> IndexMeta:
        return self.store.meta()

    # -- encoding -----------------------------------------------------------------------------------
    def ensure_contexts(self, article_ids: Sequence[str], plan: EncodePlan | None = None) -> int:
        """Encode and store contexts of ``article_ids`` that are not stored, in one batched pass.

        Without a plan, or with no budget, every missing context; with a budget, for each question of
        the plan at most that many of its articles' missing contexts, those most like it first.

        Returns:
            How many contexts were encoded now (0 when all that is wanted was stored).
        """
        ids = sorted(set(article_ids))
        plan = plan or EncodePlan()
        work = self._work(self.parts.unencoded(ids), plan.hooks.between)
        self._store_empty([w for w in work if not len(w.rows)])
        encoded = self._encode(work, self._choose(work, plan), plan) if work else 0
        self._touch(ids)
        if self.config.cache_size is not None and not self.store.read_only:
            self.store.evict_contexts(self.config.cache_size, ids)
        return encoded

    def encode_more(self, max_contexts: int, plan: EncodePlan | None = None) -> int:
        """Encode up to ``max_contexts`` more of the most recently used partly encoded article(s), but
        none that another call is encoding now (a server's question, which would encode it again).

        Returns:
            Contexts encoded; 0 when no article is partly encoded (or every one is being encoded).
        """
        plan = plan or EncodePlan()
        ids = [a for a in self.parts.partial_articles(4) if a not in self._busy]
        work = self._work(self.parts.unencoded(ids), plan.hooks.between)
        chosen: dict[str, np.ndarray] = {}
        left = max_contexts
        for w in work:
            if left <= 0:
                break
            chosen[w.id] = w.todo[:left]  # the article's own order: the lead section first
            left -= len(chosen[w.id])
        return self._encode(work, chosen, plan, steps_of=STEP_BATCHES) if chosen else 0

    def coverage(self, article_ids: Sequence[str]) -> dict[str, Coverage]:
        return self.parts.coverage(article_ids)

    def _work(
        self, pending: Sequence[PendingArticle], between: Callable[[], None] | None = None
    ) -> list[_Work]:
        from bertknn_search.ingest.sentences import check_splitter

        if not pending:
            return []
        meta = self.store.meta()
        check_precision(meta.precision, self.encoder.precision, self.location)
        check_splitter(meta.splitter, self.location)
        out = []
        for p in pending:
            key = (p.article.id, p.fingerprint)
            cached = self._rows.get(key)
            if cached is None:
                # In slices, between which a server answers the questions that wait (article_rows).
                sentences = p.sentences
                if sentences is None:
                    sentences = split_in_slices(p.article.text, between)
                table = rows_in_slices(sentences, self.encoder, meta, between)
                cached = _Article(sentences, table)
                self._rows[key] = cached
                while len(self._rows) > ROWS_CACHED:
                    self._rows.popitem(last=False)
            self._rows.move_to_end(key)
            todo = np.setdiff1d(np.arange(len(cached.rows)), p.done)
            out.append(_Work(p, cached, todo))
        return out

    def _choose(self, work: Sequence[_Work], plan: EncodePlan) -> dict[str, np.ndarray]:
        """Row numbers to encode now per article, best first: everything, or each question's budget."""
        if plan.budget is None:
            return {w.id: w.todo for w in work}
        by_id = {w.id: w for w in work}
        chosen: dict[str, list[np.ndarray]] = {}
        asked = set()
        for focus in plan.focus:
            mine = [by_id[a] for a in focus.article_ids if a in by_id]
            asked.update(w.id for w in mine)
            ranked = [
                (w.id, order_rows(focus.question, focus.subject, w.article, w.todo, ORDER)) for w in mine
            ]
            for aid, rows in _best(ranked, plan.budget).items():
                chosen.setdefault(aid, []).append(rows)
        # Best first (a deadline may stop the encode part way), each row once.
        out = {aid: _first_seen(np.concatenate(parts)) for aid, parts in chosen.items()}
        # Articles no question of the plan searches (a caller that just wants them whole) get everything.
        out.update({w.id: w.todo for w in work if w.id not in asked})
        return {aid: rows for aid, rows in out.items() if rows.size}

    def _encode(
        self, work: Sequence[_Work], chosen: Mapping[str, np.ndarray], plan: EncodePlan, steps_of: int = 1
    ) -> int:
        """Encode the chosen rows in steps, storing them as parts; what is encoded is stored on any exit.

        Args:
            steps_of: batches a step holds with a front end waiting (without one, STEP_BATCHES). A step's
                rows are sorted by length, so more batches pad less; a stop loses the step it is in.
        """
        from bertknn_search.ingest.contexts import encode_rows

        by_id = {w.id: w for w in work}
        deadline = plan.deadline if plan.budget is not None else None
        # Under a deadline, the articles' rows in turn, best first: the first of each (which every article
        # needs, see ``_best``) lead, and wherever it stops, each article has its best rows.
        queue = (
            _in_turn(chosen)
            if deadline is not None
            else [(a, int(r)) for a, rows in chosen.items() for r in rows]
        )
        if not queue:
            return 0
        needed = len(chosen) if deadline is not None else len(queue)
        hooks = plan.hooks
        batch = self.config.batch_for(self.encoder.placement.device.type)
        titles = tuple(by_id[aid].pending.article.title for aid in chosen)
        total = sum(len(by_id[aid].rows) for aid in chosen)
        started = flushed = time.monotonic()
        done: dict[str, list[tuple[int, np.ndarray]]] = {}
        encoded = 0
        paused = [0.0]  # seconds spent in ``between``: others' turns, not this encode's
        between = None if hooks.between is None else _timed(hooks.between, paused)
        for aid in chosen:
            self._busy[aid] = self._busy.get(aid, 0) + 1
        try:
            while encoded < len(queue):
                # Without a front end waiting, steps are large (batching), bounded so that model inputs
                # are made for a step's rows, never a whole long article's. With one, batches are sized
                # to STEP_S (a block of one is what a waiting question waits for), and a question's
                # step is one batch, so that a stop loses at most that.
                size = batch if between is None else self._batch_rows(batch)
                rows = size * (STEP_BATCHES if between is None else steps_of)
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if encoded >= needed and left <= 0:
                        break
                    rows = min(rows, self._deadline_rows(left, needed - encoded))
                # In the article's order within a step, so that encoding an article whole batches its
                # rows as ingest does (what is encoded first is decided by which rows a step holds).
                step = sorted(queue[encoded : encoded + rows])
                began, waited = time.monotonic(), paused[0]
                with self.encoder.between_blocks(between):
                    vectors = encode_rows(
                        [row for a, r in step for row in by_id[a].rows.rows([r])],
                        self.encoder,
                        size,
                        _told(hooks, encoded, len(queue), titles, total, started),
                    )
                took = time.monotonic() - began - (paused[0] - waited)
                self._rate = len(step) / took if took > 0 else 0.0
                for (aid, row), vector in zip(step, vectors):
                    done.setdefault(aid, []).append((row, vector))
                encoded += len(step)
                if time.monotonic() - flushed >= FLUSH_S and encoded < len(queue):
                    self._store(by_id, done)
                    done, flushed = {}, time.monotonic()
        finally:
            for aid in chosen:
                self._busy[aid] -= 1
                if not self._busy[aid]:
                    del self._busy[aid]
            self._store(by_id, done)
        return encoded

    def _deadline_rows(self, left: float, needed: int) -> int:
        """Rows a step may hold with ``left`` seconds to the deadline: what the last rate passes in that
        time (``DEADLINE_FIRST_ROWS`` before a rate is known), and at least the ``needed`` ones."""
        fits = DEADLINE_FIRST_ROWS if self._rate <= 0 else int(self._rate * max(left, 0.0))
        return max(fits, needed, 1)

    def _batch_rows(self, batch: int) -> int:
        """Rows per batch that the model passes in about STEP_S, at the last step's rate."""
        if self._rate <= 0:
            return 1
        return int(min(max(self._rate * STEP_S, 1), batch))

    def _store(self, by_id: Mapping[str, _Work], done: Mapping[str, list[tuple[int, np.ndarray]]]) -> None:
        """Write what was encoded: one transaction, each article as a part, or whole if all of it."""
        items = []
        for aid, encoded in done.items():
            w = by_id[aid]
            encoded.sort(key=lambda rv: rv[0])
            rows = np.array([r for r, _ in encoded], dtype=np.int64)
            block = _block(w, rows, np.stack([v for _, v in encoded]))
            whole = w.pending.done.size == 0 and rows.size == len(w.rows)
            # The stored fingerprint, not one recomputed here: put_contexts stores an article only while
            # it still holds the text that was encoded, which is what this fingerprint names.
            items.append(
                EncodedArticle(
                    w.pending.article,
                    block,
                    w.pending.fingerprint,
                    rows=None if whole else rows,
                    total=None if whole else len(w.rows),
                )
            )
            w.pending = dataclasses.replace(w.pending, done=np.union1d(w.pending.done, rows))
        if items:
            self.parts.put_contexts(items)
            self.encoded_contexts += sum(len(i.contexts or ()) for i in items)
            self.encoded_articles += sum(i.rows is None for i in items)

    def _store_empty(self, work: Sequence[_Work]) -> None:
        """Articles without a single context are stored whole at once: nothing to encode, ever."""
        if work:
            none, vectors = np.zeros(0, np.int64), np.zeros((0, self.encoder.dim), np.float16)
            self.parts.put_contexts(
                [
                    EncodedArticle(w.pending.article, _block(w, none, vectors), w.pending.fingerprint)
                    for w in work
                ]
            )

    def _touch(self, ids: Sequence[str]) -> None:
        # Usage needs only minute resolution to order evictions, and a write per question would cost
        # more than the warm query itself: each article is recorded at most once a minute per process.
        now = time.monotonic()
        due = [i for i in ids if now - self._touched.get(i, -TOUCH_EVERY_S) >= TOUCH_EVERY_S]
        if due:
            self.parts.touch(due)
            self._touched.update(dict.fromkeys(due, now))

    def knn(self, vector: np.ndarray, k: int, article_ids: Sequence[str] | None = None) -> Neighbors:
        """As the store's ``knn``, after the contexts of ``article_ids`` are made searchable.

        Raises:
            LazyIndexError: ``article_ids`` is None (no-IR mode needs every context of the corpus).
        """
        if article_ids is None:
            raise LazyIndexError(
                f"index at {self.location} encodes contexts on demand, so it cannot search every context"
                " (--no-ir); build an eager index for that ablation: ingest wiki --contexts eager"
            )
        # A partly encoded article is searched as it is (a budget chose its parts); one never encoded
        # is encoded whole first, for callers that search without asking ``ensure_contexts`` first.
        seen = self.parts.coverage(article_ids)
        self.ensure_contexts([a for a in article_ids if a not in seen])
        return self.parts.knn(vector, k, article_ids)

    def sentences(self, refs: Sequence[tuple[str, int]]) -> list[str]:
        return self.parts.sentences(refs)

    def stats(self) -> IndexStats:
        return self.parts.stats()

    # -- the rest is the store's ------------------------------------------------------------------
    def add_articles(
        self, items: Sequence[EncodedArticle], ir_fields: Mapping[str, tuple[str, str]] | None = None
    ) -> None:
        self.store.add_articles(items, ir_fields)

    def bulk(self, write_articles: int, write_chars: int) -> AbstractContextManager[None]:
        return self.store.bulk(write_articles, write_chars)

    def delete_articles(self, article_ids: Sequence[str]) -> int:
        for aid in article_ids:
            self._touched.pop(aid, None)
        return self.store.delete_articles(article_ids)

    def fingerprints(self, article_ids: Sequence[str]) -> dict[str, str]:
        return self.store.fingerprints(article_ids)

    def find_titles(self, title: str, n: int) -> list[ArticleHit]:
        return self.store.find_titles(title, n)

    def search_articles(self, query: str, n: int) -> list[ArticleHit]:
        return self.store.search_articles(query, n)

    def list_titles(self, pattern: str, n: int) -> list[ArticleHit]:
        return self.store.list_titles(pattern, n)

    def titles(self, article_ids: Sequence[str]) -> dict[str, str]:
        return self.store.titles(article_ids)

    def close(self) -> None:
        self.store.close()


def _told(
    hooks: EncodeHooks, before: int, todo: int, titles: tuple[str, ...], total: int, started: float
) -> Callable[[int], None] | None:
    """An ``encode_rows`` batch callback that tells ``hooks.progress`` how far the whole call is."""
    if hooks.progress is None:
        return None
    report, done = hooks.progress, before

    def told(rows: int) -> None:
        nonlocal done
        done += rows
        report(EncodeProgress(done, todo, titles, time.monotonic() - started, total))

    return told


def _first_seen(rows: np.ndarray) -> np.ndarray:
    """``rows`` without repeats, each where it first comes."""
    _, first = np.unique(rows, return_index=True)
    return rows[np.sort(first)]


def _in_turn(chosen: Mapping[str, np.ndarray]) -> list[tuple[str, int]]:
    """(article, row) pairs taking each article's rows in turn: every article's first, then second, ..."""
    lists = [(aid, rows.tolist()) for aid, rows in chosen.items()]
    depth = max((len(rows) for _, rows in lists), default=0)
    return [(aid, int(rows[d])) for d in range(depth) for aid, rows in lists if d < len(rows)]


def _timed(between: Callable[[], None], paused: list[float]) -> Callable[[], None]:
    """``between``, adding the seconds it takes to ``paused[0]``."""

    def timed() -> None:
        began = time.monotonic()
        try:
            between()
        finally:
            paused[0] += time.monotonic() - began

    return timed


def _block(work: _Work, rows: np.ndarray, vectors: np.ndarray) -> ContextBlock:
    """The contexts of ``rows`` of an article (what ``build_blocks`` makes, from the row table)."""
    table = work.rows
    return ContextBlock(
        sentences=list(work.sentences),
        vectors=vectors.astype(np.float16, copy=False),
        token_ids=table.token_id[rows],
        sentence_ids=table.sentence[rows],
        starts=table.start[rows],
        ends=table.end[rows],
    )


def _best(ranked: Sequence[tuple[str, np.ndarray]], budget: int) -> dict[str, np.ndarray]:
    """The first ``budget`` rows of several articles' rankings, taken in turn (one article's best, the
    next's best, ...), so that each article a question searches gets its best rows encoded.

    Every article gets one row at least, even past the budget: an article with none stored would be
    searched as never encoded, which means encoding it whole.
    """
    taken: dict[str, list[int]] = {aid: [] for aid, _ in ranked}
    depth = 0
    left = max(budget, sum(len(rows) > 0 for _, rows in ranked))
    while left > 0 and any(depth < len(rows) for _, rows in ranked):
        for aid, rows in ranked:
            if depth < len(rows) and left > 0:
                taken[aid].append(int(rows[depth]))
                left -= 1
        depth += 1
    return {aid: np.array(rows, dtype=np.int64) for aid, rows in taken.items()}
