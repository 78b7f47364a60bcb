"""LazyDatastore: a Backend whose contexts are encoded the first time a query's IR step picks an article.

A query only ever searches the top-N articles, so encoding an article when it is first needed gives
exactly the answers an eager index of the same corpus gives, while ingest becomes a text-and-IR pass and
the store holds only what has been asked about. The stored contexts are those ingest would have written:
the same splitter, rows, encoder and fingerprint.

On a CPU a long article is minutes of encoding. With a budget, a question has a budget of the
article's contexts encoded first (in ``encode_order``'s order), and answers over those, saying so; each
part is stored, so the next question, a server's idle time or ``warm`` goes on where it stopped. Under a
budget of seconds each article first gets its floor (``FLOOR_ROWS``), which no clock cuts, and then each
question of a batch its own seconds in turn, so that a batch answers as its questions asked one at a time. An
article encoded to its end is stored as an eager index stores it, with the same rows; its keys equal an
eager index's to float rounding (in bf16, a key depends a little on the rows batched with it, which can
flip a near tie between two answers).
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np

from bertknn_search.backends.article_rows import rows_in_slices, split_in_slices
from bertknn_search.backends.base import Store
from bertknn_search.backends.encode_order import (
    Lexicon,
    best_in_turn,
    by_article,
    in_turn,
    merged,
    order_rows,
)
from bertknn_search.backends.memory_parts import MemoryParts
from bertknn_search.config import UNBOUNDED, Config
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
    Focus,
    IndexMeta,
    IndexStats,
    Neighbors,
    PendingArticle,
    SubjectArticles,
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
# Under a budget of seconds, each article a question searches holds at least this many of its contexts
# (its lead, in ORDER; all of a shorter one, never more than the budget of contexts) before the clock
# applies, whatever the load: a clock alone starved questions to 1-8 contexts (issue 39). Measured by
# benchmarks/bench_batch_budget.py on held-out T-REx facts (all-MiniLM-L6-v2, kNN only): see docs/lazy.md.
FLOOR_ROWS = 32


class _Encoded:
    """The rows one call has encoded, per article: a question's turn ranks what the ones before it left."""

    def __init__(self) -> None:
        self.rows: dict[str, set[int]] = {}

    def __contains__(self, row: tuple[str, int]) -> bool:
        return row[1] in self.rows.get(row[0], ())

    def __len__(self) -> int:
        return sum(len(rows) for rows in self.rows.values())

    def add(self, step: Iterable[tuple[str, int]]) -> None:
        for aid, row in step:
            self.rows.setdefault(aid, set()).add(row)

    def left(self, work: _Work) -> np.ndarray:
        """``work``'s rows stored neither before this call nor by it, in order."""
        mine = self.rows.get(work.id)
        return np.setdiff1d(work.todo, np.fromiter(mine, np.int64)) if mine else work.todo

    def stored(self, work: _Work) -> int:
        """How many of ``work``'s rows are stored (or encoded by this call, to be stored)."""
        return len(work.rows) - len(work.todo) + len(self.rows.get(work.id, ()))


@dataclass(frozen=True)
class _Phase:
    """Rows encoded together, best first: all of them (``seconds`` None), or until this encode has spent
    ``seconds`` of its own time on them (a question's turn; others' turns in between are not counted)."""

    rows: list[tuple[str, int]]
    seconds: float | None = None


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
        encoded = 0
        if work:
            so_far = _Encoded()
            scope, phases = self._phases(work, plan, so_far)
            encoded = self._encode(work, scope, phases, plan, so_far)
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
        if not chosen:
            return 0
        return self._encode(work, chosen, [_Phase(by_article(chosen))], plan, _Encoded(), STEP_BATCHES)

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

    def _phases(
        self, work: Sequence[_Work], plan: EncodePlan, encoded: _Encoded
    ) -> tuple[dict[str, np.ndarray], Iterable[_Phase]]:
        """What to encode now: the rows that may be (per article, best first) and the phases that encode
        them: everything (no budget); each question's budget of contexts, at once (no clock); or, with a
        clock, each question in turn as if asked alone: its floor, then its seconds (``_turns``)."""
        if plan.budget is None:
            everything = {w.id: w.todo for w in work}
            return everything, [_Phase(by_article(everything))]
        by_id = {w.id: w for w in work}
        picks = [self._pick(by_id, focus, plan.budget, encoded) for focus in plan.focus]
        # Articles no question of the plan searches (a caller that just wants them whole) get everything.
        searched = {aid for focus in plan.focus for aid in focus.article_ids}
        rest = {w.id: w.todo for w in work if w.id not in searched and w.todo.size}
        scope = merged([*picks, rest])
        if plan.seconds is None:
            return scope, [_Phase(by_article(scope))]
        return scope, self._turns(by_id, plan, plan.seconds, rest, encoded)

    def _turns(
        self,
        by_id: Mapping[str, _Work],
        plan: EncodePlan,
        seconds: float,
        rest: Mapping[str, np.ndarray],
        encoded: _Encoded,
    ) -> Iterator[_Phase]:
        """Each question's phases, made when its turn comes (from what the questions before it left): its
        floor, which no clock cuts, then ``seconds`` of its best rows, its articles in turn, so that
        wherever the clock stops each article has its best. A batch so answers as one at a time."""
        for focus in plan.focus:
            pick = self._pick(by_id, focus, plan.budget, encoded)
            floor = {aid: rows[: _floor(by_id[aid], encoded)] for aid, rows in pick.items()}
            yield _Phase(by_article(floor))
            yield _Phase(in_turn(pick), seconds)
        if rest:
            yield _Phase(by_article(rest), seconds)

    def _pick(
        self, by_id: Mapping[str, _Work], focus: Focus, budget: int | None, encoded: _Encoded
    ) -> dict[str, np.ndarray]:
        """A question's budget of the rows of its articles not encoded yet, per article, best first."""
        mine = [by_id[a] for a in focus.article_ids if a in by_id]
        ranked = [
            (w.id, order_rows(focus.question, focus.subject, w.article, encoded.left(w), ORDER)) for w in mine
        ]
        return {aid: rows for aid, rows in best_in_turn(ranked, budget or UNBOUNDED).items() if rows.size}

    def _encode(
        self,
        work: Sequence[_Work],
        scope: Mapping[str, np.ndarray],
        phases: Iterable[_Phase],
        plan: EncodePlan,
        encoded: _Encoded,
        steps_of: int = 1,
    ) -> int:
        """Encode the phases' rows in steps, storing them as parts; what is encoded is stored on any exit.

        Args:
            scope: every row the phases may hold, per article (for the progress shown and the articles
                marked busy).
            encoded: the rows encoded so far, added to here (the phases made later read it).
            steps_of: batches a step holds with a front end waiting (without one, STEP_BATCHES). A step's
                rows are sorted by length, so more batches pad less; a stop loses the step it is in.
        """
        from bertknn_search.ingest.contexts import encode_rows

        by_id = {w.id: w for w in work}
        articles = [aid for aid, rows in scope.items() if rows.size]
        if not articles:
            return 0
        todo = sum(int(scope[aid].size) for aid in articles)
        hooks = plan.hooks
        batch = self.config.batch_for(self.encoder.placement.device.type)
        titles = tuple(by_id[aid].pending.article.title for aid in articles)
        total = sum(len(by_id[aid].rows) for aid in articles)
        started = flushed = time.monotonic()
        done: dict[str, list[tuple[int, np.ndarray]]] = {}
        paused = [0.0]  # seconds spent in ``between``: others' turns, not this encode's

        def own() -> float:
            return time.monotonic() - paused[0]

        between = None if hooks.between is None else _timed(hooks.between, paused)
        for aid in articles:
            self._busy[aid] = self._busy.get(aid, 0) + 1
        try:
            for phase in phases:
                queue = [x for x in phase.rows if x not in encoded]
                deadline = None if phase.seconds is None else own() + phase.seconds
                at = 0
                while at < len(queue):
                    # Without a front end waiting, steps are large (batching), bounded so that model
                    # inputs are made for a step's rows, never a whole long article's. With one, batches
                    # are sized to STEP_S (a block of one is what a waiting question waits for), and a
                    # question's step is one batch, so that a stop loses at most that.
                    size = batch if between is None else self._batch_rows(batch)
                    rows = size * (STEP_BATCHES if between is None else steps_of)
                    if deadline is not None:
                        left = deadline - own()
                        if left <= 0:
                            break
                        rows = min(rows, self._deadline_rows(left))
                    # In the article's order within a step, so that encoding an article whole batches its
                    # rows as ingest does (what is encoded first is decided by which rows a step holds).
                    step = sorted(queue[at : at + rows])
                    began, waited = time.monotonic(), paused[0]
                    with self.encoder.between_blocks(between):
                        vectors = encode_rows(
                            [row for a, r in step for row in by_id[a].rows.rows([r])],
                            self.encoder,
                            size,
                            _told(
                                hooks,
                                len(encoded),
                                max(todo, len(encoded) + len(step)),
                                titles,
                                total,
                                started,
                            ),
                        )
                    took = time.monotonic() - began - (paused[0] - waited)
                    self._rate = len(step) / took if took > 0 else 0.0
                    for (aid, row), vector in zip(step, vectors):
                        done.setdefault(aid, []).append((row, vector))
                    encoded.add(step)
                    at += len(step)
                    if time.monotonic() - flushed >= FLUSH_S:
                        self._store(by_id, done)
                        done, flushed = {}, time.monotonic()
        finally:
            for aid in articles:
                self._busy[aid] -= 1
                if not self._busy[aid]:
                    del self._busy[aid]
            self._store(by_id, done)
        return len(encoded)

    def _deadline_rows(self, left: float) -> int:
        """Rows a step may hold with ``left`` seconds to the deadline: what the last rate passes in that
        time (``DEADLINE_FIRST_ROWS`` before a rate is known), one at least."""
        fits = DEADLINE_FIRST_ROWS if self._rate <= 0 else int(self._rate * max(left, 0.0))
        return max(fits, 1)

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
            LazyIndexError: ``article_ids`` is None (no-IR mode needs every context of the corpus) and some
                article is not encoded to its end.
        """
        if article_ids is None:
            # Once every article is encoded to its end the store holds what an eager index of the corpus
            # holds, so the no-IR ablation can search it all (eval warm over every article gets it there).
            held = self.parts.stats()
            if not held.encoded_whole or isinstance(self.parts, MemoryParts):
                raise LazyIndexError(
                    f"index at {self.location} encodes contexts on demand, so it cannot search every context"
                    f" (--no-ir) before every article is encoded ({held.encoded_articles:,} of"
                    f" {held.articles:,}); build an eager index for it: ingest wiki --contexts eager"
                )
            return self.parts.knn(vector, k, None)
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

    def subject_articles(self, subject: str, query: str, n: int, closest: int = 0) -> SubjectArticles:
        return self.store.subject_articles(subject, query, n, closest)

    def closest_titles(self, subject: str, n: int) -> list[ArticleHit]:
        return self.store.closest_titles(subject, n)

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


def _floor(work: _Work, encoded: _Encoded) -> int:
    """Rows of ``work``'s ranking no clock cuts: up to ``FLOOR_ROWS`` stored (all of a shorter article),
    and one at least for an article with none (one with none would be searched as never encoded)."""
    stored = encoded.stored(work)
    return max(min(FLOOR_ROWS, len(work.rows)) - stored, 0 if stored else 1)


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
