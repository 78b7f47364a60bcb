"""The shared IR terms: one term per word whatever its accents, and what a query searches for."""

from __future__ import annotations

from pathlib import Path

from bertknn_search.backends.embedded import EmbeddedBackend
from bertknn_search.terms import query_terms, tokenize
from tests.test_embedded import META, encoded


def test_accented_words_stay_whole_and_fold() -> None:
    assert tokenize("Kurt Gödel was born in Zürich, naïve café") == [
        "kurt", "godel", "was", "born", "in", "zurich", "naive", "cafe",
    ]  # fmt: skip
    assert tokenize("ZÜRICH") == tokenize("Zurich") == tokenize("Zu\u0308rich") == ["zurich"]
    assert tokenize("Ærøskøbing 1984") == ["ærøskøbing", "1984"]  # letters without a decomposition stay


def test_query_terms_drop_stopword_ngrams() -> None:
    assert query_terms("Where was Kurt Gödel born") == (
        ["kurt", "godel", "born"],
        ["kurt_godel", "godel_born"],
    )


def test_an_accented_title_is_found_by_its_own_words(tmp_path: Path) -> None:
    backend = EmbeddedBackend.create(tmp_path / "index", META)
    try:
        backend.add_articles(
            [
                encoded("10", "Zürich", "Zürich is a city.", [[1, 0, 0, 0]], [5]),
                encoded("11", "Rich", "Rich is a name.", [[0, 1, 0, 0]], [6]),
            ]
        )
        assert [h.id for h in backend.search_articles("Zürich banks", 3)] == ["10"]
        assert [h.id for h in backend.search_articles("Zurich", 3)] == ["10"]
        assert [h.id for h in backend.search_articles("Rich", 3)] == ["11"]
    finally:
        backend.close()
