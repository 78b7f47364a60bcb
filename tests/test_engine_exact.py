"""Exact kNN on the real engines: OpenSearch's k-NN score script and Elasticsearch's filtered knn on flat
vectors give the embedded backend's neighbours, distances and tie order (``cluster_config``: both engines)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bertknn_search.backends.blocks import exact_knn
from bertknn_search.backends.embedded.backend import EmbeddedBackend
from bertknn_search.backends.engines.backend import EngineBackend
from bertknn_search.config import Config
from bertknn_search.records import Article, ContextBlock, EncodedArticle, IndexMeta

META = IndexMeta("tiny-bert", 4, 8, 100, "single-wordpiece")


def article(aid: str, title: str, text: str, vectors: list[list[float]], fingerprint: str) -> EncodedArticle:
    n = len(vectors)
    ints = np.arange(n, dtype=np.int32)
    block = ContextBlock(
        sentences=[f"{title} one.", f"{title} two."],
        vectors=np.array(vectors, dtype=np.float16).reshape(n, 8),
        token_ids=ints + 100 * int(aid),
        sentence_ids=ints % 2,
        starts=ints * 4,
        ends=ints * 4 + 3,
    )
    return EncodedArticle(Article(aid, title, text), block, fingerprint)


def unit(i: int, scale: float = 1.0) -> list[float]:
    v = [0.0] * 8
    v[i] = scale
    return v


ARTICLES = [
    # Contexts at known points: from the origin, squared distances are 1, 4, 0.25 ... and two exact ties
    # ("1" row 2 and "3" row 0 are the same point) that must come out in article-id order.
    article(
        "1",
        "Zorbland",
        "Zorbland is a country. Its capital is Quimby.",
        [unit(0), unit(1, 2), unit(2, 3)],
        "a1",
    ),
    article(
        "2",
        "Quimby",
        "Quimby is the capital of Zorbland. Quimby has a harbour.",
        [unit(3, 0.5), unit(4, 1.5)],
        "a2",
    ),
    article("3", "Flarn River", "The Flarn River flows through Zorbland.", [unit(2, 3), [0.1] * 8], "a3"),
]


@pytest.fixture
def backend(cluster_config: Config) -> Iterator[EngineBackend]:
    made = EngineBackend.create(cluster_config, META)
    made.add_articles(ARTICLES)
    yield made
    made.close()


def reference(query: np.ndarray, k: int, items: list[EncodedArticle]):
    """The embedded backend's exact kNN over the same float16 vectors."""
    blocks = [
        (
            item.article.id,
            {
                "vectors": item.contexts.vectors.astype(np.float32),
                "token_ids": item.contexts.token_ids,
                "sentence_ids": item.contexts.sentence_ids,
                "starts": item.contexts.starts,
                "ends": item.contexts.ends,
            },
        )
        for item in sorted(items, key=lambda i: i.article.id)
    ]
    return exact_knn(query, k, blocks)


# k 6 cuts the tie at 9 ("1" row 2 and "3" row 0): the engine's sort keeps the lower article id.
@pytest.mark.parametrize("k", [1, 3, 6, 7, 20])
def test_knn_is_exact(backend: EngineBackend, k: int) -> None:
    query = np.zeros(8, dtype=np.float32)
    got = backend.knn(query, k, ["1", "2", "3"])
    want = reference(query, k, ARTICLES)
    np.testing.assert_allclose(got.distances, want.distances, rtol=1e-5, atol=1e-6)
    assert got.article_ids == want.article_ids
    assert got.token_ids.tolist() == want.token_ids.tolist()
    assert got.sentence_ids.tolist() == want.sentence_ids.tolist()


def test_knn_distances_are_squared_l2(backend: EngineBackend) -> None:
    query = np.array(unit(0, 1.0), dtype=np.float32)
    got = backend.knn(query, 3, ["1"])
    # From (1, 0, ...): itself 0, then (0, 2, 0, ...) at 1 + 4 = 5, (0, 0, 3, ...) at 1 + 9 = 10.
    np.testing.assert_allclose(got.distances, [0.0, 5.0, 10.0], rtol=1e-5, atol=1e-6)
    assert got.token_ids.tolist() == [100, 101, 102]


def test_knn_only_sees_the_given_articles(backend: EngineBackend) -> None:
    got = backend.knn(np.zeros(8, dtype=np.float32), 10, ["2"])
    assert got.article_ids == ["2", "2"]
    np.testing.assert_allclose(got.distances, [0.25, 2.25], rtol=1e-5)


def test_replaced_article_shows_only_its_new_contexts(backend: EngineBackend) -> None:
    backend.add_articles([article("2", "Quimby", "Quimby, rebuilt.", [unit(5, 0.1)], "b2")])
    got = backend.knn(np.zeros(8, dtype=np.float32), 10, ["2"])
    assert got.token_ids.tolist() == [200]
    np.testing.assert_allclose(got.distances, [0.01], rtol=1e-3)


def test_knn_without_ir_finds_the_nearest(backend: EngineBackend) -> None:
    got = backend.knn(np.array(unit(4, 1.5), dtype=np.float32), 2)
    assert got.article_ids[0] == "2"
    assert got.token_ids[0] == 201
    assert got.distances[0] == pytest.approx(0.0, abs=1e-6)


def test_search_articles_ranks_like_the_embedded_backend(backend: EngineBackend, tmp_path: Path) -> None:
    embedded = EmbeddedBackend.create(tmp_path / "index", META)
    embedded.add_articles(ARTICLES)
    for query in ["Quimby harbour", "Which river flows through Zorbland?", "capital of Zorbland"]:
        got, want = backend.search_articles(query, 3), embedded.search_articles(query, 3)
        assert [h.id for h in got] == [h.id for h in want], query
        # OpenSearch 3.x scores as Lucene does; 2.x multiplies every score by k1 + 1 = 2.2.
        ratios = {round(g.score / w.score, 3) for g, w in zip(got, want)}
        assert ratios <= {1.0} or ratios <= {2.2}, query
    embedded.close()
    assert backend.search_articles("Quimby harbour", 3)[0].id == "2"


def test_stats_and_reads(backend: EngineBackend) -> None:
    stats = backend.stats()
    assert (stats.articles, stats.sentences, stats.contexts) == (3, 6, 7)
    assert [hit.id for hit in backend.find_titles("quimby", 3)] == ["2"]
    assert backend.sentences([("3", 1)]) == ["Flarn River two."]


@pytest.mark.parametrize("tied", [2, 9])
def test_search_articles_orders_tied_scores_by_id_like_embedded(
    cluster_config: Config, tmp_path: Path, tied: int
) -> None:
    """Articles of one text score alike; written in reverse id order, the engine's own order of ties (its
    doc order) is the opposite of the id order both backends promise."""
    text = "Glimmerfen borders Ostrava."
    items = [article(str(10 + i), "Twin", text, [unit(0)], f"t{i}") for i in range(tied)]
    items.append(article("99", "Other", "Glimmerfen is a marsh.", [unit(1)], "o"))
    engine = EngineBackend.create(cluster_config, META)
    embedded = EmbeddedBackend.create(tmp_path / "index", META)
    try:
        engine.add_articles(list(reversed(items)))
        embedded.add_articles(items)
        for n in (1, 3):
            got = engine.search_articles("Glimmerfen borders Ostrava", n)
            want = embedded.search_articles("Glimmerfen borders Ostrava", n)
            assert [h.id for h in got] == [h.id for h in want] == sorted(h.id for h in want)
    finally:
        engine.close()
        embedded.close()
