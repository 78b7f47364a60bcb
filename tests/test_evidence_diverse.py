"""Evidence by information gain: a sentence repeated across articles is shown once, then new ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertknn_search.config import Config
from bertknn_search.demo import build_tiny_model, vocabulary
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.query.evidence import diverse_order
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question

SAME = "Ostrel Vanmark was born in Quillon."
OTHER = "Ostrel Vanmark grew up in Quillon near the river."
QUESTION = Question("Ostrel Vanmark was born in [MASK].")  # a free question: BM25 picks the top 3


@pytest.fixture(scope="module")
def ostrel_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The issue's case: four articles holding one sentence, and the subject's own adding another."""
    root = tmp_path_factory.mktemp("ostrel")
    words = ["ostrel", "vanmark", "quillon", "grew", "up", "near", "river"]
    model = build_tiny_model(root / "model", words=vocabulary() + words)
    articles = [{"id": str(i), "title": f"Copy {i}", "text": SAME} for i in range(1, 5)]
    articles.append({"id": "5", "title": "Ostrel Vanmark", "text": f"{SAME} {OTHER}"})
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(a) + "\n" for a in articles), encoding="utf-8")
    return model, corpus


def _evidence(config: Config, mode: str) -> list[tuple[str, str]]:
    searcher = Searcher.open(config.replace(evidence=mode))
    try:
        answer = searcher.answer(QUESTION)
    finally:
        searcher.close()
    assert answer.bert_knn[0].word == "quillon"
    assert "Ostrel Vanmark" in [a.title for a in answer.articles]
    return [(s.title, s.sentence) for s in answer.evidence[0].sentences]


@pytest.fixture
def embedded(ostrel_corpus: tuple[Path, Path], base_config: Config, tmp_path: Path) -> Config:
    model, corpus = ostrel_corpus
    config = base_config.replace(model=str(model), index=tmp_path / "idx")
    ingest(corpus, config, progress=False)
    return config


def test_nearest_evidence_repeats_the_copies(embedded: Config) -> None:
    # What the issue saw: the same sentence three times (two copies and the own article; BM25's top 3
    # are Copy 1, Copy 2 and the own article).
    assert _evidence(embedded, "nearest") == [("Copy 1", SAME), ("Copy 2", SAME), ("Ostrel Vanmark", SAME)]


def test_diverse_evidence_shows_the_repeat_once_then_the_distinct_sentence(embedded: Config) -> None:
    assert _evidence(embedded, "diverse") == [("Copy 1", SAME), ("Ostrel Vanmark", OTHER)]
    assert Config().evidence == "diverse"


def test_diverse_evidence_on_an_engine(ostrel_corpus: tuple[Path, Path], cluster_config: Config) -> None:
    # The engines keep vectors out of _source: the evidence step encodes the candidates' sentences again.
    # All five articles are searched, so that the answer does not hang on how BM25 ranks the copies.
    model, corpus = ostrel_corpus
    config = cluster_config.replace(model=str(model), n_articles=5)
    ingest(corpus, config, progress=False)
    assert _evidence(config, "nearest") == [("Copy 1", SAME), ("Copy 2", SAME), ("Copy 3", SAME)]
    assert _evidence(config, "diverse") == [("Copy 1", SAME), ("Ostrel Vanmark", OTHER)]


def test_information_gain_trades_relevance_against_redundancy() -> None:
    vectors = np.array([[1.0, 0.0], [1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    # Relevance as kNN logits: the copy (row 1) is as near as the first, yet has no gain at all.
    assert diverse_order(np.array([0.0, 0.0, -0.1, -5.0]), vectors, 3) == [0, 2, 3]
    # A far but new context loses to a near and fairly new one, and copies are never shown twice.
    assert diverse_order(np.array([0.0, 0.0, -0.1, -50.0]), vectors, 4) == [0, 2, 3]
    assert diverse_order(np.zeros(0), np.zeros((0, 2)), 3) == []
