"""The IR search of a question runs beside its encoder pass (``Searcher.score_batch``), when no gate waits
for the encoder to decide whether to retrieve: on an engine that search is a round trip to the node."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.errors import BackendError
from bertknn_search.query.search import Searcher
from bertknn_search.records import Answer, Question

WAIT_S = 30.0  # far longer than any search here: reaching it means the search never started


@pytest.fixture
def fresh(built_index: Config) -> Iterator[Searcher]:
    s = Searcher.open(built_index)
    yield s
    s.close()


def asked(facts: list[Fact]) -> list[Question]:
    f = facts[0]
    return [
        Question(f"{f.person.title()} was born in [MASK].", f.person.title()),
        Question(f"Many people in [MASK] knew {f.person.title()}."),
    ]


def summary(answer: Answer) -> tuple[Any, ...]:
    return (
        [h.id for h in answer.articles],
        [(p.word, round(p.prob, 6)) for p in answer.bert_knn[:5]],
        [(e.word, [s.sentence for s in e.sentences]) for e in answer.evidence],
    )


def watch_searches(searcher: Searcher, monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[str]]:
    """An event set by the backend's first IR search, and the order of searches and encoder passes."""
    searched = threading.Event()
    order: list[str] = []
    backend = searcher.backend
    for name in ("find_titles", "search_articles"):
        original = getattr(backend, name)

        def wrapped(*args: Any, _o: Any = original, _n: str = name, **kwargs: Any) -> Any:
            order.append(_n)
            searched.set()
            return _o(*args, **kwargs)

        monkeypatch.setattr(backend, name, wrapped)
    return searched, order


def test_the_ir_search_runs_while_the_encoder_does(
    fresh: Searcher, facts: list[Fact], monkeypatch: pytest.MonkeyPatch
) -> None:
    searched, order = watch_searches(fresh, monkeypatch)
    encode = fresh.encoder.query
    overlapped: list[bool] = []

    def encoder_waits_for_the_search(texts: Any) -> Any:
        # The pass goes on only once a search has started: before the change it never would have.
        overlapped.append(searched.wait(WAIT_S))
        order.append("encode")
        return encode(texts)

    monkeypatch.setattr(fresh.encoder, "query", encoder_waits_for_the_search)
    questions = asked(facts)
    answers = fresh.answer_batch(questions)
    assert overlapped == [True]
    assert order.index("find_titles") < order.index("encode")
    # The same answers as a searcher whose gate makes it retrieve after the encoder (every question does).
    after = Searcher.open(fresh.config.with_gate_threshold("top1", 2.0))
    try:
        before = after.answer_batch(questions)
    finally:
        after.close()
    assert [summary(a) for a in answers] == [summary(b) for b in before]


def test_a_gate_that_reads_the_encoder_retrieves_after_it(
    built_index: Config, facts: list[Fact], monkeypatch: pytest.MonkeyPatch
) -> None:
    # top1 below 2 always: every question retrieves, once the encoder has said so.
    searcher = Searcher.open(built_index.with_gate_threshold("top1", 2.0))
    try:
        _, order = watch_searches(searcher, monkeypatch)
        encode = searcher.encoder.query

        def recorded(texts: Any) -> Any:
            order.append("encode")
            return encode(texts)

        monkeypatch.setattr(searcher.encoder, "query", recorded)
        searcher.answer(asked(facts)[0])
        assert order == ["encode", "find_titles"]
    finally:
        searcher.close()


def test_a_failed_search_is_the_question_s_error(
    fresh: Searcher, facts: list[Fact], monkeypatch: pytest.MonkeyPatch
) -> None:
    def down(*args: Any, **kwargs: Any) -> Any:
        raise BackendError("the engine at http://127.0.0.1:1 cannot be reached")

    monkeypatch.setattr(fresh.backend, "find_titles", down)
    with pytest.raises(BackendError, match="cannot be reached"):
        fresh.answer(asked(facts)[0])
