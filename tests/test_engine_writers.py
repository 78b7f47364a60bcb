"""Writers side by side on real engines: two ingests of one input into one index, and a question that
finishes an article while the idle completion stores a part of it.

Each test runs on OpenSearch and on Elasticsearch (``cluster_config``: a fresh index pair on the session's
node of each engine).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from bertknn_search.backends.engines.backend import EngineBackend
from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.query.search import Searcher
from tests.test_backends import questions
from tests.test_engine_faults import assert_same_index, context_ids

pytestmark = [pytest.mark.slow, pytest.mark.reliability]
WRITERS = 3  # ingests at once: two met at a 409 in most runs, three in every one tried


def test_ingests_side_by_side_into_one_index_all_complete(
    cluster_config: Config, corpus: Path, built_index: Config, facts: list[Fact]
) -> None:
    """Every run completes (all but one failed with a 409 on marking articles settled, and the advice to fix
    the input, before) and the index equals one run's: counts, no context twice, the same answers."""
    outcome: dict[int, Any] = {}

    def run(i: int) -> None:
        try:
            outcome[i] = ingest(corpus, cluster_config, progress=False)
        except BaseException as exc:  # judged in the test's thread
            outcome[i] = exc

    writers = [threading.Thread(target=run, args=(i,)) for i in range(WRITERS)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(600)
    errors = [repr(o) for o in outcome.values() if isinstance(o, BaseException)]
    assert not errors and len(outcome) == WRITERS, errors
    articles = len(corpus.read_text().splitlines())
    for summary in outcome.values():
        assert summary.articles + summary.already_stored == articles
    assert_same_index(cluster_config, built_index, questions(facts))


def test_no_partial_record_outlives_a_question_that_finished_the_article(
    cluster_config: Config, corpus: Path, facts: list[Fact], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The idle completion has chosen a part of an article to encode; before it stores it, a question
    (``--exact``) encodes the rest of that article and stores it whole. The part stored after must not
    bring the partial record back (it did: ``stats`` then counted the article's contexts twice over,
    3,400 against 3,312 stored, and the idle completion chose it again and again)."""
    config = cluster_config.replace(contexts="lazy")
    ingest(corpus, config, progress=False)
    question = next(q for q in questions(facts) if q.subject)
    asker = Searcher.open(config.replace(budget=1))  # one context of each searched article, no more
    idle = Searcher.open(config)
    finisher = Searcher.open(config.replace(exact=True))
    try:
        asker.score_batch([question])
        parts: EngineBackend = idle.backend.parts  # type: ignore[attr-defined]
        partial = parts.partial_articles(10)
        assert partial, "the budgeted question left no partly encoded article"
        lazy = idle.backend
        store = lazy._store
        finished: list[bool] = []

        def store_late(*args: Any) -> None:
            finisher.score_batch([question])  # the question comes first and stores the article whole
            finished.append(True)
            store(*args)

        monkeypatch.setattr(lazy, "_store", store_late)
        assert lazy.encode_more(1) >= 1 and finished
        monkeypatch.undo()
        assert parts.partial_articles(10) == []
        stats = parts.stats()
        assert stats.partial_articles == 0 and stats.partial_contexts == 0
        on_server = context_ids(getattr(config, f"{config.backend}_url"), parts.names["contexts"])
        assert stats.contexts == len(on_server) == len(set(on_server))
        assert lazy.encode_more(100) == 0  # nothing left for the idle completion to do
    finally:
        for searcher in (asker, idle, finisher):
            searcher.close()
