"""EmbeddedBackend: durability, replace-not-duplicate, BM25 ranking, exact filtered kNN."""

from __future__ import annotations

import math
import sqlite3
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from bertknn_search.backends.blocks import exact_knn
from bertknn_search.backends.embedded import text_codec
from bertknn_search.backends.embedded.backend import EmbeddedBackend
from bertknn_search.backends.embedded.schema import READABLE_VERSIONS
from bertknn_search.backends.embedded.text_codec import TextCodec
from bertknn_search.errors import BackendError, IndexCorruptError, IndexMismatchError, IndexNotFoundError
from bertknn_search.records import Article, ContextBlock, EncodedArticle, IndexMeta

DIM = 4
META = IndexMeta(model="m", layer=11, dim=DIM, vocab_size=50, mask_policy="single-wordpiece")


def encoded(aid: str, title: str, text: str, vectors: list[list[float]], tokens: list[int], fp: str = "f1"):
    n = len(tokens)
    block = ContextBlock(
        sentences=[text],
        vectors=np.array(vectors, dtype=np.float16).reshape(n, DIM),
        token_ids=np.array(tokens, dtype=np.int32),
        sentence_ids=np.zeros(n, np.int32),
        starts=np.arange(n, dtype=np.int32),
        ends=np.arange(n, dtype=np.int32) + 1,
    )
    return EncodedArticle(Article(aid, title, text), block, fp)


@pytest.fixture
def backend(tmp_path: Path) -> EmbeddedBackend:
    b = EmbeddedBackend.create(tmp_path / "idx", META)
    b.add_articles(
        [
            encoded("1", "Zorblat", "zorblat was born in quenton", [[0, 0, 0, 0], [1, 0, 0, 0]], [10, 11]),
            encoded("2", "Quenton", "quenton is a town on the river", [[0, 1, 0, 0]], [12]),
            encoded(
                "3",
                "River",
                "the river runs past quenton and farrowby",
                [[0, 0, 1, 0], [0, 0, 0, 3]],
                [13, 14],
            ),
        ]
    )
    yield b
    b.close()


def test_open_checks_presence_and_readability(tmp_path: Path, backend: EmbeddedBackend) -> None:
    with pytest.raises(IndexNotFoundError, match="no index at"):
        EmbeddedBackend.open(tmp_path / "missing")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "index.sqlite").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(IndexCorruptError, match="cannot be read"):
        EmbeddedBackend.open(tmp_path / "junk")
    (tmp_path / "plain").mkdir()
    # An empty directory (one an interrupted creation may leave) holds no index yet: ingest may fill it.
    with pytest.raises(IndexNotFoundError, match="no index at"):
        EmbeddedBackend.open(tmp_path / "plain")
    (tmp_path / "plain" / "notes.txt").write_text("mine")
    with pytest.raises(IndexCorruptError, match="not a bertknn-search index"):
        EmbeddedBackend.open(tmp_path / "plain")
    assert EmbeddedBackend.open(tmp_path / "idx").meta() == META


def test_an_index_of_another_schema_version_asks_for_a_rebuild(
    tmp_path: Path, backend: EmbeddedBackend
) -> None:
    backend.close()
    with sqlite3.connect(tmp_path / "idx" / "index.sqlite") as conn:
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    wanted = f"schema version '1', this version of bertknn-search reads {' and '.join(READABLE_VERSIONS)}"
    with pytest.raises(IndexCorruptError, match=wanted):
        EmbeddedBackend.open(tmp_path / "idx")


def test_create_on_existing_index_checks_meta(tmp_path: Path, backend: EmbeddedBackend) -> None:
    other = IndexMeta(model="other", layer=11, dim=DIM, vocab_size=50, mask_policy="single-wordpiece")
    with pytest.raises(IndexMismatchError, match="model='m', not 'other'"):
        EmbeddedBackend.create(tmp_path / "idx", other)


def test_stats(backend: EmbeddedBackend) -> None:
    s = backend.stats()
    assert (s.articles, s.sentences, s.contexts) == (3, 3, 5)
    assert s.bytes_on_disk > 0 and s.meta == META


def test_readding_replaces_instead_of_duplicating(backend: EmbeddedBackend) -> None:
    backend.add_articles(
        [encoded("2", "Quenton", "quenton is a city by the sea", [[5, 5, 5, 5]] * 3, [1, 2, 3], "f2")]
    )
    backend.add_articles(
        [encoded("2", "Quenton", "quenton is a city by the sea", [[5, 5, 5, 5]] * 3, [1, 2, 3], "f2")]
    )
    s = backend.stats()
    assert (s.articles, s.contexts) == (3, 7)
    assert backend.fingerprints(["1", "2", "9"]) == {"1": "f1", "2": "f2"}
    assert [h.id for h in backend.search_articles("sea", 3)] == ["2"]
    assert backend.search_articles("town", 3) == []


def test_find_title_is_case_insensitive(backend: EmbeddedBackend) -> None:
    assert [(hit.id, hit.title) for hit in backend.find_titles("  zorBLAT ", 3)] == [("1", "Zorblat")]
    assert backend.find_titles("Farrowby", 3) == []


def test_search_ranks_by_lucene_bm25_with_bigrams(backend: EmbeddedBackend) -> None:
    hits = backend.search_articles("Who was born in Quenton?", 3)
    # Doc lengths include the title line: 6, 8 and 8 tokens.
    lengths = {"1": 6, "2": 8, "3": 8}
    avg = sum(lengths.values()) / 3
    bi_lengths = {k: v - 1 for k, v in lengths.items()}
    bi_avg = sum(bi_lengths.values()) / 3

    def s(tf: int, dl: int, avgdl: float, df: int) -> float:
        # Lucene's BM25 with OpenSearch's (k1 + 1) factor; lengths below 24 are stored exactly.
        idf = math.log(1 + (3 - df + 0.5) / (df + 0.5))
        return 2.2 * idf * tf / (tf + 1.2 * (0.25 + 0.75 * dl / avgdl))

    want = {
        # quenton: in all 3 (article 2 twice: title + text); born: only 1; every bigram has a stopword.
        "1": s(1, 6, avg, 3) + s(1, 6, avg, 1),
        "2": s(2, 8, avg, 3),
        "3": s(1, 8, avg, 3),
    }
    assert [h.id for h in hits] == sorted(want, key=lambda k: -want[k])
    for h in hits:
        assert h.score == pytest.approx(want[h.id], rel=1e-6)
    # "river runs": two unigrams and the bigram river_runs, found only in article 3.
    (hit,) = backend.search_articles("river runs", 1)
    # river: in 2 (2 times in "River\nthe river runs...") and 3; runs and river_runs only in 3.
    assert hit.id == "3"
    assert hit.score == pytest.approx(s(2, 8, avg, 2) + s(1, 8, avg, 1) + s(1, 7, bi_avg, 1), rel=1e-6)


def test_search_ties_break_by_id_and_stopwords_are_ignored(backend: EmbeddedBackend) -> None:
    assert backend.search_articles("the and of", 3) == []
    hits = backend.search_articles("farrowby zorblat", 3)
    assert {h.id for h in hits} == {"1", "3"}


def test_knn_is_exact_and_restricted_to_the_articles(backend: EmbeddedBackend) -> None:
    q = np.array([0.9, 0.1, 0, 0], dtype=np.float32)
    nb = backend.knn(q, 10, ["1", "2"])
    assert nb.article_ids == ["1", "1", "2"]
    assert nb.token_ids.tolist() == [11, 10, 12]
    stored = {"1": [[0, 0, 0, 0], [1, 0, 0, 0]], "2": [[0, 1, 0, 0]]}
    brute = sorted(
        (float(((np.array(v, np.float32) - q) ** 2).sum()), a) for a, vs in stored.items() for v in vs
    )
    np.testing.assert_allclose(nb.distances, [d for d, _ in brute], rtol=1e-6)
    assert len(backend.knn(q, 2, ["1", "2", "3"])) == 2
    assert len(backend.knn(q, 10, ["404"])) == 0


def test_no_ir_mode_searches_every_context(backend: EmbeddedBackend) -> None:
    q = np.array([0, 0, 0, 2.9], dtype=np.float32)
    nb = backend.knn(q, 2, None)
    assert nb.article_ids[0] == "3" and nb.token_ids[0] == 14
    assert nb.distances[0] == pytest.approx(0.01, abs=1e-3)
    # The flat index follows adds.
    backend.add_articles([encoded("4", "New", "new", [[0, 0, 0, 2.9]], [20])])
    assert backend.knn(q, 1, None).token_ids.tolist() == [20]


def test_exact_knn_breaks_ties_by_article_sentence_position() -> None:
    v = np.ones((3, DIM), np.float16)

    def block(tokens: list[int]) -> dict[str, np.ndarray]:
        n = len(tokens)
        return {
            "vectors": v[:n],
            "token_ids": np.array(tokens, np.int32),
            "sentence_ids": np.array([1, 0, 0][:n], np.int32),
            "starts": np.array([0, 5, 2][:n], np.int32),
            "ends": np.zeros(n, np.int32),
        }

    nb = exact_knn(np.zeros(DIM, np.float32), 4, [("a", block([1, 2, 3])), ("b", block([4]))])
    assert nb.token_ids.tolist() == [3, 2, 1, 4]


def test_sentences_and_titles(backend: EmbeddedBackend) -> None:
    assert backend.sentences([("2", 0), ("1", 0), ("1", 5), ("9", 0)]) == [
        "quenton is a town on the river",
        "zorblat was born in quenton",
        "",
        "",
    ]
    assert backend.titles(["3", "1"]) == {"3": "River", "1": "Zorblat"}


def test_wrong_dimension_is_rejected_and_nothing_written(backend: EmbeddedBackend) -> None:
    good = encoded("5", "Five", "five", [[1, 1, 1, 1]], [1])
    bad = EncodedArticle(
        Article("6", "Six", "six"),
        ContextBlock(["six"], np.zeros((1, 3), np.float16), *(np.zeros(1, np.int32) for _ in range(4))),
        "f",
    )
    with pytest.raises(IndexMismatchError, match="dimension is 4"):
        backend.add_articles([good, bad])
    assert backend.fingerprints(["5", "6"]) == {}


# --- creating and opening the file ----------------------------------------------------------------------


def test_a_creation_never_replaces_an_index_another_process_created_first(tmp_path: Path) -> None:
    from bertknn_search.backends.embedded import schema as embedded
    from bertknn_search.backends.embedded import sqlite_file

    first = EmbeddedBackend.create(tmp_path / "idx", META)
    first.add_articles([encoded("1", "One", "one", [[0, 0, 0, 0]], [10])])
    first.close()
    # A second creator that found no file a moment ago publishes its own: the first one's stays.
    values = {"schema_version": embedded.SCHEMA_VERSION, "model": "other"}
    sqlite_file.publish(tmp_path / "idx" / "index.sqlite", embedded.SCHEMA, values)
    again = EmbeddedBackend.open(tmp_path / "idx")
    assert again.meta() == META and again.fingerprints(["1"]) == {"1": "f1"}
    again.close()
    assert not [p for p in (tmp_path / "idx").iterdir() if p.name.startswith(sqlite_file.BUILD_PREFIX)]


def test_files_of_killed_creations_are_removed_by_the_next_create(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from bertknn_search.backends.embedded.sqlite_file import BUILD_PREFIX

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    index = tmp_path / "idx"
    index.mkdir()
    dead = index / f"{BUILD_PREFIX}{int(gone.stdout)}-0a1b2c3d"
    live = index / f"{BUILD_PREFIX}{os.getpid()}-0a1b2c3d"  # a creation still running: left alone
    dead.write_bytes(b"half")
    live.write_bytes(b"half")
    with pytest.raises(IndexNotFoundError, match="no index at"):
        EmbeddedBackend.open(index)
    EmbeddedBackend.create(index, META).close()
    assert not dead.exists() and live.exists()


class _NoSharedMemory:
    """A connection opened with mode=ro where SQLite cannot create ``-shm``: its first read fails."""

    def execute(self, *args: object) -> None:
        raise sqlite3.OperationalError("unable to open database file")

    def close(self) -> None:
        pass


def _no_shared_memory(monkeypatch: pytest.MonkeyPatch, read_only_volume: bool, why: str) -> None:
    """Simulate a place where SQLite cannot create ``-shm``: a read-only open fails, immutable works.

    (Tests run as root here, where permissions do not stop writes; the real read-only mount is in
    test_reliability.)
    """
    from bertknn_search.backends.embedded import sqlite_file

    real = sqlite_file._sqlite

    def sqlite(target: str, uri: bool = False) -> sqlite3.Connection | _NoSharedMemory:
        if uri and "mode=ro" in target and "immutable=1" not in target:
            return _NoSharedMemory()
        return real(target, uri)

    monkeypatch.setattr(sqlite_file, "_sqlite", sqlite)
    monkeypatch.setattr(sqlite_file, "_read_only_volume", lambda directory: read_only_volume)
    monkeypatch.setattr(sqlite_file, "_why_read_only", lambda db: why)


def test_a_read_only_volume_is_read_as_immutable(
    tmp_path: Path, backend: EmbeddedBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = np.array([0.9, 0.1, 0, 0], dtype=np.float32)
    want = backend.knn(q, 10, ["1", "2"])
    backend.close()
    _no_shared_memory(monkeypatch, read_only_volume=True, why="a read-only volume")
    ro = EmbeddedBackend.open(tmp_path / "idx")
    try:
        assert ro.meta() == META
        assert ro.knn(q, 10, ["1", "2"]).token_ids.tolist() == want.token_ids.tolist()
        assert ro.stats().articles == 3
        with pytest.raises(BackendError, match=r"is read-only here \(a read-only volume\)"):
            ro.add_articles([encoded("5", "Five", "five", [[1, 1, 1, 1]], [1])])
    finally:
        ro.close()
    with pytest.raises(BackendError, match="read-only here"):
        EmbeddedBackend.create(tmp_path / "idx", META)


def test_a_directory_this_user_cannot_write_is_not_called_corrupt(
    tmp_path: Path, backend: EmbeddedBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.close()
    _no_shared_memory(monkeypatch, read_only_volume=False, why="no write permission")
    with pytest.raises(BackendError) as err:
        EmbeddedBackend.open(tmp_path / "idx")
    where = tmp_path / "idx"
    assert str(err.value) == (
        f"cannot open the index at {where} read-only (unable to open database file): SQLite must create"
        f" index.sqlite-shm beside it and this user cannot write {where}; give it write access there, or"
        " serve the index from a read-only mount"
    )


def test_damaged_rows_name_the_article(tmp_path: Path, backend: EmbeddedBackend) -> None:
    with sqlite3.connect(tmp_path / "idx" / "index.sqlite") as conn:
        conn.execute("UPDATE contexts SET sentences = '{\"a\": 1}' WHERE article = 2")
        conn.execute("UPDATE contexts SET ends = x'00000000' WHERE article = 3")
    with pytest.raises(
        IndexCorruptError, match="sentences of article '2' are damaged \\(not a list of strings"
    ):
        backend.sentences([("2", 0)])
    with pytest.raises(IndexCorruptError, match=r"contexts of article '3' are damaged .*differ in length"):
        backend.knn(np.zeros(DIM, np.float32), 3, ["3"])
    assert backend.knn(np.zeros(DIM, np.float32), 3, ["1"]).article_ids == ["1", "1"]


# --- the text store: compressed rows, and indexes of schema version 4 --------------------------------------
LAZY = IndexMeta(model="m", layer=11, dim=DIM, vocab_size=50, mask_policy="single-wordpiece", contexts="lazy")


def wordy(i: int) -> str:
    """An article's text: long enough to compress, non-ASCII, and different for each ``i``."""
    return f"Zorblat {i} was born in Quenton, Zürich or 東京; he wrote {i * 7} poems about the river. " * 8


def text_only(aid: str, text: str) -> EncodedArticle:
    return EncodedArticle(Article(aid, f"Title {aid}", text), None, f"fp{aid}")


def stored_types(index: Path) -> dict[str, str]:
    with sqlite3.connect(index / "index.sqlite") as conn:
        sql = "SELECT a.id, typeof(t.text) FROM texts t JOIN articles a ON a.rowid = t.article"
        return dict(conn.execute(sql).fetchall())


def schema_version(index: Path) -> str:
    with sqlite3.connect(index / "index.sqlite") as conn:
        return conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]


def test_texts_are_stored_compressed_with_a_dictionary_and_read_back(tmp_path: Path) -> None:
    texts = {str(i): wordy(i) for i in range(text_codec.TRAIN_MIN_ARTICLES)} | {"empty": "", "short": "ab"}
    with closing(EmbeddedBackend.create(tmp_path / "idx", LAZY)) as b:
        b.add_articles([text_only(aid, text) for aid, text in texts.items()])
    raw = sum(len(t.encode("utf-8")) for t in texts.values())
    with sqlite3.connect(tmp_path / "idx" / "index.sqlite") as conn:
        stored = conn.execute("SELECT SUM(length(CAST(text AS BLOB))) FROM texts").fetchone()[0]
        assert conn.execute("SELECT typeof(value) FROM meta WHERE key = 'text_dictionary'").fetchone() == (
            "blob",
        )
    assert stored < raw / 5
    types = stored_types(tmp_path / "idx")
    assert types.pop("empty") == types.pop("short") == "text"  # zstd would make them larger
    assert set(types.values()) == {"blob"}
    with closing(
        EmbeddedBackend.open(tmp_path / "idx")
    ) as b:  # a new process: the dictionary comes from the file
        got = {p.article.id: p.article.text for p in b.unencoded(list(texts))}
    assert got == texts


def make_version_4(index: Path) -> None:
    """Rewrite an index's rows as version 4 wrote them: plain TEXT, no dictionary, schema version 4."""
    with sqlite3.connect(index / "index.sqlite") as conn:
        held = conn.execute("SELECT value FROM meta WHERE key = 'text_dictionary'").fetchone()
        codec = TextCodec(None if held is None else held[0])
        for table, column in (("texts", "text"), ("contexts", "sentences")):
            rows = conn.execute(f"SELECT article, {column} FROM {table}").fetchall()
            for rowid, value in rows:
                conn.execute(
                    f"UPDATE {table} SET {column} = ? WHERE article = ?", (codec.unpack(value), rowid)
                )
        conn.execute("DELETE FROM meta WHERE key = 'text_dictionary'")
        conn.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")


def test_an_index_of_version_4_opens_answers_and_takes_new_articles(tmp_path: Path) -> None:
    index = tmp_path / "idx"
    old = {str(i): wordy(i) for i in range(3)}
    with closing(EmbeddedBackend.create(index, LAZY)) as b:
        b.add_articles([text_only(aid, text) for aid, text in old.items()])
        b.put_contexts([encoded("1", "Title 1", wordy(1), [[0, 0, 0, 1]], [10], fp="fp1")])
    make_version_4(index)
    assert set(stored_types(index).values()) == {"text"} and schema_version(index) == "4"

    with closing(EmbeddedBackend.open(index)) as b:
        assert {p.article.id: p.article.text for p in b.unencoded(list(old))} == {
            "0": old["0"],
            "2": old["2"],
        }
        assert b.sentences([("1", 0)]) == [wordy(1)]
        assert [h.id for h in b.search_articles("zorblat 2 quenton", 1)] == ["2"]
        new = {str(i): wordy(i) for i in range(3, 3 + text_codec.TRAIN_MIN_ARTICLES)}
        b.add_articles([text_only(aid, text) for aid, text in new.items()])
        b.add_articles([text_only("0", wordy(100))])  # an old row replaced: stored the new way
    types = stored_types(index)
    assert types["2"] == "text" and types["0"] == types["3"] == "blob"
    assert schema_version(index) == "5"  # what it now holds needs this version to read
    with closing(EmbeddedBackend.open(index)) as b:
        got = {p.article.id: p.article.text for p in b.unencoded([*old, *new])}
        assert got == {**new, "0": wordy(100), "2": old["2"]}
        assert b.sentences([("1", 0)]) == [wordy(1)]


def test_a_write_that_fails_after_training_the_dictionary_leaves_texts_others_can_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dictionary trained in a write that rolls back was never stored: later texts must not use it."""
    index = tmp_path / "idx"
    first = {str(i): wordy(i) for i in range(text_codec.TRAIN_MIN_ARTICLES + 10)}
    with closing(EmbeddedBackend.create(index, LAZY)) as b:
        real = b._write_one

        def failing(cur: sqlite3.Cursor, item: EncodedArticle, version: int) -> bool:
            if item.article.id == "5":
                raise OSError("disk full (simulated)")
            return real(cur, item, version)

        monkeypatch.setattr(b, "_write_one", failing)
        with pytest.raises(OSError):
            b.add_articles([text_only(aid, text) for aid, text in first.items()])
        monkeypatch.setattr(b, "_write_one", real)
        b.add_articles([text_only("late", wordy(900))])  # the same process goes on writing
    with closing(EmbeddedBackend.open(index)) as b:  # another process reads what was stored
        assert [p.article.text for p in b.unencoded(["late"])] == [wordy(900)]
        assert b.unencoded(list(first)) == []  # the failed write stored nothing


def test_deleting_from_a_version_4_index_leaves_it_version_4(tmp_path: Path) -> None:
    """A delete or an eviction stores nothing in the new form: the release that made it can still read it."""
    index = tmp_path / "idx"
    with closing(EmbeddedBackend.create(index, LAZY)) as b:
        b.add_articles([text_only(str(i), wordy(i)) for i in range(3)])
    make_version_4(index)
    with closing(EmbeddedBackend.open(index)) as b:
        assert b.delete_articles(["1"]) == 1
        b.evict_contexts(0, [])
    assert schema_version(index) == "4"


def test_a_damaged_compressed_text_names_the_article(tmp_path: Path) -> None:
    index = tmp_path / "idx"
    with closing(EmbeddedBackend.create(index, LAZY)) as b:
        b.add_articles([text_only("1", wordy(1)), text_only("2", wordy(2))])
    with sqlite3.connect(index / "index.sqlite") as conn:
        conn.execute("UPDATE texts SET text = substr(text, 1, 20) WHERE article = 2")
    with closing(EmbeddedBackend.open(index)) as b:
        assert [p.article.text for p in b.unencoded(["1"])] == [wordy(1)]
        with pytest.raises(
            IndexCorruptError, match="the stored text of article '2' is damaged \\(not a zstd"
        ):
            b.unencoded(["2"])
