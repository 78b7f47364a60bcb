"""Each question its own budget, and a floor no clock cuts (issue 39, items 1 and 2).

No timing asserts: the clock the lazy index reads is replaced by one that moves only when the encoder
works, by a set number of seconds a row (a slow or a busy CPU) and, once, a one-time set-up.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from bertknn_search.backends import lazy
from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question
from tests.test_lazy import lazy_copy, lazy_index  # noqa: F401  (fixtures)

FLOOR = 3  # the synthetic articles have 25 contexts each: a floor well under that
FREE = Question("Many people in [MASK] knew a famous painter.")  # searches three articles


def own_question(fact: Fact) -> Question:
    return Question(f"{fact.person.title()} was born in [MASK].", fact.person.title())


@pytest.fixture
def slow_clock(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A clock that moves ``per_row`` seconds for each row the encoder encodes, and ``setup`` seconds
    more on the first encoder call (the one-time kernel set-up of a process)."""
    import bertknn_search.ingest.contexts as contexts
    import bertknn_search.query.search as search

    state = SimpleNamespace(now=1000.0, per_row=0.25, setup=0.0, calls=0)
    clock = SimpleNamespace(monotonic=lambda: state.now, perf_counter=time.perf_counter)
    monkeypatch.setattr(lazy, "time", clock)
    monkeypatch.setattr(search, "time", clock)
    monkeypatch.setattr(lazy, "FLOOR_ROWS", FLOOR)
    real = contexts.encode_rows

    def encode_rows(rows: list[object], *args: object, **kwargs: object) -> object:
        state.now += state.per_row * len(rows) + (state.setup if state.calls == 0 else 0.0)
        state.calls += 1
        return real(rows, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(contexts, "encode_rows", encode_rows)
    return state


def copy_of(config: Config, to: Path) -> Config:
    shutil.copytree(config.index, to)
    return config.replace(index=to)


def encoded(config: Config, batches: list[list[Question]]) -> list[dict[str, int]]:
    """Per question, in order, the contexts stored of each article it searched after its answer."""
    searcher = Searcher.open(config)
    try:
        out = []
        for batch in batches:
            for answer in searcher.answer_batch(batch):
                out.append({aid: c.encoded for aid, c in answer.coverage.items()})
        return out
    finally:
        searcher.close()


def test_a_batch_answers_as_its_questions_asked_one_at_a_time(
    lazy_index: Config,  # noqa: F811
    facts: list[Fact],
    slow_clock: SimpleNamespace,
    tmp_path: Path,
) -> None:
    qs = [own_question(f) for f in facts[:4]] + [FREE]
    config = lazy_index.replace(budget_s=2.5)
    batched = encoded(copy_of(config, tmp_path / "batched"), [qs])
    one_by_one = encoded(copy_of(config, tmp_path / "alone"), [[q] for q in qs])
    # A batch encodes what the same questions asked one at a time do (the same stored state at the end);
    # each answer then sees all of it, at least what it had alone (the free question's articles include
    # the first two questions' own).
    assert batched[-1] == one_by_one[-1]
    for mine, alone in zip(batched, one_by_one):
        assert mine.keys() == alone.keys() and all(mine[a] >= alone[a] for a in mine)
    # Each question: the floor of each article it searches, and its own 2.5 s, 10 rows at 4 a second.
    assert [n for got in one_by_one[:4] for n in got.values()] == [FLOOR + 10] * 4
    before = {aid: n for got in one_by_one[:4] for aid, n in got.items()}
    free = one_by_one[4]
    new = [aid for aid in free if aid not in before]
    assert sum(free.values()) - sum(before.get(aid, 0) for aid in free) == FLOOR * len(new) + 10


def test_the_floor_holds_under_any_load_and_the_count_budget_keeps_its_word(
    lazy_index: Config,  # noqa: F811
    slow_clock: SimpleNamespace,
    tmp_path: Path,
) -> None:
    slow_clock.per_row, slow_clock.setup = 100.0, 600.0  # a row takes longer than the whole budget
    (default,) = encoded(copy_of(lazy_index, tmp_path / "default"), [[FREE]])  # 64 contexts or 2.4 s
    assert len(default) == 3 and all(FLOOR <= n <= FLOOR + 1 for n in default.values())
    # A budget of contexts under the floor is the most there is: one context of each article.
    (few,) = encoded(copy_of(lazy_index.replace(budget=2, budget_s=1.0), tmp_path / "few"), [[FREE]])
    assert list(few.values()) == [1, 1, 1]


def test_more_seconds_encode_more_even_when_the_set_up_took_longer_than_both(
    lazy_index: Config,  # noqa: F811
    facts: list[Fact],
    slow_clock: SimpleNamespace,
    tmp_path: Path,
) -> None:
    q = own_question(facts[5])
    got = []
    for seconds in (2.4, 10.0):
        slow_clock.per_row, slow_clock.setup, slow_clock.calls = 1.0, 30.0, 0
        config = copy_of(lazy_index.replace(budget_s=seconds), tmp_path / f"s{seconds}")
        ((n,),) = [list(c.values()) for c in encoded(config, [[q]])]
        got.append(n)
    assert FLOOR < got[0] < got[1]


def test_query_file_says_how_many_answers_were_partial(
    lazy_copy: Config,  # noqa: F811
    facts: list[Fact],
    tmp_path: Path,
) -> None:
    from bertknn_search.cli import main

    asked = tmp_path / "questions.tsv"
    asked.write_text("".join(f"{q.text}\t{q.subject}\n" for q in map(own_question, facts[:3])))
    args = ["query", "--file", str(asked), "--index", str(lazy_copy.index), "--no-progress"]
    run = CliRunner().invoke(main, [*args, "--budget", "2"])
    assert run.exit_code == 0, run.output
    assert "answers partial" not in run.stdout  # the answers alone on stdout: the summary goes to stderr
    assert (
        run.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "3 of 3 answers partial: the fewest contexts a partial answer had of an article 2, the median 2;"
        )
    )
    whole = CliRunner().invoke(main, [*args, "--exact"])
    assert "0 of 3 answers partial: every article they searched was encoded whole" in whole.stderr
    # JSON lines stay JSON lines: each answer carries "partial" and "coverage" for a program to count.
    as_json = CliRunner().invoke(main, [*args, "--budget", "2", "--json"])
    assert "answers partial" not in as_json.output and len(as_json.stdout.splitlines()) == 3


def test_a_server_allows_its_own_count_only_with_its_clock() -> None:
    from bertknn_search.config import CPU_BUDGET
    from bertknn_search.server.limits import RequestLimits, query_refusal

    limits, server = RequestLimits(), Config()  # a CPU's default: 1,024 contexts with 2.4 s
    ask = lambda **kw: query_refusal(limits, None, server, server.replace(**kw), 1, "cpu")  # noqa: E731
    assert ask() is None and ask(budget=CPU_BUDGET, budget_s=2.4) is None
    # Without a clock a count is bounded by the limit (64), as before the default grew.
    refused = ask(budget=CPU_BUDGET)
    assert refused is not None and refused[0] == 422 and "(limit budget)" in refused[1]
    assert ask(budget=limits.budget) is None
