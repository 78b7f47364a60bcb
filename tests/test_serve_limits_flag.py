"""`serve --limits`: the operator sets the per-request limits on the command line (issue 34)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import Config
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
