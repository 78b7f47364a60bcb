"""``evidence_for`` says a special token ([MASK], [CLS], ...) can never be an answer (issue 42): the
rankings leave them out, so evidence for one is "not answerable", not zero votes of an answerable word."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question

SPECIAL = ("[MASK]", "[CLS]", "[SEP]", "[PAD]")


@pytest.fixture(scope="module")
def searcher(built_index: Config) -> Iterator[Searcher]:
    s = Searcher.open(built_index)
    yield s
    s.close()


def test_special_tokens_are_not_answerable(searcher: Searcher, facts: list[Fact]) -> None:
    f = facts[0]
    asked = Question(
        f"{f.person.title()} was born in [MASK].", f.person.title(), evidence_for=(*SPECIAL, f.city)
    )
    found = {e.word: e for e in searcher.answer(asked).evidence_for}
    for word in SPECIAL:
        assert searcher.value(word) is None, word
        assert (found[word].answerable, found[word].votes, found[word].sentences) == (False, 0, []), word
    assert found[f.city].answerable  # an ordinary word still is
