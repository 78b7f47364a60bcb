"""Anytime answers on a lazy index: a budget of contexts first, stored as parts, the rest later."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from bertknn_search.backends.embedded import sqlite_file
from bertknn_search.backends.encode_order import Lexicon, order_rows
from bertknn_search.backends.lazy import LazyDatastore
from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.errors import BackendError
from bertknn_search.output import render_answer, to_json
from bertknn_search.query.search import Searcher
from bertknn_search.records import Answer, EncodeHooks, Question
from bertknn_search.server.batcher import MicroBatcher, Stopping
from tests.conftest import long_article_index
from tests.test_lazy import assert_same_answer, lazy_copy, lazy_index  # noqa: F401  (fixtures)

BUDGET = 5  # the synthetic articles have 25 contexts each


def own_question(fact: Fact) -> Question:
    return Question(f"{fact.person.title()} was born in [MASK].", fact.person.title())


def article_contexts(searcher: Searcher, article_id: str) -> int:
    return searcher.backend.coverage([article_id])[article_id].total


def test_a_budget_answers_over_part_of_an_article_and_every_output_says_so(
    lazy_copy: Config,  # noqa: F811
    facts: list[Fact],
) -> None:
    searcher = Searcher.open(lazy_copy.replace(budget=BUDGET))
    try:
        answer = searcher.answer(own_question(facts[0]))
        (aid,) = [a.id for a in answer.articles]
        cov = answer.coverage[aid]
        assert (cov.encoded, answer.partial) == (BUDGET, True) and cov.total > BUDGET
        assert answer.n_neighbors == BUDGET  # only what is stored is searched
        data = json.loads(to_json(answer))
        assert data["partial"] is True
        assert data["coverage"] == {aid: {"encoded": BUDGET, "total": cov.total}}
        assert (
            f"partial answer: contexts encoded so far of 'Zorblat' {BUDGET} of {cov.total}"
            in render_answer(answer, 5)
        )
        stats = searcher.backend.stats()
        assert (stats.partial_articles, stats.partial_contexts, stats.encoded_articles) == (1, BUDGET, 0)
    finally:
        searcher.close()


def test_asking_again_encodes_more_until_the_answer_is_the_eager_one(
    lazy_copy: Config,  # noqa: F811
    built_index: Config,
    facts: list[Fact],
) -> None:
    q = own_question(facts[1])
    searcher, eager = Searcher.open(lazy_copy.replace(budget=BUDGET)), Searcher.open(built_index)
    try:
        seen = []
        answer: Answer | None = None
        for _ in range(20):
            answer = searcher.answer(q)
            (cov,) = answer.coverage.values()
            seen.append(cov.encoded)
            if cov.complete:
                break
        assert answer is not None and not answer.partial
        assert seen == sorted(set(seen)) and seen[0] == BUDGET and len(seen) > 2  # grew every time
        assert_same_answer(answer, eager.answer(q))
        stats = searcher.backend.stats()
        # Whole again: one row per article, one copy of each context, no parts left.
        assert (stats.partial_articles, stats.encoded_articles, stats.contexts) == (0, 1, seen[-1])
    finally:
        searcher.close()
        eager.close()


def test_exact_encodes_everything_first_and_equals_eager(
    lazy_copy: Config,  # noqa: F811
    built_index: Config,
    facts: list[Fact],
) -> None:
    q = own_question(facts[2])
    searcher, eager = Searcher.open(lazy_copy.replace(budget=1, exact=True)), Searcher.open(built_index)
    try:
        answer = searcher.answer(q)
        assert not answer.partial and all(c.complete for c in answer.coverage.values())
        assert_same_answer(answer, eager.answer(q))
    finally:
        searcher.close()
        eager.close()


class Stop(Exception):
    pass


def test_a_stopped_encode_keeps_whole_parts_and_the_next_run_resumes_to_one_copy(
    lazy_copy: Config,  # noqa: F811
    built_index: Config,
    facts: list[Fact],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bertknn_search.backends import lazy

    monkeypatch.setattr(lazy, "STEP_S", 1e-9)  # one row a step, as BERT-base on a slow CPU
    q = own_question(facts[3])
    steps = []

    searcher = Searcher.open(lazy_copy.replace(exact=True))

    def stop_in_the_fourth_step() -> None:
        # Called before each of the ``layer`` blocks of each one-row step: stop inside the fourth.
        steps.append(1)
        if len(steps) == 3 * searcher.encoder.layer + 2:
            raise Stop

    searcher.hooks = EncodeHooks(between=stop_in_the_fourth_step)
    try:
        with pytest.raises(Stop):
            searcher.answer(q)
        (aid,) = [h.id for h in searcher.retrieve(q)]
        cov = searcher.backend.coverage([aid])[aid]
        assert cov.encoded == 3 < cov.total  # the three finished steps were stored, the fourth not
    finally:
        searcher.close()
    again, eager = Searcher.open(lazy_copy.replace(exact=True)), Searcher.open(built_index)
    try:
        answer = again.answer(q)
        assert_same_answer(answer, eager.answer(q))
        stats = again.backend.stats()
        assert (stats.partial_articles, stats.contexts) == (0, answer.coverage[aid].total)
    finally:
        again.close()
        eager.close()


def test_rows_most_like_the_question_come_first() -> None:
    sentences = [
        "Quenton is a town on a river.",
        "Zorblat liked to paint in spring.",  # after "in", before ".", but without "born"
        "The painter Zorblat was born in Farrowby.",
    ]
    # (sentence, start, end) of every row: every word of every sentence.
    spans = [(s, m.start(), m.end()) for s, text in enumerate(sentences) for m in _words(text)]
    lexicon = Lexicon.of(sentences, np.array(spans))
    everything = np.arange(len(spans))
    ranked = order_rows("Zorblat was born in [MASK].", "Zorblat", lexicon, everything, "lexical")
    first = spans[ranked[0]]
    assert sentences[first[0]][first[1] : first[2]] == "Farrowby"  # the born sentence, after "in"
    assert order_rows("x [MASK].", None, lexicon, everything[::-1], "lead").tolist() == everything.tolist()
    mixed = order_rows("Zorblat was born in [MASK].", "Zorblat", lexicon, everything, "mixed")
    # In turn: the article's first row, then the lexical best, then the article's second, ...
    assert mixed[:2].tolist() == [0, ranked[0]] and sorted(mixed.tolist()) == everything.tolist()


def _words(text: str):  # type: ignore[no-untyped-def]
    import re

    return re.finditer(r"\w+", text)


def test_a_read_only_lazy_index_answers_in_memory_as_a_writable_one(
    lazy_copy: Config,  # noqa: F811
    lazy_index: Config,  # noqa: F811
    facts: list[Fact],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    q = own_question(facts[4])
    writable = Searcher.open(lazy_copy.replace(budget=BUDGET))
    try:
        want = [writable.answer(q) for _ in range(2)]
    finally:
        writable.close()
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_file, "_why_read_only", lambda db: "a read-only volume")
        ro = Searcher.open(lazy_index.replace(budget=BUDGET))
        try:
            got = [ro.answer(q) for _ in range(2)]
            assert ro.backend.stats().contexts == 0  # nothing was written
            with pytest.raises(BackendError, match="read-only"):
                ro.backend.store.put_contexts([])  # writes still fail, in one line
        finally:
            ro.close()
    for a, b in zip(got, want):
        assert a.coverage == b.coverage and a.partial
        assert_same_answer(a, b)


def test_the_server_answers_a_warm_question_while_a_cold_one_encodes_and_stops_it_on_shutdown(
    lazy_copy: Config,  # noqa: F811
    facts: list[Fact],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bertknn_search.ingest import contexts as contexts_module

    warm_q, cold_q = own_question(facts[5]), own_question(facts[6])
    exact = lazy_copy.replace(exact=True)
    prepared = Searcher.open(exact)
    prepared.answer(warm_q)  # its article is encoded now
    prepared.close()

    real = contexts_module.encode_rows
    started = threading.Event()

    def slow(rows, encoder, batch_size, on_batch=None):  # type: ignore[no-untyped-def]
        started.set()
        time.sleep(0.2)  # a BERT-base step on a CPU, for a tiny model
        return real(rows, encoder, batch_size, on_batch)

    monkeypatch.setattr(contexts_module, "encode_rows", slow)
    batcher = MicroBatcher(lambda: Searcher.open(exact), max_batch=8, window_s=0.001, max_queue=64)
    batcher.start()
    try:
        assert batcher.ready.wait(60)
        (cold,) = batcher.submit([cold_q], exact)
        assert started.wait(30)
        asked = time.monotonic()
        (warm,) = batcher.submit([warm_q], exact)
        answer = warm.result(timeout=30)
        assert answer.knn[0].word == facts[5].city and not answer.partial
        assert not cold.done()  # answered between two steps of the cold encode, which goes on
        assert time.monotonic() - asked < 5
        batcher.interrupt()
        with pytest.raises(Stopping):
            cold.result(timeout=5)
    finally:
        batcher.stop()
    check = Searcher.open(exact)
    try:
        (aid,) = [h.id for h in check.retrieve(cold_q)]
        cov = check.backend.coverage([aid]).get(aid)
        assert cov is None or cov.encoded < cov.total  # what the stopped encode stored, whole parts
        assert isinstance(check.backend, LazyDatastore)
    finally:
        check.close()


def test_post_articles_refuses_an_article_over_the_cli_limit(lazy_copy: Config) -> None:  # noqa: F811
    from fastapi.testclient import TestClient

    from bertknn_search.config import MAX_ARTICLE_BYTES
    from bertknn_search.server.app import ServerSettings, create_app

    app = create_app(ServerSettings(lazy_copy))
    big = {"articles": [{"id": "big", "title": "Big", "text": "wörd " * (MAX_ARTICLE_BYTES // 6 + 1)}]}
    with TestClient(app, base_url="http://localhost") as client:
        response = client.post("/articles", json=big)
        assert response.status_code == 413
        detail = response.json()["detail"]
        assert "\n" not in detail and "article 'big' holds" in detail and "nothing was written" in detail
    check = Searcher.open(lazy_copy)
    try:
        assert check.backend.fingerprints(["big"]) == {}
    finally:
        check.close()


def test_the_cli_takes_budget_and_exact_and_says_when_an_answer_is_partial(
    lazy_copy: Config,  # noqa: F811
    facts: list[Fact],
) -> None:
    from click.testing import CliRunner

    from bertknn_search.cli import main

    q = own_question(facts[7])
    common = ["query", q.text, "--subject", q.subject or "", "--index", str(lazy_copy.index)]
    runner = CliRunner()
    text = runner.invoke(main, [*common, "--budget", str(BUDGET)])
    assert text.exit_code == 0, text.output
    assert f"partial answer: contexts encoded so far of {q.subject!r} {BUDGET} of" in text.output
    grown = json.loads(runner.invoke(main, [*common, "--budget", str(BUDGET), "--json"]).output)
    (cov,) = grown["coverage"].values()
    assert grown["partial"] and cov["encoded"] == 2 * BUDGET  # each question encodes its budget more
    exact = runner.invoke(main, [*common, "--exact", "--json"])
    data = json.loads(exact.output)
    assert not data["partial"] and [c["encoded"] for c in data["coverage"].values()] == [cov["total"]]
    refused = runner.invoke(main, [*common, "--budget", "0"])
    assert refused.exit_code == 2 and "--budget" in refused.output


def test_a_budget_smaller_than_the_articles_searched_still_encodes_part_of_each(
    lazy_copy: Config,  # noqa: F811
) -> None:
    q = Question("Many people in [MASK] knew a famous painter.")
    searcher = Searcher.open(lazy_copy.replace(budget=1))
    try:
        answer = searcher.answer(q)
        assert len(answer.articles) == 3
        # One context of each article, never one article whole because the budget ran out before it.
        assert [answer.coverage[a.id].encoded for a in answer.articles] == [1, 1, 1]
        assert searcher.backend.stats().contexts == 3
    finally:
        searcher.close()


@pytest.mark.slow
@pytest.mark.reliability
def test_a_query_killed_mid_encode_keeps_whole_parts_and_the_next_resumes_to_one_copy(
    base_config: Config, tmp_path: Path
) -> None:
    import os
    import signal
    import subprocess
    import sys

    from bertknn_search.backends import open_backend

    config = long_article_index(base_config, tmp_path / "lazy", paragraphs=400, seed=2)
    ask = [sys.executable, "-m", "bertknn_search", "query", "Long Town lies on the [MASK].", "--subject"]
    ask += ["Long Town", "--index", str(config.index), "--device", "cpu"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}

    def stored() -> tuple[int, int]:
        backend = open_backend(config)
        try:
            coverage = backend.coverage(["long"]).get("long")
            stats = backend.stats()
            return (0 if coverage is None else coverage.encoded), stats.contexts
        finally:
            backend.close()

    proc = subprocess.Popen([*ask, "--exact"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while stored()[0] == 0 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    kept, contexts = stored()
    assert kept > 0 and kept == contexts  # whole parts only, each row once
    rerun = subprocess.run([*ask, "--budget", "100", "--json"], env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    (cov,) = json.loads(rerun.stdout)["coverage"].values()
    assert cov["encoded"] == kept + 100 == stored()[1] < cov["total"]  # went on where it stopped
