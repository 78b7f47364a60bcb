"""`serve --limits`: the operator sets the per-request limits on the command line (issue 34)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.errors import ConfigError
from bertknn_search.server.limits import ENV, RequestLimits


def served_with(monkeypatch: pytest.MonkeyPatch, config: Config, *args: str) -> tuple[Any, list[Any]]:
    import bertknn_search.server.run as run

    seen: list[Any] = []
    monkeypatch.setattr(run, "serve", lambda settings, *rest: seen.append(settings))
    result = CliRunner().invoke(main, ["serve", "--index", str(config.index), *args])
    return result, seen


def test_the_flag_sets_the_limits_over_the_environment(
    built_index: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "questions=3")
    result, seen = served_with(monkeypatch, built_index, "--limits", "questions=9,exact=yes")
    assert result.exit_code == 0, result.output
    assert seen[0].limits == RequestLimits(questions=9, exact=True)
    result, seen = served_with(monkeypatch, built_index)
    assert seen[0].limits == RequestLimits(questions=3)  # without the flag, the environment's


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("questions=0", "--limits: questions must be a whole number >= 1, got 0"),
        ("speed=9", "--limits: 'speed=9' is not NAME=VALUE"),
        ("exact=maybe", "--limits: exact must be yes or no, got 'maybe'"),
    ],
)
def test_a_bad_flag_is_one_line_naming_it(
    built_index: Config, monkeypatch: pytest.MonkeyPatch, spec: str, said: str
) -> None:
    result, seen = served_with(monkeypatch, built_index, "--limits", spec)
    assert result.exit_code != 0 and not seen
    assert said in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        (
            "questions=99999999999999999999",
            "--limits: questions may be at most 1024, got 99999999999999999999",
        ),
        ("n-articles=5000", "--limits: n-articles may be at most 1000, got 5000"),
        ("budget-s=0", "--limits: budget-s must be more than 0 and at most 86,400 seconds, got 0.0"),
        ("budget-s=nan", "--limits: budget-s must be a number, got 'nan'"),
        ("query-body-mb=1e7", "--limits: query-body-mb must be more than 0 and at most 1024, got '1e7'"),
    ],
)
def test_each_limit_is_bounded(spec: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        RequestLimits.parse(spec, "--limits")
    assert str(caught.value) == said


def test_the_limits_are_shown_as_parsed() -> None:
    parsed = RequestLimits.parse(" questions = 1_000 ,budget-s=7.50, exact=on, query-body-mb=0.5", "--limits")
    assert parsed.describe() == (
        "questions=1000, n-articles=10, budget=64, exact=yes, articles=100, query-body-mb=0.5,"
        " lifted-by-token=no, budget-s=7.5"
    )


def test_query_server_sends_budget_s(monkeypatch: pytest.MonkeyPatch) -> None:
    from bertknn_search.server import client

    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(
        client, "post", lambda url, path, body, token=None: sent.append(body) or {"answers": []}
    )
    argv = ["query", "--server", "http://127.0.0.1:1", "--budget-s", "5", "--budget", "32", "a [MASK]."]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    assert sent[0]["budget-s"] == 5.0 and sent[0]["budget"] == 32
