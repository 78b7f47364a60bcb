"""The shared IR terms: one term per word whatever its accents, and what a query searches for."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from bertknn_search.backends.embedded.backend import EmbeddedBackend
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


def reference_tokenize(text: str) -> list[str]:
    """The definition: NFD of the whole text, combining marks dropped, lowercased, letter/digit runs."""
    folded = "".join(c for c in unicodedata.normalize("NFD", text) if not unicodedata.combining(c))
    return re.findall(r"[^\W_]+", folded.lower())


@given(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=60)
    | st.text("aeZü\u0301\u0308İ ß-Ǆ1_", max_size=30)
)
@settings(max_examples=500, deadline=None)
def test_folding_only_non_ascii_runs_equals_folding_everything(text: str) -> None:
    assert tokenize(text) == reference_tokenize(text)
