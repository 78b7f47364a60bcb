"""The tantivy article index: Lucene's BM25 ranking, id tie-breaks, and SQLite/tantivy consistency.

The expected scores are computed here from Lucene's formula and its one-byte length encoding
(``SmallFloat.intToByte4``, written out below), independently of the code under test.
"""

from __future__ import annotations

import json
import math
import random
import sqlite3
import subprocess
import sys
import textwrap
from collections import Counter
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock

from bertknn_search.backends.embedded import article_index
from bertknn_search.backends.embedded.article_index import LOCK, PENDING, ArticleBatch, field_texts
from bertknn_search.backends.embedded.backend import EmbeddedBackend
from bertknn_search.errors import BackendError
from bertknn_search.records import Article, ContextBlock, EncodedArticle
from bertknn_search.stopwords import STOPWORDS
from bertknn_search.terms import document_text, query_terms, tokenize
from tests.test_embedded import META

K1, B = 1.2, 0.75


def int_to_byte4(length: int) -> int:
    """Lucene's SmallFloat.intToByte4: exact below 24, then 4 significant bits, rounding down."""
    if length < 24:
        return length
    rest = length - 24
    shift = max(rest.bit_length() - 4, 0)
    code = rest if rest.bit_length() < 4 else ((rest >> shift) & 0x07) | ((shift + 1) << 3)
    return 24 + code


def byte4_to_int(code: int) -> int:
    if code < 24:
        return code
    code -= 24
    bits, shift = code & 0x07, (code >> 3) - 1
    return 24 + (bits if shift == -1 else (bits | 0x08) << shift)


@pytest.mark.parametrize(
    ("length", "decoded"), [(0, 0), (23, 23), (24, 24), (40, 40), (41, 40), (100, 96), (1000, 984)]
)
def test_the_oracle_length_encoding_is_lucenes(length: int, decoded: int) -> None:
    # Values worked by hand from Lucene's SmallFloat source.
    assert byte4_to_int(int_to_byte4(length)) == decoded


def lucene_bm25(docs: dict[str, tuple[str, str]], query: str) -> dict[str, float]:
    """OpenSearch's BM25 (with the (k1 + 1) factor) summed over the unigram and bigram fields."""
    unigrams, pairs = query_terms(query)
    fields = []
    for aid, (title, text) in docs.items():
        tokens = tokenize(document_text(title, text))
        grams = [f"{a}_{b}" for a, b in pairwise(tokens)]
        fields.append((aid, [(Counter(tokens), len(tokens)), (Counter(grams), len(grams))]))
    scores: dict[str, float] = {}
    for f, terms in ((0, unigrams), (1, pairs)):
        avgdl = sum(fs[f][1] for _, fs in fields) / len(fields)
        for term in terms:
            df = sum(1 for _, fs in fields if fs[f][0][term])
            idf = math.log(1 + (len(fields) - df + 0.5) / (df + 0.5))
            for aid, fs in fields:
                tf = fs[f][0][term]
                if tf:
                    dl = byte4_to_int(int_to_byte4(fs[f][1]))
                    norm = K1 * (1 - B + B * dl / avgdl)
                    scores[aid] = scores.get(aid, 0.0) + (K1 + 1) * idf * tf / (tf + norm)
    return scores


def article(aid: str, title: str, text: str) -> EncodedArticle:
    return EncodedArticle(Article(aid, title, text), ContextBlock.empty(META.dim, [text]), "f")


def zipf_corpus(n: int, seed: int) -> dict[str, tuple[str, str]]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(120)] + sorted(STOPWORDS)[:20]
    weights = [1 / (i + 1) for i in range(len(words))]
    return {
        f"{i:04d}": (
            f"Title {rng.choice(words)}",
            " ".join(rng.choices(words, weights, k=rng.randint(2, 300))),
        )
        for i in range(n)
    }


@pytest.fixture
def index_dir(tmp_path: Path) -> Path:
    return tmp_path / "idx"


def test_ranks_and_scores_as_lucene_bm25(index_dir: Path) -> None:
    docs = zipf_corpus(300, seed=1)
    backend = EmbeddedBackend.create(index_dir, META)
    try:
        # Several writes, so the index has several segments whose statistics must add up.
        items = [article(aid, *doc) for aid, doc in docs.items()]
        for start in range(0, len(items), 70):
            backend.add_articles(items[start : start + 70])
        rng = random.Random(2)
        for _ in range(40):
            query = " ".join(rng.sample([f"w{i}" for i in range(40)] + ["the", "of"], rng.randint(1, 4)))
            want = lucene_bm25(docs, query)
            ranked = sorted(want, key=lambda aid: (-want[aid], aid))[:10]
            hits = backend.search_articles(query, 10)
            assert [h.id for h in hits] == ranked, query
            np.testing.assert_allclose([h.score for h in hits], [want[a] for a in ranked], rtol=2e-6)
            assert all(h.title == docs[h.id][0] for h in hits)
    finally:
        backend.close()


def test_length_norms_are_lucenes_one_byte_norms_and_ties_break_by_id(index_dir: Path) -> None:
    # 97 and 100 tokens both store as 96: the same score, so the smaller id wins, not the shorter text.
    filler = " ".join(f"x{i}" for i in range(200))
    backend = EmbeddedBackend.create(index_dir, META)
    try:
        backend.add_articles(
            [
                article("b", "t", "needle " + " ".join(filler.split()[:95])),  # 97 tokens with the title
                article("a", "t", "needle " + " ".join(filler.split()[:98])),  # 100 tokens
                article("c", "t", "needle " + " ".join(filler.split()[:150])),
            ]
        )
        hits = backend.search_articles("needle", 3)
        assert [h.id for h in hits] == ["a", "b", "c"]
        assert hits[0].score == hits[1].score > hits[2].score
    finally:
        backend.close()


def test_every_article_tied_with_the_nth_is_considered(index_dir: Path) -> None:
    # Written in descending id order, so tantivy meets the largest ids first among 40 equal scores.
    backend = EmbeddedBackend.create(index_dir, META)
    try:
        backend.add_articles([article(f"{i:02d}", "same", "same text") for i in reversed(range(40))])
        assert [h.id for h in backend.search_articles("same text", 3)] == ["00", "01", "02"]
    finally:
        backend.close()


def test_stopword_ngrams_are_one_placeholder_term_that_still_counts_in_lengths() -> None:
    assert field_texts("Zorblat", "was born in Quenton") == (
        "zorblat _ born _ quenton",
        "_ _ _ _",
    )


# -- consistency between SQLite and tantivy -------------------------------------------------------
ORIGINAL = [article("1", "Quenton", "quenton is a town"), article("2", "River", "the river runs")]


def build(index_dir: Path) -> None:
    backend = EmbeddedBackend.create(index_dir, META)
    backend.add_articles(ORIGINAL)
    backend.close()


def add_and_die(index_dir: Path, where: str) -> None:
    """Replace article 1 and add article 3 in a child process that dies (os._exit) at ``where``."""
    script = f"""
        import os
        from bertknn_search.backends.embedded import article_index
        from bertknn_search.backends.embedded.backend import EmbeddedBackend
        from tests.test_article_index import article

        def dying(real):
            def run(*args, **kwargs):
                {"real(*args, **kwargs)" if where == "after_tantivy_commit" else ""}
                os._exit(3)
            return run

        target = article_index.{"ArticleBatch" if where == "after_tantivy_commit" else "ArticleIndex"}
        name = "{"commit" if where == "after_tantivy_commit" else "_settle"}"
        setattr(target, name, dying(getattr(target, name)))
        backend = EmbeddedBackend.open({str(index_dir)!r})
        backend.add_articles([article("1", "Quenton", "quenton is a city by the sea"),
                              article("3", "Farrowby", "farrowby is a village")])
    """
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=root, timeout=120)
    assert done.returncode == 3


def ids(backend: EmbeddedBackend, query: str) -> list[str]:
    return [h.id for h in backend.search_articles(query, 3)]


@pytest.mark.reliability
def test_death_after_the_tantivy_commit_is_invisible_and_repaired_on_open(index_dir: Path) -> None:
    build(index_dir)
    add_and_die(index_dir, "after_tantivy_commit")
    assert (index_dir / PENDING).exists()
    # While another writer holds the lock nothing is repaired, yet readers see only what SQLite holds.
    with FileLock(index_dir / LOCK):
        backend = EmbeddedBackend.open(index_dir)
        assert ids(backend, "farrowby village") == []
        assert ids(backend, "sea city") == []
        assert ids(backend, "quenton town") == ["1"]
        backend.close()
    assert (index_dir / PENDING).exists()
    backend = EmbeddedBackend.open(index_dir)  # repairs: the dead writer's documents are deleted
    try:
        assert not (index_dir / PENDING).exists()
        assert backend._ir.documents() == 2
        assert ids(backend, "quenton town") == ["1"] and ids(backend, "river") == ["2"]
        assert backend.fingerprints(["1", "2", "3"]) == {"1": "f", "2": "f"}
    finally:
        backend.close()


@pytest.mark.reliability
def test_death_after_the_sqlite_commit_is_complete_and_settled_by_the_next_write(index_dir: Path) -> None:
    build(index_dir)
    add_and_die(index_dir, "after_sqlite_commit")
    with FileLock(index_dir / LOCK):  # keep open() from repairing: readers alone must cope
        backend = EmbeddedBackend.open(index_dir)
    try:
        assert ids(backend, "sea city") == ["1"] and ids(backend, "farrowby") == ["3"]
        assert ids(backend, "town") == []  # article 1's old document may linger, but never answers as 1
        backend.add_articles([article("4", "Other", "other text")])  # the next writer repairs first
        assert not (index_dir / PENDING).exists()
        assert backend._ir.documents() == 4
        assert ids(backend, "quenton") == ["1"]
    finally:
        backend.close()


@pytest.mark.reliability
def test_a_failed_sqlite_commit_takes_the_new_documents_back_out(index_dir: Path, monkeypatch) -> None:
    build(index_dir)
    real = ArticleBatch.commit

    def commit_then_fail(self: ArticleBatch) -> None:
        real(self)
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(ArticleBatch, "commit", commit_then_fail)
    backend = EmbeddedBackend.open(index_dir)
    try:
        with pytest.raises(
            BackendError, match="database or disk is full; none of these 2 articles was written"
        ):
            backend.add_articles(
                [article("1", "Quenton", "quenton is a city"), article("3", "F", "farrowby")]
            )
        assert not (index_dir / PENDING).exists()
        assert backend._ir.documents() == 2
        assert ids(backend, "farrowby city") == [] and ids(backend, "town") == ["1"]
    finally:
        backend.close()


def test_a_writer_waits_for_the_lock_then_says_who_holds_it(index_dir: Path, monkeypatch) -> None:
    build(index_dir)
    monkeypatch.setattr(article_index, "LOCK_TIMEOUT_S", 0.01)
    backend = EmbeddedBackend.open(index_dir)
    try:
        with (
            FileLock(index_dir / LOCK),
            pytest.raises(BackendError, match="another process has been writing"),
        ):
            backend.add_articles([article("3", "F", "farrowby")])
        assert backend.fingerprints(["3"]) == {}
    finally:
        backend.close()


@pytest.mark.reliability
def test_two_writer_processes_at_once_leave_one_document_per_article(index_dir: Path) -> None:
    build(index_dir)
    script = """
        import sys
        from bertknn_search.backends.embedded.backend import EmbeddedBackend
        from tests.test_article_index import article

        who = sys.argv[1]
        backend = EmbeddedBackend.open(sys.argv[2])
        for i in range(15):  # its own articles, and article 1 replaced by both writers in turn
            mine = article(f"{who}{i}", "T", f"word{who}{i} shared")
            backend.add_articles([mine, article("1", "Q", f"writer{who}")])
        backend.close()
    """
    root = Path(__file__).resolve().parents[1]
    procs = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), who, str(index_dir)], cwd=root)
        for who in ("a", "b")
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    backend = EmbeddedBackend.open(index_dir)
    try:
        assert backend.stats().articles == 2 + 30
        assert backend._ir.documents() == 32
        assert not (index_dir / PENDING).exists()
        assert ids(backend, "worda7") == ["a7"] and ids(backend, "wordb14") == ["b14"]
        assert len(backend.search_articles("shared", 40)) == 30
        # Article 1 holds the last writer's text only: the other writer's version was settled away.
        assert sorted([ids(backend, "writera"), ids(backend, "writerb")]) == [[], ["1"]]
    finally:
        backend.close()


def test_an_id_given_twice_in_one_write_is_stored_once_with_the_later_text(index_dir: Path) -> None:
    build(index_dir)
    backend = EmbeddedBackend.open(index_dir)
    try:
        backend.add_articles([article("3", "F", "first farrowby"), article("3", "F", "second farrowby")])
        assert backend._ir.documents() == 3
        assert ids(backend, "farrowby second") == ["3"] and ids(backend, "first") == []
    finally:
        backend.close()


def _segments(index_dir: Path) -> int:
    meta = (index_dir / article_index.IR_DIR / "meta.json").read_text(encoding="utf-8")
    return len(json.loads(meta)["segments"])


@pytest.mark.parametrize(("heap_per_char", "one_segment"), [(article_index.HEAP_PER_CHAR, True), (0, False)])
def test_a_write_is_one_segment_whatever_its_size(
    index_dir: Path, monkeypatch, heap_per_char: int, one_segment: bool
) -> None:
    """tantivy merges segments 8 at a time at a cost like indexing them again: a write makes one.

    With the heap fixed at its minimum instead (``heap_per_char`` 0) the same write spills into several.
    """
    monkeypatch.setattr(article_index, "MIN_HEAP", 15_000_000)  # tantivy's least, so the test stays small
    monkeypatch.setattr(article_index, "HEAP_PER_CHAR", heap_per_char)
    rng = random.Random(5)
    words = [f"{rng.getrandbits(40):x}" for _ in range(50_000)]  # distinct bigrams, as in Wikipedia
    items = [article(f"{i:04d}", f"T{i}", " ".join(rng.choices(words, k=1_500))) for i in range(300)]
    backend = EmbeddedBackend.create(index_dir, META)
    backend.add_articles(items)
    backend.close()
    assert (_segments(index_dir) == 1) is one_segment
    assert article_index.writer_threads(len(items), cores=64) == 1  # fewer than DOCS_PER_THREAD articles


def test_a_bulk_run_shares_one_writer_keeps_others_out_and_ends_merged(index_dir: Path, monkeypatch) -> None:
    """In a run of writes the merges go on beside the next writes; the run waits for them at its end."""
    build(index_dir)
    made = []
    real = article_index.ArticleIndex._writer

    def counting(self: article_index.ArticleIndex, documents: int = 0, text_chars: int = 0) -> object:
        made.append(documents)
        return real(self, documents, text_chars)

    monkeypatch.setattr(article_index.ArticleIndex, "_writer", counting)
    monkeypatch.setattr(article_index, "LOCK_TIMEOUT_S", 0.01)
    backend = EmbeddedBackend.open(index_dir)
    other = EmbeddedBackend.open(index_dir)  # another writer: its own lock object, as another process
    try:
        with backend.bulk(write_articles=5, write_chars=1_000):
            for w in range(12):  # a segment each: tantivy merges 8 of a size into one
                backend.add_articles([article(f"{w}-{i}", f"T{w}", f"word{w} text{i}") for i in range(5)])
                assert ids(backend, f"word{w}")[:1] == [f"{w}-0"]  # each write answerable at once
            with pytest.raises(BackendError, match="another process has been writing"):
                other.add_articles([article("x", "X", "other")])
        assert made == [5]
        assert _segments(index_dir) < 12
        other.add_articles([article("x", "X", "other")])  # the run is over: the lock is free
        assert backend.stats().articles == 2 + 60 + 1 and backend._ir.documents() == 63
    finally:
        other.close()
        backend.close()


@pytest.mark.reliability
def test_a_failed_write_in_a_bulk_run_is_taken_out_and_the_run_goes_on(index_dir: Path, monkeypatch) -> None:
    build(index_dir)
    real = ArticleBatch.commit
    fail = [True]

    def commit_then_fail_once(self: ArticleBatch) -> None:
        real(self)
        if fail:
            fail.clear()
            raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(ArticleBatch, "commit", commit_then_fail_once)
    backend = EmbeddedBackend.open(index_dir)
    try:
        with backend.bulk(write_articles=2, write_chars=100):
            with pytest.raises(BackendError, match="database or disk is full"):
                backend.add_articles([article("3", "F", "farrowby")])
            backend.add_articles([article("4", "S", "sorrel")])
        assert not (index_dir / PENDING).exists()
        assert backend._ir.documents() == 3
        assert ids(backend, "farrowby") == [] and ids(backend, "sorrel") == ["4"]
    finally:
        backend.close()


# -- the searcher a reader keeps between questions ----------------------------------------------------
def count_reloads(backend: EmbeddedBackend, monkeypatch) -> list[None]:
    reloads: list[None] = []
    index = backend._ir._index
    real = index.reload
    monkeypatch.setattr(backend._ir, "_index", _Counting(index, lambda: (reloads.append(None), real())))
    return reloads


class _Counting:
    """A tantivy index whose ``reload`` is counted (the binding's objects take no new attributes)."""

    def __init__(self, index: object, reload: object) -> None:
        self._index, self.reload = index, reload

    def __getattr__(self, name: str) -> object:
        return getattr(self._index, name)


def test_the_searcher_is_kept_until_a_write_changes_the_generation(index_dir: Path, monkeypatch) -> None:
    build(index_dir)
    reader = EmbeddedBackend.open(index_dir)
    writer = EmbeddedBackend.open(index_dir)  # another process's writes, as far as the reader knows
    try:
        reloads = count_reloads(reader, monkeypatch)
        assert ids(reader, "quenton") == ["1"] and ids(reader, "river") == ["2"]
        assert len(reloads) == 1  # the second question reused the first one's searcher
        writer.add_articles([article("3", "Farrowby", "farrowby is a village")])
        assert ids(reader, "farrowby village") == ["3"]  # the write is seen by the very next question
        assert len(reloads) == 2
        writer.delete_articles(["3"])
        assert ids(reader, "farrowby village") == [] and len(reloads) == 3
    finally:
        writer.close()
        reader.close()


def test_a_replaced_article_answers_once_by_its_new_text_through_a_kept_searcher(
    index_dir: Path, monkeypatch
) -> None:
    build(index_dir)
    reader = EmbeddedBackend.open(index_dir)
    writer = EmbeddedBackend.open(index_dir)
    real = article_index.ArticleIndex._settle
    settles: list[None] = []

    def first_left_unsettled(self: article_index.ArticleIndex, *args: object) -> None:
        settles.append(None)
        if len(settles) > 1:  # the first write's old documents stay, as when its writer dies
            real(self, *args)

    monkeypatch.setattr(article_index.ArticleIndex, "_settle", first_left_unsettled)
    try:
        assert ids(reader, "quenton town") == ["1"]  # the reader now keeps a searcher holding version 1
        for n, text in enumerate(["quenton is a city by the sea", "quenton is a port"]):
            writer.add_articles([article("1", "Quenton", text), article(f"x{n}", "Other", "quenton harbour")])
            assert ids(reader, "town") == []  # the old text never answers for article 1
            hits = reader.search_articles("quenton", 10)
            assert sorted(h.id for h in hits) == ["1", *(f"x{i}" for i in range(n + 1))]  # each once
            # First beside 1, 2 and x0 the old document of 1 stays; then it is gone and x1 is in.
            assert writer._ir.documents() == 4
        assert ids(reader, "port") == ["1"] and ids(reader, "sea") == []
    finally:
        writer.close()
        reader.close()


def test_a_write_settled_between_the_snapshot_and_the_searcher_answers_once(
    index_dir: Path, monkeypatch
) -> None:
    """A reader's snapshot holds article 1's old version; a write replaces and settles it before the
    reader's searcher is taken: the article is ranked by its new text, once, under its old title."""
    build(index_dir)
    reader = EmbeddedBackend.open(index_dir)
    writer = EmbeddedBackend.open(index_dir)
    real = article_index.ArticleIndex.searcher

    def write_first(self: article_index.ArticleIndex, generation: str | None) -> object:
        if self is reader._ir:
            writer.add_articles([article("1", "Quenton City", "quenton is a city by the sea")])
        return real(self, generation)

    try:
        monkeypatch.setattr(article_index.ArticleIndex, "searcher", write_first)
        hits = reader.search_articles("quenton sea", 3)
        assert [(h.id, h.title) for h in hits] == [("1", "Quenton")]  # the snapshot's title
        assert writer._ir.documents() == 2  # the old version was settled away before the search
        monkeypatch.setattr(article_index.ArticleIndex, "searcher", real)
        assert [(h.id, h.title) for h in reader.search_articles("quenton", 3)] == [("1", "Quenton City")]
    finally:
        writer.close()
        reader.close()


# -- the pruned query (frequent terms optional beside the rare ones) --------------------------------------
def record_pruned_answers(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each pruned query proved its top n (True) or the whole query had to run (False)."""
    answers: list[bool] = []
    real = article_index.ArticleIndex._top

    def recording(self: article_index.ArticleIndex, *args: object) -> tuple[list, bool]:
        ranked, exact = real(self, *args)
        if args[-1] != -math.inf:
            answers.append(exact)
        return ranked, exact

    monkeypatch.setattr(article_index.ArticleIndex, "_top", recording)
    return answers


def test_the_pruned_query_is_used_when_it_proves_the_top_n_and_gives_lucenes_ranking(
    index_dir: Path, monkeypatch
) -> None:
    # Zipfian words, each in most articles, and in every article one of 60 rare words (5 articles each).
    zipf = zipf_corpus(300, seed=3)
    docs = {aid: (title, f"{text} r{int(aid) % 60}") for aid, (title, text) in zipf.items()}
    backend = EmbeddedBackend.create(index_dir, META)
    answers = record_pruned_answers(monkeypatch)
    try:
        backend.add_articles([article(aid, *doc) for aid, doc in docs.items()])
        rng = random.Random(4)
        for _ in range(40):
            words = rng.sample([f"w{i}" for i in range(4)], 2) + rng.sample([f"r{i}" for i in range(60)], 2)
            want = lucene_bm25(docs, " ".join(words))
            ranked = sorted(want, key=lambda aid: (-want[aid], aid))[:5]
            hits = backend.search_articles(" ".join(words), 5)
            assert [h.id for h in hits] == ranked, words
            np.testing.assert_allclose([h.score for h in hits], [want[a] for a in ranked], rtol=2e-6)
        assert any(answers)  # the pruned query answered some questions itself
    finally:
        backend.close()


def test_an_article_holding_only_frequent_terms_still_wins_through_the_whole_query(
    index_dir: Path, monkeypatch
) -> None:
    """The rare term's article scores below what the frequent term alone can reach: the pruned query
    cannot prove its top n, and the whole query finds the articles that lack the rare term."""
    filler = " ".join(f"x{i}" for i in range(300))
    docs = {f"{i:02d}": ("t", filler) for i in range(84)}
    docs |= {f"c{i:02d}": ("t", f"common {filler}") for i in range(14)}  # 15 of 100 with 50: frequent
    docs["50"] = ("t", "common common common common")  # short, only the frequent term: the best
    docs["60"] = ("t", f"rareword {filler * 10}")  # the rare term once, in a very long text
    backend = EmbeddedBackend.create(index_dir, META)
    answers = record_pruned_answers(monkeypatch)
    try:
        backend.add_articles([article(aid, *doc) for aid, doc in docs.items()])
        want = lucene_bm25(docs, "common rareword")
        hits = backend.search_articles("common rareword", 3)
        assert [h.id for h in hits] == sorted(want, key=lambda aid: (-want[aid], aid))[:3]
        assert [h.id for h in hits] == ["50", "c00", "c01"]  # the pruned query alone found only 60
        assert answers == [False]  # the pruned query was tried and could not prove its answer
    finally:
        backend.close()
