"""Ingest pipeline: corpus -> sentences -> contexts -> store, resumable article by article."""

from __future__ import annotations

import contextlib
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path

from tqdm import tqdm

from bertknn_search import interrupts
from bertknn_search.backends import open_backend
from bertknn_search.backends.base import Backend, check_meta
from bertknn_search.config import Config
from bertknn_search.encoding.encoder import Encoder
from bertknn_search.errors import (
    BackendError,
    BertKnnError,
    ConfigError,
    InputFormatError,
    Interrupted,
    StoreWriteError,
    Terminated,
)
from bertknn_search.ingest import input_stamp, record_limits
from bertknn_search.ingest.contexts import MaskedRow, build_blocks, encode_rows, make_rows
from bertknn_search.ingest.prepare import (
    PreparedArticle,
    TextPool,
    TextSpec,
    default_workers,
    fingerprint_settings,
)
from bertknn_search.ingest.progress import Progress
from bertknn_search.ingest.readers import InputMeter, Record, read_articles, read_records, record_size, warn
from bertknn_search.ingest.seen_ids import SeenIds
from bertknn_search.ingest.sentences import SPLITTER, check_splitter
from bertknn_search.records import Article, EncodedArticle, IndexMeta

CHUNK_CHARS = 60_000  # articles are encoded together up to this much text, so batches mix sentences
CHUNK_ARTICLES = 64
# A lazy ingest writes text only, and each write makes tantivy segments that are merged 8 at a time: at
# 64 articles a write the merges were most of the time, at 4,000 still half of it (benchmarks/README.md).
# A write of this size is one segment of a few hundred MB of writer heap (article_index.HEAP_PER_CHAR).
TEXT_CHUNK_CHARS = 48_000_000
TEXT_CHUNK_ARTICLES = 16_000
# A lazy ingest's first chunk is small, so the bar moves within a second or two instead of after the
# first 16,000 articles (one more tantivy segment, merged with the others).
FIRST_TEXT_CHUNK = (1_000_000, 500)
MAX_PENDING_WRITES = 2  # encoded groups waiting for the writer thread; bounds memory
# An eager chunk is written in groups of about this many seconds of encoding: what a stop may lose.
COMMIT_S = 10.0


@dataclass(frozen=True)
class IngestSummary:
    """What one ingest or add run did."""

    articles: int  # written by this run (new or replaced)
    already_stored: int  # already stored with the same fingerprint (a resumed run skips them)
    empty: int  # skipped: no text
    sentences: int
    contexts: int
    seconds: float
    location: str = ""  # the index written to, as the backend shows it
    replaced: int = 0  # of ``articles``: ids that were stored before with other text or settings
    duplicates: int = 0  # input records whose id came again later in the input (the later one wins)
    # Sentences longer than the model takes (``max_length`` tokens), encoded as a window around each mask.
    windowed: int = 0
    max_length: int = 0
    too_large: int = 0  # articles skipped for holding more than ``Config.max_article_bytes``
    # articles skipped for an id or title some backend cannot store (``record_limits``), each named on stderr
    unstorable: int = 0
    # XML pages whose markup the parser could not take (past its time bound, or it crashed): their text is
    # the plain fallback's, each named on stderr (``page_parse.page_text``)
    unparsed: int = 0
    text_chars: int = 0  # characters of text written by this run
    contexts_mode: str = "eager"  # "lazy": no context was encoded; they are on first use

    @property
    def contexts_per_second(self) -> float:
        return self.contexts / self.seconds if self.seconds > 0 else 0.0


def index_meta(config: Config, encoder: Encoder) -> IndexMeta:
    return IndexMeta(
        config.model,
        config.layer,
        encoder.dim,
        encoder.vocab_size,
        config.mask_policy,
        config.store_dtype,
        encoder.max_length,
        config.contexts,
        encoder.precision,
        SPLITTER,
        config.no_ir_graph,
    )


def ingest(
    source: Path | Sequence[Article],
    config: Config,
    *,
    limit: int | None = None,
    fmt: str | None = None,
    progress: bool = True,
    existing_only: bool = False,
    encoder: Encoder | None = None,
    workers: int | None = None,
) -> IngestSummary:
    """Build (or extend) the index ``config`` names from a corpus file or directory.

    Re-running the same command after a crash or Ctrl-C skips every article already stored with the
    same fingerprint and finishes the rest; an article whose text changed is replaced. A new index is
    created only once the first articles have been read, so a corpus that fails at once leaves none.

    Args:
        source: a Wikipedia XML dump, JSONL, parquet or WikiExtractor output (see ``read_articles``),
            or articles already read (an id given twice: the later one is used).
        config: model, layer, index location, batch size, device.
        limit: stop after this many articles read.
        fmt: force the input format instead of detecting it.
        progress: show a progress bar and a time estimate on stderr.
        existing_only: the index must already exist (the ``add`` command).
        encoder: a loaded encoder to reuse (a server adds with the one it keeps); default: load one.
        workers: processes that read, strip, split and prepare IR text (``prepare.TextPool``); 0 does
            it on a thread of this process; default ``prepare.default_workers()``.

    Raises:
        InputFormatError, ModelLoadError, ConfigError (a bad device), IndexNotFoundError,
        IndexMismatchError, BackendError (a failed write says how many articles it kept).
    """
    started = time.perf_counter()
    asked, stamped = config, isinstance(source, Path) and not existing_only and limit is None
    before = input_stamp.stored_now(config) if isinstance(source, Path) and not existing_only else None
    replay = input_stamp.unchanged(source, config, fmt, before[0]) if stamped and before else None
    if replay is not None and before is not None:
        return _unchanged(source, replay, before[1], config.contexts, started, progress)
    input_stamp.forget(config)  # written again only by a run that reads its input to the end
    said: list[str] = []
    skipped, unparsed, refused = SkipCount(said), SkipCount(said), SkipCount(said)
    where = str(source) if isinstance(source, Path) else "the articles given"

    def unstorable(article: Article, why: str) -> None:
        refused(record_limits.warning(where, article, why))

    backend: Backend | None = open_backend(config, for_writing=True) if existing_only else None
    pool = TextPool(default_workers() if workers is None else workers)  # starts no process yet
    lazy = config.contexts == "lazy"
    if lazy and config.no_ir_graph:  # checked here, not in Config: an existing index's mode is adopted first
        raise ConfigError(
            "--no-ir-graph is for an eager index (--contexts eager): --no-ir searches every context,"
            " which a lazy index does not hold"
        )
    duplicates = 0
    meter: InputMeter | None = None
    if isinstance(source, Sequence):
        latest = {a.id: a for a in source}
        duplicates = len(source) - len(latest)
        records: Iterable[Record] = list(latest.values())
        total: int | None = len(latest)
    else:
        meter = InputMeter(source)
        records = read_records(
            source, limit, fmt, max_bytes=config.max_article_bytes, on_skip=skipped, meter=meter
        )
        total = limit
    # The bar first, before anything slow (torch and transformers import for seconds, a first chunk is
    # read and prepared): the run is seen to start at once.
    bar = Progress("add" if existing_only else "ingest", total, "", progress, meter, lazy, started)
    if before is not None and before[0] and progress:
        bar.write(
            f"resuming: {before[0]:,} articles already stored in {before[1]}; unchanged ones are skipped"
        )
    first_chunk: Future[list[PreparedArticle] | None] | None = None
    try:
        precision = config.precision
        if precision == "auto" and backend is not None:
            precision = backend.meta().precision  # contexts of one index are never mixed
        # A lazy ingest runs no model, so its first chunk needs only the input limit (the fingerprints
        # record it), which the model's config.json gives: it is prepared while the encoder's libraries
        # import, not after.
        early = _capped_max_length(config) if lazy else None
        if early is not None:
            chunks = pool.map(_chunks(records, *_text_chunk(), FIRST_TEXT_CHUNK), _spec(config, early))
            first_chunk = _ahead(chunks)
        encoder = encoder or Encoder(
            config.model, config.layer, config.device, config.max_length, precision, config.runtime
        )
        device = encoder.placement.device  # a bad --device fails here, before an index is created
        bar.on(str(device))
        if progress and not lazy:  # a lazy ingest runs no model: nothing to say
            bar.write(encoder.placement.describe())
        # The limit actually used (capped at the model's): fingerprints and the index meta record this one.
        config = config.replace(max_length=encoder.max_length)
        meta = index_meta(config, encoder)
        if backend is not None:
            check_meta(backend.meta(), meta, backend.location)
            check_splitter(backend.meta().splitter, backend.location)
        if early is not None and early != encoder.max_length:
            raise ConfigError(
                f"model {config.model!r}: its config.json allows {early} tokens, transformers"
                f" {encoder.max_length}; give --max-length {encoder.max_length}"
            )
        if first_chunk is None:
            size = _text_chunk() if lazy else (CHUNK_CHARS, CHUNK_ARTICLES)
            chunks = pool.map(_chunks(records, *size, FIRST_TEXT_CHUNK if lazy else None), _spec(config))
            first_chunk = _ahead(chunks)
        # The first chunk is read and prepared before a new index is created: input that fails at
        # once leaves no index behind.
        first = interrupts.result(first_chunk)
        if backend is None:
            backend = open_backend(config, create=meta)
            check_splitter(backend.meta().splitter, backend.location)
    except BaseException:
        bar.close()
        pool.close()
        if backend is not None:
            with contextlib.suppress(BertKnnError):
                backend.close()
        raise
    batch_size = config.batch_for(device.type)
    counts = {"articles": 0, "already_stored": 0, "empty": 0, "sentences": 0, "contexts": 0, "replaced": 0}
    counts["text_chars"] = 0
    counts["duplicates"], counts["windowed"], counts["max_length"] = duplicates, 0, config.max_length
    writes = _Writes(backend)
    pending: deque[Future[None]] = deque()
    pace = _Pace()
    rest = chain([first] if first is not None else [], chunks)
    seen = SeenIds()
    try:
        # The stages overlap: chunks are read on the "prepare" thread and prepared (decoded, stripped,
        # split, IR text) in the worker processes ahead of need; the next one is checked against the
        # index and turned into rows on the "prepare" thread while this one is encoded here, and the
        # previous one is written on the "writer" thread. On a GPU the main thread mostly waits on the
        # device, so the CPU stages no longer add to it.
        # A lazy ingest's writes come back to back: as one run (``Backend.bulk``) the embedded backend
        # merges tantivy segments beside the next writes instead of waiting at each. An eager one
        # encodes between its writes, minutes on a CPU, and leaves the lock free meanwhile for others.
        # The executors inside finish every write before the run ends.
        with (
            backend.bulk(TEXT_CHUNK_ARTICLES, TEXT_CHUNK_CHARS) if lazy else contextlib.nullcontext(),
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare") as preparer,
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="writer") as writer,
        ):
            ahead = preparer.submit(_prepare, rest, backend, encoder, config, seen, unparsed, unstorable)
            while (prepared := interrupts.result(ahead)) is not None:
                ahead = preparer.submit(_prepare, rest, backend, encoder, config, seen, unparsed, unstorable)
                counts["already_stored"] += prepared.reused
                counts["empty"] += prepared.empty
                counts["duplicates"] += prepared.duplicates
                if prepared.todo:
                    bar.start_chunk(len(prepared.rows))
                    for items in _encoded(prepared, encoder, batch_size, meta, config, bar, pace):
                        # The queue bound keeps memory flat when the store is slower than the encoder.
                        pending.append(writer.submit(writes.store, items, prepared.ir_fields))
                        while len(pending) > MAX_PENDING_WRITES:
                            writes.settle(pending.popleft())
                    counts["articles"] += len(prepared.todo)
                    counts["replaced"] += prepared.replaced
                    counts["sentences"] += sum(len(s) for s in prepared.sentences)
                    counts["contexts"] += len(prepared.rows)
                    counts["windowed"] += len({(r.article, r.sentence) for r in prepared.rows if r.windowed})
                chars = sum(len(a.text) for a in prepared.todo)
                counts["text_chars"] += chars
                bar.end_chunk(prepared.size, len(prepared.todo), len(prepared.rows), chars)
            while pending:
                writes.settle(pending.popleft())
    except BaseException as exc:
        bar.close()
        pool.close()
        # The error that stopped the ingest is the one to report, not a second one from closing.
        with contextlib.suppress(BertKnnError):
            backend.close()
        if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Interrupted):
            # The writer thread has finished its write by now: what it committed is what is kept.
            raise Interrupted(writes.committed, isinstance(exc, Terminated)) from exc
        raise
    bar.close()
    pool.close()
    skips = {"too_large": skipped.count, "unparsed": unparsed.count, "unstorable": refused.count}
    if stamped and input_stamp.place(asked) is not None:
        kept = {"empty": counts["empty"], "duplicates": counts["duplicates"], **skips}
        input_stamp.record(source, asked, fmt, backend.stats().articles, kept, said)  # type: ignore[arg-type]
    backend.close()
    seconds = time.perf_counter() - started
    return IngestSummary(
        **counts, seconds=seconds, location=backend.location, contexts_mode=config.contexts, **skips
    )


def _unchanged(
    source: Path, replay: input_stamp.Replay, location: str, mode: str, started: float, say: bool
) -> IngestSummary:
    """The summary of a run whose input is unchanged since a complete run read it: what that run said
    about the input, said again, and its counts; nothing is read. ``say``: why, in a line (not for
    --json or --no-progress, whose stderr holds only warnings)."""
    for line in replay.lines:
        warn(line)
    if say:
        print(
            f"{source} is unchanged since this index was built from it in full (same size, modification"
            " time and settings): nothing to read (touch it to read it again)",
            file=sys.stderr,
        )
    seconds = time.perf_counter() - started
    counts = {"empty": 0, **replay.counts}
    return IngestSummary(
        0,
        replay.articles,
        sentences=0,
        contexts=0,
        seconds=seconds,
        location=location,
        contexts_mode=mode,
        **counts,
    )


class SkipCount:
    """Counts the articles a reader said a line about (skipped for their size, or their markup stripped by
    the fallback), each line said on stderr as it comes."""

    def __init__(self, said: list[str] | None = None) -> None:
        self.count = 0
        self._said = said  # every line said, in order (a complete run's stamp keeps them)

    def __call__(self, message: str) -> None:
        self.count += 1
        if self._said is not None:
            self._said.append(message)
        with tqdm.external_write_mode(file=sys.stderr):  # a progress bar is cleared, and drawn again after
            warn(message)


class _Writes:
    """The writer thread's side: writes batches in order and stops at the first that fails."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self.committed = 0  # articles in batches written by this run
        self._failed: StoreWriteError | None = None

    def store(self, items: Sequence[EncodedArticle], ir_fields: dict[str, tuple[str, str]]) -> None:
        if self._failed is not None:
            raise self._failed  # nothing after a failed batch is written, so "kept" stays exact
        try:
            self._backend.add_articles(items, ir_fields)
        except StoreWriteError as exc:
            self._failed = exc
            raise
        self.committed += len(items)

    def settle(self, write: Future[None]) -> None:
        """Wait for one write; a failed one is reported with what the run has kept."""
        try:
            interrupts.result(write)
        except StoreWriteError as exc:
            kept = (
                f"the {self.committed:,} articles written before it are kept and the rest is not:"
                " run the same command again to resume"
                if self.committed
                else "nothing was written"
            )
            raise BackendError(f"cannot write to index at {exc.location}: {exc.reason}; {kept}") from exc


def add_articles(
    source: Path, config: Config, *, limit: int | None = None, fmt: str | None = None, progress: bool = True
) -> IngestSummary:
    """Add (or replace) the articles of ``source`` in an existing index; answerable on return.

    The whole file is read and checked before anything is written, so a bad file adds nothing; an
    article over ``config.max_article_bytes`` is skipped with a warning and counted as ``too_large``.

    Raises:
        InputFormatError: unreadable file, or an article without text (an explicit add of nothing).
    """
    skipped, unparsed = SkipCount(), SkipCount()
    articles = list(
        read_articles(
            source, limit, fmt, max_bytes=config.max_article_bytes, on_skip=skipped, on_unparsed=unparsed
        )
    )
    for article in articles:
        if not article.text.strip():
            raise InputFormatError(
                f"{source}: article {article.title!r} (id {article.id}) has no text; add text or drop it"
            )
    summary = ingest(articles, config, progress=progress, existing_only=True)
    return replace(summary, too_large=skipped.count, unparsed=unparsed.count)


def _encoded(
    prepared: Prepared,
    encoder: Encoder,
    batch_size: int,
    meta: IndexMeta,
    config: Config,
    bar: Progress,
    pace: _Pace,
) -> Iterator[list[EncodedArticle]]:
    """The chunk's articles as the index stores them, in groups written one by one: with contexts, or
    as text alone (lazy, one group).

    An eager chunk is minutes of encoding on a CPU; each group is about ``COMMIT_S`` of it, so a stop loses
    at most that much (written groups are kept, and a re-run skips them).
    """
    if meta.contexts == "lazy":
        yield [EncodedArticle(a, None, fp) for a, fp in zip(prepared.todo, prepared.fingerprints)]
        return
    for first, end in pace.groups([r.article for r in prepared.rows], len(prepared.todo), batch_size):
        rows = [replace(r, article=r.article - first) for r in prepared.rows if first <= r.article < end]
        began = time.perf_counter()
        vectors = encode_rows(rows, encoder, batch_size, on_batch=bar.encoded)
        pace.told(len(rows), time.perf_counter() - began)
        yield build_blocks(prepared.todo[first:end], prepared.sentences[first:end], rows, vectors, config)


class _Pace:
    """Sizes an eager chunk's write groups by the encoder's measured rate (contexts per second)."""

    def __init__(self) -> None:
        self.rate: float | None = None

    def told(self, rows: int, seconds: float) -> None:
        if rows and seconds > 0:
            self.rate = rows / seconds

    def groups(self, owners: Sequence[int], articles: int, batch_size: int) -> Iterator[tuple[int, int]]:
        """[first, end) article ranges of about ``COMMIT_S`` of encoding each (whole articles, at least one
        batch of rows, so batches stay full); until a rate is known, a batch's worth."""
        per_article = [0] * articles
        for owner in owners:
            per_article[owner] += 1
        first = 0
        while first < articles:
            wanted = max(batch_size, int((self.rate or 0) * COMMIT_S))
            end, rows = first, 0
            while end < articles and (rows < wanted or end == first):
                rows += per_article[end]
                end += 1
            yield first, end
            first = end


@dataclass(frozen=True)
class Prepared:
    """One chunk ready for the encoder: what to (re)write, its sentences and masked rows."""

    size: int  # articles read, including reused and empty ones
    todo: list[Article]
    fingerprints: list[str]  # of ``todo``
    sentences: list[list[str]]
    rows: list[MaskedRow]
    ir_fields: dict[str, tuple[str, str]]  # article id -> unigram and bigram field text (embedded)
    reused: int  # already stored with the same fingerprint
    empty: int  # without text
    replaced: int = 0  # of ``todo``: stored before with another fingerprint
    duplicates: int = 0  # records whose id comes again later (in this chunk or seen in an earlier one)


def _prepare(
    chunks: Iterator[list[PreparedArticle]],
    backend: Backend,
    encoder: Encoder,
    config: Config,
    seen: SeenIds,
    unparsed: SkipCount,
    unstorable: Callable[[Article, str], None],
) -> Prepared | None:
    """Take the next prepared chunk and do what needs the index and the tokenizer; None at the end.

    Runs on one thread only (the "prepare" thread), so ``chunks`` is never advanced from two at once.
    ``unparsed`` is told of the chunk's pages whose markup the fallback stripped, ``unstorable`` of each
    article skipped for an id or title some backend cannot store.
    """
    chunk = next(chunks, None)
    if chunk is None:
        return None
    for p in chunk:
        if p.note is not None:
            unparsed(p.note)
    latest = {p.article.id: p for p in chunk}  # an id seen twice in one chunk: the later text wins
    again_in_chunk = len(chunk) - len(latest)  # counted before any is skipped: a skip is no duplicate
    # Skipped on every backend alike, so that no index holds an article another could not.
    refused = {aid: why for aid, p in latest.items() if (why := record_limits.unstorable(p.article))}
    for aid, why in refused.items():
        unstorable(latest.pop(aid).article, why)
    # An id seen in an earlier chunk is written by then (writes keep their order), though perhaps not
    # yet when this chunk is prepared: this later record replaces it.
    earlier = {aid for aid, again in zip(latest, seen.add(latest)) if again}
    with_text = [p for p in latest.values() if p.article.text.strip()]
    stored = backend.fingerprints([p.article.id for p in with_text])
    todo = [p for p in with_text if stored.get(p.article.id) != p.fingerprint]
    # A lazy index splits and encodes an article when a query first needs it, not here.
    sentences = [] if config.contexts == "lazy" else [p.sentences or [] for p in todo]
    rows = make_rows(sentences, encoder, config.mask_policy, encoder.max_length)
    return Prepared(
        size=len(chunk),
        todo=[p.article for p in todo],
        fingerprints=[p.fingerprint for p in todo],
        sentences=sentences,
        rows=rows,
        ir_fields={p.article.id: p.ir_fields for p in todo if p.ir_fields is not None},
        reused=len(with_text) - len(todo),
        empty=len(latest) - len(with_text),
        replaced=sum(p.article.id in stored or p.article.id in earlier for p in todo),
        duplicates=again_in_chunk + len(earlier),
    )


def _chunks(
    records: Iterable[Record], max_chars: int, max_articles: int, first: tuple[int, int] | None = None
) -> Iterator[list[Record]]:
    """Records in chunks of up to ``max_chars`` characters or ``max_articles`` articles (the first one
    up to ``first``'s, when given)."""
    chunk: list[Record] = []
    size = 0
    chars, articles = (
        (max_chars, max_articles)
        if first is None
        else (min(first[0], max_chars), min(first[1], max_articles))
    )
    for record in records:
        chunk.append(record)
        size += record_size(record)
        if size >= chars or len(chunk) >= articles:
            yield chunk
            chunk, size = [], 0
            chars, articles = max_chars, max_articles
    if chunk:
        yield chunk


def _text_chunk() -> tuple[int, int]:
    """A lazy ingest's chunk: (characters, articles) at most."""
    return TEXT_CHUNK_CHARS, TEXT_CHUNK_ARTICLES


def _spec(config: Config, max_length: int | None = None) -> TextSpec:
    return TextSpec(
        fingerprint_settings(config.model, config.layer, config.mask_policy, max_length or config.max_length),
        split=config.contexts == "eager",  # a lazy index splits an article when a query needs it
        ir_fields=config.backend == "embedded",  # OpenSearch analyses the text itself
    )


def _ahead(chunks: Iterator[list[PreparedArticle]]) -> Future[list[PreparedArticle] | None]:
    """The first chunk, read and prepared on a thread of its own (its worker processes do the work)."""
    runner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="first-chunk")
    try:
        return runner.submit(next, chunks, None)
    finally:
        runner.shutdown(wait=False)


def _capped_max_length(config: Config) -> int | None:
    """``config.max_length`` capped at the model's own limit as ``Encoder`` caps it, from its config.json
    on disk; None where that is not on disk (the Encoder then says)."""
    from bertknn_search.encoding.model_lookup import model_max_length

    own = model_max_length(config.model)
    return None if own is None else min(config.max_length, own)
