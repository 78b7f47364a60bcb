"""ArticleIndex: the embedded backend's BM25 article search, a tantivy index beside the SQLite file.

tantivy scores with Lucene's BM25 (k1 1.2, b 0.75, Lucene's one-byte length norms, idf never negative,
and the (k1 + 1) factor of OpenSearch's default similarity). Its Python binding scores every article
matching a query (no block-max WAND), so a question's frequent terms are made optional beside its rare
ones when that provably keeps the same top n (``pruning``). It indexes the project's own terms
(``bertknn_search.terms``), joined by spaces into a unigram and a bigram field that its whitespace
tokenizer splits back, so both backends rank the same strings.

SQLite stays the record of which articles exist; tantivy and SQLite have no shared transaction, so:
- one writer at a time holds ``write.lock`` for its whole write, or for a whole run of writes (``bulk``,
  an ingest: its segment merges then go on beside the next writes instead of being waited for at each);
- every write gives its articles a new random version, stored in SQLite's row and the tantivy document;
- the new documents are committed to tantivy before the SQLite transaction commits, and the versions they
  replace are deleted only after it (``settle``);
- before its tantivy commit a writer names its articles in ``articles.pending.json`` and removes the file
  once both stores agree; the next writer or open that finds the file left by a writer that died deletes,
  for those articles, every document whose version SQLite does not hold;
- a reader takes its SQLite snapshot first and searches a tantivy searcher taken after a snapshot of the
  same generation (the counter in SQLite's ``meta`` table that every write of articles increments in its
  transaction): the one the last search took, while the generation is unchanged, else a fresh one. It
  keeps a hit only when its snapshot holds the article at that version, or holds it at a version the
  searcher no longer has (a write settled after the snapshot was taken: the article is then ranked by its
  newer text). Every article of a generation was committed to tantivy before that generation was, and
  tantivy never deletes an article's last document, so no reader sees an article in one store but not
  the other, nor a version a writer that died left behind.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import tantivy
from filelock import FileLock, Timeout

from bertknn_search.backends.embedded.pruning import bm25_total_docs, split_query
from bertknn_search.errors import BackendError, IndexCorruptError
from bertknn_search.stopwords import STOPWORDS
from bertknn_search.terms import BIGRAM_JOIN, document_text, tokenize

IR_DIR = "articles.tantivy"
PENDING = "articles.pending.json"
LOCK = "write.lock"
PARTS = (IR_DIR, PENDING, LOCK)  # what this module keeps in an index directory
# Stands in for every stopword n-gram: they are never queried (terms.query_terms) but count in the field
# lengths, as in OpenSearch; one shared term keeps their postings out of the index. tokenize never
# yields "_".
STOPWORD_TERM = "_"
LOCK_TIMEOUT_S = 60.0  # as long as SQLite waits for its own write lock
# tantivy writes one segment per indexing thread and commit, and merges every 8 segments of a size
# into one; with the bigram field's millions of distinct terms a merge costs about what indexing the
# documents did, so a write gets as few threads, each with as large a heap, as keeps its documents in
# one segment each (benchmarks/README.md, "Text pass").
# Writer heap per character of article text. 8.7 kept 16,000 Wikipedia-shaped articles in one segment, 12
# a text whose every bigram is new; tantivy allocates the heap as the segment grows, so spare budget
# costs no memory.
HEAP_PER_CHAR = 16
MIN_HEAP = 64_000_000  # per indexing thread
MAX_HEAP = 3_000_000_000  # per indexing thread; tantivy takes less than 4 GB
DOCS_PER_THREAD = 4_000  # a write gets at most one indexing thread per this many documents
CORES_PER_THREAD = 4  # and one per this many cores: the rest prepare text and merge segments
# Hits beyond n fetched at first, so that a tie at the n-th is seen (two: with one, 2% of 300 questions on
# 100,000 articles had the n-th tied with the next and searched again); more (longer ties, articles a
# reader does not hold yet) are fetched only when needed, as a smaller top-k prunes more postings.
FIRST_FETCH = 2
SHOULD, MUST = tantivy.Occur.Should, tantivy.Occur.Must

# The committed SQLite version of each article id SQLite holds (ids it lacks are left out).
Versions = Callable[[Sequence[str]], dict[str, int]]


def field_texts(title: str, text: str) -> tuple[str, str]:
    """The unigram and bigram field text an article is indexed with: its terms joined by spaces."""
    stop = STOPWORD_TERM
    tokens = [stop if t in STOPWORDS else t for t in tokenize(document_text(title, text))]
    # "is" against the one placeholder object, and a list for join: the fast forms of this hot loop.
    pairs = [stop if a is stop or b is stop else a + BIGRAM_JOIN + b for a, b in pairwise(tokens)]
    return " ".join(tokens), " ".join(pairs)


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("id", stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_unsigned_field("version", stored=True, indexed=True)
    # "freq": term frequencies without positions; BM25 needs no more.
    builder.add_text_field("unigrams", tokenizer_name="whitespace", index_option="freq")
    builder.add_text_field("bigrams", tokenizer_name="whitespace", index_option="freq")
    return builder.build()


class ArticleBatch:
    """The articles of one write: ``add`` them, then ``commit`` before the SQLite transaction commits."""

    def __init__(self, index: ArticleIndex, writer: tantivy.IndexWriter) -> None:
        self.version = secrets.randbits(63)  # unique even when a rolled-back write is done again
        self.ids: list[str] = []
        self.replaced: list[str] = []  # ids that had a document before: their old one goes in settle
        self.committed = False  # True from the moment the tantivy commit may have happened
        self._index = index
        self._writer = writer

    def add(self, article_id: str, fields: tuple[str, str], replaces: bool) -> None:
        """Queue an article's document; ``fields`` comes from ``field_texts``.

        Args:
            replaces: SQLite already holds this article (an older version is to be deleted).
        """
        doc = tantivy.Document()
        doc.add_text("id", article_id)
        doc.add_unsigned("version", self.version)
        doc.add_text("unigrams", fields[0])
        doc.add_text("bigrams", fields[1])
        with _tantivy_errors(self._index.root):
            self._writer.add_document(doc)
        self.ids.append(article_id)
        if replaces:
            self.replaced.append(article_id)

    def remove(self, article_id: str) -> None:
        """Queue the removal of an article this write deletes from SQLite: its documents go in settle."""
        self.ids.append(article_id)  # named in the pending file, so a writer that dies is repaired
        self.replaced.append(article_id)

    def commit(self) -> None:
        """Name the articles in the pending file, then make their documents durable in tantivy."""
        self._index._write_pending(self.ids)
        self.committed = True
        with _tantivy_errors(self._index.root):
            self._writer.commit()


class ArticleIndex:
    """The tantivy index in ``root/articles.tantivy`` and the lock and pending files beside it."""

    def __init__(self, root: Path, index: tantivy.Index) -> None:
        self.root = root
        self._index = index
        self._schema = index.schema
        self._lock = FileLock(root / LOCK)
        self._copy: tempfile.TemporaryDirectory[str] | None = None  # a read-only index is read from a copy
        self._bulk: _Bulk | None = None  # a run of writes (``bulk``) holding the lock and one writer
        # The searcher the last search took and the generation it was taken at (``searcher``).
        self._searcher: tuple[str, tantivy.Searcher] | None = None
        self._total: tuple[tantivy.Searcher, int | None] | None = None  # ``_total_docs``
        index.config_reader("manual")  # reloaded when the generation changes (``searcher``)

    @classmethod
    def create(cls, root: Path) -> ArticleIndex:
        """Create the index in ``root`` (or open the one a create that stopped half-way left there)."""
        (root / IR_DIR).mkdir(exist_ok=True)
        return cls(root, tantivy.Index(_schema(), path=str(root / IR_DIR)))

    @classmethod
    def open(cls, root: Path, read_only: bool = False) -> ArticleIndex:
        """Open the index in ``root``; ``read_only`` when its volume or directory cannot be written.

        tantivy takes a lock file even to read, which a read-only volume cannot hold, so there the
        index is read from a copy in a temporary directory (removed when this object goes).

        Raises:
            IndexCorruptError: no readable tantivy index there.
        """
        source = root / IR_DIR
        try:
            if not read_only:
                return cls(root, tantivy.Index.open(str(source)))
            copy = tempfile.TemporaryDirectory(prefix="bertknn-ir-")
            target = Path(copy.name) / IR_DIR
            shutil.copytree(source, target, ignore=shutil.ignore_patterns(".tantivy-*.lock"))
            index = cls(root, tantivy.Index.open(str(target)))
            index._copy = copy
            return index
        except (ValueError, OSError) as exc:
            raise IndexCorruptError(
                f"article index at {root / IR_DIR} cannot be read ({exc}); rebuild the index with ingest"
            ) from exc

    # -- reading ----------------------------------------------------------------------------------
    def search(
        self,
        unigrams: Sequence[str],
        bigrams: Sequence[str],
        n: int,
        held: Callable[[list[str]], dict[str, int]],
        generation: str | None,
    ) -> list[tuple[str, float]]:
        """Top ``n`` (article id, score) by BM25 summed over both fields, ties by id.

        Args:
            unigrams, bigrams: query terms (``terms.query_terms``).
            n: how many articles.
            held: the version the caller's SQLite snapshot holds of each of the given ids it holds;
                the snapshot must be taken before this call.
            generation: the snapshot's generation counter (``searcher``).
        """
        terms = [("unigrams", t) for t in unigrams] + [("bigrams", t) for t in bigrams]
        if not terms or n <= 0:
            return []
        searcher = self.searcher(generation)
        total = self._total_docs(searcher)
        split = None if total is None else split_query(searcher, terms, self._term, total)
        if split is not None:
            ranked, exact = self._top(searcher, split.query, n, held, split.bound)
            if exact:
                return ranked
        whole = tantivy.Query.boolean_query([(SHOULD, self._term(f, t)) for f, t in terms])
        return self._top(searcher, whole, n, held, -math.inf)[0]

    def _top(
        self,
        searcher: tantivy.Searcher,
        query: tantivy.Query,
        n: int,
        held: Callable[[list[str]], dict[str, int]],
        bound: float,
    ) -> tuple[list[tuple[str, float]], bool]:
        """The top ``n`` of ``query`` among the articles ``held`` holds, and whether it is the question's
        top ``n``: always for the whole query (``bound`` -inf), else when the n-th score is above
        ``bound``, the most an article ``query`` misses can score."""
        limit = n + FIRST_FETCH
        while True:
            hits = searcher.search(query, limit, count=False).hits
            found = []
            for score, address in hits:
                doc = searcher.doc(address)
                found.append((score, doc.get_first("id"), doc.get_first("version")))
            versions = held(list(dict.fromkeys(aid for _, aid, _ in found)))
            best: dict[str, float] = {}
            for score, aid, version in found:  # best first
                want = versions.get(aid)
                if want is None or aid in best:
                    continue
                if version == want or not self._has(searcher, aid, want):
                    best[aid] = score
            ranked = sorted((-score, aid) for aid, score in best.items())
            # Done when every match was fetched, or the n-th score beats the last fetched one (so
            # every article tied with it was fetched too and the id tie-break is exact).
            if len(hits) < limit or (len(ranked) >= n and -ranked[n - 1][0] > hits[-1][0]):
                exact = bound == -math.inf or (len(ranked) >= n and -ranked[n - 1][0] > bound)
                return [(aid, -neg) for neg, aid in ranked[:n]], exact
            limit *= 4

    def _total_docs(self, searcher: tantivy.Searcher) -> int | None:
        """tantivy's BM25 document count in ``searcher``, found once a searcher (``pruning``)."""
        if self._total is None or self._total[0] is not searcher:
            self._total = (searcher, bm25_total_docs(searcher, self._term("unigrams", STOPWORD_TERM)))
        return self._total[1]

    def searcher(self, generation: str | None) -> tantivy.Searcher:
        """A searcher holding every article of a SQLite snapshot at ``generation`` (taken before this call).

        A reload opens the last commit's segments again (0.07 ms of a 1.4 ms question at 100,000
        articles), so the searcher is kept while the generation stays the same. It was taken after a
        snapshot of that generation was read, and each write of that generation or before committed its
        documents to tantivy before its SQLite transaction: the searcher holds them all. Documents
        committed or settled away since are what ``search`` copes with anyway. ``None`` (no counter)
        reloads every time.
        """
        kept = self._searcher
        if kept is not None and generation is not None and kept[0] == generation:
            return kept[1]
        self._index.reload()
        searcher = self._index.searcher()
        self._searcher = None if generation is None else (generation, searcher)
        return searcher

    def documents(self) -> int:
        """Live documents in the last commit: one per article, two while a replacement settles."""
        self._index.reload()
        return self._index.searcher().num_docs

    def _has(self, searcher: tantivy.Searcher, article_id: str, version: int) -> bool:
        both = [(MUST, self._term("id", article_id)), (MUST, self._term("version", version))]
        return bool(searcher.search(tantivy.Query.boolean_query(both), 1, count=False).hits)

    def _term(self, field: str, term: str | int) -> tantivy.Query:
        return tantivy.Query.term_query(self._schema, field, term)

    # -- writing ----------------------------------------------------------------------------------
    @contextmanager
    def writing(self, versions: Versions, documents: int, text_chars: int = 0) -> Iterator[ArticleBatch]:
        """Hold the write lock and a tantivy writer for one write; settle both stores on the way out.

        The caller commits its SQLite transaction inside the ``with`` block, after ``batch.commit()``.

        Args:
            versions: reads the committed SQLite version of articles.
            documents, text_chars: how many articles the write adds, and their characters of text
                (they size the writer).

        Raises:
            BackendError: another writer holds the lock too long, or tantivy cannot write.
        """
        with self._write_writer(versions, documents, text_chars) as writer:
            batch = ArticleBatch(self, writer)
            try:
                yield batch
            except BaseException:
                # SQLite rolled back: the documents it does not hold go; if that fails too, the pending
                # file stays for the next writer to repair.
                with suppress(ValueError, OSError):
                    if batch.committed:
                        self._settle(writer, batch.ids, versions)
                        (self.root / PENDING).unlink(missing_ok=True)
                    else:
                        writer.rollback()
                raise
            if batch.committed:
                # The write is done (SQLite committed): a failure to settle leaves the pending file for
                # the next writer to repair, and readers skip the replaced documents meanwhile.
                with suppress(ValueError, OSError):
                    if batch.replaced:
                        self._settle(writer, batch.replaced, versions)
                    (self.root / PENDING).unlink(missing_ok=True)
            else:
                with _tantivy_errors(self.root):
                    writer.rollback()

    @contextmanager
    def _write_writer(
        self, versions: Versions, documents: int, text_chars: int
    ) -> Iterator[tantivy.IndexWriter]:
        """The tantivy writer of one write: the run's (``bulk``), or its own, under the write lock."""
        run = self._bulk
        if run is not None:
            with _tantivy_errors(self.root):
                size = max(documents, run.documents), max(text_chars, run.text_chars)
                writer = run.writer = run.writer or self._writer(*size)
            try:
                yield writer
            except BaseException:
                run.writer = None  # its merges stop; the next write of the run starts another
                raise
            return
        self._acquire()
        try:
            with _tantivy_errors(self.root):
                self._repair(versions)  # a run repairs once, when it takes the lock
                writer = self._writer(documents, text_chars)
            try:
                yield writer
            finally:
                with suppress(ValueError):
                    writer.wait_merging_threads()  # without it, the merges this write started are dropped
        finally:
            self._lock.release()

    @contextmanager
    def bulk(self, versions: Versions, documents: int, text_chars: int) -> Iterator[None]:
        """Hold the write lock and one tantivy writer across the writes made inside (an ingest).

        A write on its own waits for the segment merges its commit started, because the writer that
        runs them goes with it; in a run they go on beside the next writes (on other cores, and while
        the next text is prepared), and the run waits for them once, at its end. Each write is still
        one commit of its own, repaired as ever if the process dies. Other writers wait for the run.

        Args:
            versions: reads the committed SQLite version of articles.
            documents, text_chars: the most articles, and characters of text, one write of the run
                adds (they size the writer).

        Raises:
            BackendError: another writer holds the lock too long, or tantivy cannot write.
        """
        if self._bulk is not None:  # already in one: the outer run holds the writer
            yield
            return
        self._acquire()
        done = False
        try:
            with _tantivy_errors(self.root):
                self._repair(versions)
            self._bulk = _Bulk(documents, text_chars)
            yield
            done = True
        finally:
            run, self._bulk = self._bulk, None
            try:
                if run is not None and run.writer is not None and done:
                    with _tantivy_errors(self.root):
                        run.writer.wait_merging_threads()
                # After an error the writer is dropped without waiting: its merges stop, and the
                # segments they were merging stay as they are.
            finally:
                self._lock.release()

    def _acquire(self) -> None:
        try:
            self._lock.acquire(timeout=LOCK_TIMEOUT_S)
        except Timeout as exc:
            raise BackendError(
                f"another process has been writing to the index at {self.root} for"
                f" {LOCK_TIMEOUT_S:.0f} s; try again when it is done"
            ) from exc

    def recover(self, versions: Versions) -> None:
        """Repair what a writer that died left, unless another writer is at work (it settles itself)."""
        if not (self.root / PENDING).exists():
            return
        try:
            self._lock.acquire(timeout=0)
        except (Timeout, OSError):  # a live writer, or a read-only index: readers cope meanwhile
            return
        try:
            with suppress(ValueError, OSError):  # readers cope; the next writer repairs or reports
                self._repair(versions)
        finally:
            self._lock.release()

    def _repair(self, versions: Versions) -> None:
        ids = self._read_pending()
        if ids:
            writer = self._writer()
            self._settle(writer, ids, versions)
            writer.wait_merging_threads()
        (self.root / PENDING).unlink(missing_ok=True)

    def _settle(self, writer: tantivy.IndexWriter, ids: Sequence[str], versions: Versions) -> None:
        """Delete, and commit, every document of ``ids`` whose version SQLite does not hold."""
        held = versions(ids)
        groups: dict[int | None, list[str]] = {}
        for aid in dict.fromkeys(ids):
            groups.setdefault(held.get(aid), []).append(aid)
        for version, group in groups.items():
            of_ids = tantivy.Query.term_set_query(self._schema, "id", group)
            if version is None:
                writer.delete_documents_by_query(of_ids)
            else:
                current = tantivy.Query.term_query(self._schema, "version", version)
                writer.delete_documents_by_query(
                    tantivy.Query.boolean_query(
                        [(tantivy.Occur.Must, of_ids), (tantivy.Occur.MustNot, current)]
                    )
                )
        writer.commit()

    def _writer(self, documents: int = 0, text_chars: int = 0) -> tantivy.IndexWriter:
        threads = writer_threads(documents, os.cpu_count() or 1)
        heap = min(MAX_HEAP, max(MIN_HEAP, HEAP_PER_CHAR * text_chars // threads))
        return self._index.writer(heap_size=heap * threads, num_threads=threads)

    def _write_pending(self, ids: Sequence[str]) -> None:
        tmp = self.root / f"{PENDING}.tmp"
        with tmp.open("w", encoding="utf-8") as f:
            json.dump({"ids": list(ids)}, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.root / PENDING)

    def _read_pending(self) -> list[str] | None:
        try:
            return list(json.loads((self.root / PENDING).read_text(encoding="utf-8"))["ids"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            # Written whole through a rename before any tantivy commit; unreadable means never used.
            return []


@dataclass
class _Bulk:
    """A run of writes (``ArticleIndex.bulk``): the writer they share, made by the first of them."""

    documents: int
    text_chars: int
    writer: tantivy.IndexWriter | None = None


def writer_threads(documents: int, cores: int) -> int:
    """Indexing threads for a write of ``documents`` articles on ``cores`` cores: one per segment."""
    return max(1, min(cores // CORES_PER_THREAD, documents // DOCS_PER_THREAD))


@contextmanager
def _tantivy_errors(root: Path) -> Iterator[None]:
    try:
        yield
    except ValueError as exc:  # tantivy reports its I/O errors (disk full, lock busy) as ValueError
        raise BackendError(f"cannot write the article index at {root}: {exc}") from exc
