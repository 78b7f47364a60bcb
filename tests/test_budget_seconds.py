"""A budget of seconds: a cold question stops encoding at its deadline, best contexts first (issue 35)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bertknn_search.backends import lazy
from bertknn_search.cli import main
from bertknn_search.config import CPU_BUDGET, CPU_BUDGET_S, UNBOUNDED, Config
from bertknn_search.errors import ConfigError
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question
from tests.conftest import long_article_index

LONG = Question("Long Town is near the [MASK].", "Long Town")


def test_the_default_is_contexts_or_seconds_whichever_first_on_a_cpu_only() -> None:
    default = Config()
    assert (default.budget_for("cpu"), default.budget_seconds_for("cpu")) == (CPU_BUDGET, CPU_BUDGET_S)
    assert default.budget_seconds_for("cuda") is None  # a GPU's default is contexts alone
    # A count given alone is that many contexts, whatever they take.
    assert Config(budget=8).budget_seconds_for("cpu") is None
    # Seconds given alone rank every missing context, best first, and stop at the deadline.
    assert (Config(budget_s=9.0).budget_for("cpu"), Config(budget_s=9.0).budget_seconds_for("cuda")) == (
        UNBOUNDED,
        9.0,
    )
    assert Config(budget=8, budget_s=9.0).budget_for("cpu") == 8
    assert Config(budget_s=9.0, exact=True).budget_seconds_for("cpu") is None
    for bad in (0.0, -1.0, 1e9):
        with pytest.raises(ConfigError, match="--budget-s must be more than 0"):
            Config(budget_s=bad)


@pytest.fixture(scope="module")
def long_index(base_config: Config, tmp_path_factory: pytest.TempPathFactory) -> Config:
    return long_article_index(base_config, tmp_path_factory.mktemp("long") / "lazy", paragraphs=30, seed=4)


def cold_copy(config: Config, tmp_path: Path) -> Config:
    import shutil

    shutil.copytree(config.index, tmp_path / "copy")
    return config.replace(index=tmp_path / "copy")


def encoded_after(config: Config, question: Question) -> tuple[int, int, bool]:
    searcher = Searcher.open(config)
    try:
        answer = searcher.answer(question)
        seen = answer.coverage["long"]
        return seen.encoded, seen.total, answer.partial
    finally:
        searcher.close()


def test_a_passed_deadline_still_encodes_the_floor(long_index: Config, tmp_path: Path) -> None:
    encoded, total, partial = encoded_after(cold_copy(long_index, tmp_path).replace(budget_s=1e-3), LONG)
    # The article's lead, which no clock cuts, and at most a step more: the question's second ran out.
    assert partial and lazy.FLOOR_ROWS <= encoded < CPU_BUDGET < total


def test_seconds_alone_encode_past_the_default_count(long_index: Config, tmp_path: Path) -> None:
    encoded, total, _ = encoded_after(cold_copy(long_index, tmp_path).replace(budget_s=600.0), LONG)
    assert encoded == total > CPU_BUDGET  # ten minutes is the whole article for the tiny model


def test_the_deadline_is_checked_between_steps(
    long_index: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a clock that moves a second at each encoder step, a 5.5 s budget takes the floor's step and
    then at most six steps, each sized to the time left at the rate measured so far."""
    import time
    from types import SimpleNamespace

    import bertknn_search.ingest.contexts as contexts
    import bertknn_search.query.search as search

    now = [1000.0]
    clock = SimpleNamespace(monotonic=lambda: now[0], perf_counter=time.perf_counter)
    monkeypatch.setattr(lazy, "time", clock)
    monkeypatch.setattr(search, "time", clock)
    real, steps = contexts.encode_rows, []

    def step(rows: object, *args: object, **kwargs: object) -> object:
        steps.append(len(rows))  # type: ignore[arg-type]
        now[0] += 1.0
        return real(rows, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(contexts, "encode_rows", step)
    encoded, total, partial = encoded_after(cold_copy(long_index, tmp_path).replace(budget_s=5.5), LONG)
    assert partial and encoded == sum(steps) < total
    assert steps[0] == lazy.FLOOR_ROWS and 1 <= len(steps[1:]) <= 6


def test_the_cli_takes_budget_s_and_refuses_a_bad_one(long_index: Config, tmp_path: Path) -> None:
    config = cold_copy(long_index, tmp_path)
    args = ["query", LONG.text, "--subject", "Long Town", "--index", str(config.index), "--device", "cpu"]
    done = CliRunner().invoke(main, [*args, "--budget-s", "600", "--json", "--no-progress"])
    assert done.exit_code == 0, done.output
    assert '"partial": false' in done.output or '"partial":false' in done.output
    bad = CliRunner().invoke(main, [*args, "--budget-s", "0"])
    assert bad.exit_code == 2 and "--budget-s" in bad.output and "Traceback" not in bad.output
