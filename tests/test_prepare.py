"""Prepare stage: worker processes give exactly the rows the in-process path gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bertknn_search.config import Config
from bertknn_search.encoder import Encoder
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.prepare import RowMaker
from bertknn_search.records import Question
from bertknn_search.search import Searcher

TEXTS = [
    "Zorblat was born in Quenton. Zorblat worked as a painter.",
    "",
    "Mirvane was born in Farrowby.",
    "Many people in Quenton knew Zorblat as a famous painter. " * 6,
    "The town of Farrowby is in the north. It has a river.",
]


@pytest.fixture(scope="module")
def encoder(tiny_model: Path) -> Encoder:
    return Encoder(str(tiny_model), layer=11, device="cpu", max_length=64)


def test_workers_give_the_same_rows_in_the_same_order(encoder: Encoder) -> None:
    with RowMaker(encoder, "single-wordpiece", workers=0) as here:
        expected = here(TEXTS)
    with RowMaker(encoder, "single-wordpiece", workers=3) as spread:
        got = spread(TEXTS)
        assert spread(TEXTS[:1]) == here(TEXTS[:1])  # one article: no need for the pool
    assert got == expected
    assert {row.article for row in got[1]} == {0, 2, 3, 4}  # indices are the chunk's, not the worker's


def test_ingest_with_workers_builds_the_same_index(built_index: Config, corpus: Path, tmp_path: Path) -> None:
    config = built_index.replace(index=tmp_path / "index", workers=2)
    summary = ingest(corpus, config, progress=False)
    with_workers, without = Searcher.open(config), Searcher.open(built_index)
    try:
        assert with_workers.backend.stats().contexts == without.backend.stats().contexts == summary.contexts
        states, _ = without.encode([Question("Zorblat was born in [MASK].")])
        for article_id in ("100", "105"):
            a, b = (s.backend.knn(states[0], 8, [article_id]) for s in (with_workers, without))
            assert len(a) == 8 and a.token_ids.tolist() == b.token_ids.tolist()
            np.testing.assert_array_equal(a.distances, b.distances)
    finally:
        with_workers.close()
        without.close()
