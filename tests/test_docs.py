"""Docs: every CLI command has help with an example and appears in the README."""

from __future__ import annotations

from pathlib import Path

import click
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import ENV_VARS

README = Path(__file__).resolve().parents[1] / "README.md"


def commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group under ``group``, as the words that name it."""
    found = []
    for name, cmd in group.commands.items():
        found.append((*prefix, name))
        if isinstance(cmd, click.Group):
            found += commands(cmd, (*prefix, name))
    return found


def test_every_command_has_help_with_an_example_and_is_in_the_readme() -> None:
    readme = README.read_text(encoding="utf-8")
    paths = commands(main)
    assert {" ".join(p) for p in paths} >= {
        "ingest wiki",
        "add",
        "query",
        "stats",
        "eval run",
        "eval grid",
        "demo",
    }
    for path in paths:
        result = CliRunner().invoke(main, [*path, "--help"])
        assert result.exit_code == 0, path
        assert "Example: bertknn-search " in result.output, path
        assert f"bertknn-search {' '.join(path)}" in readme, path


def test_every_environment_variable_is_documented() -> None:
    readme = README.read_text(encoding="utf-8")
    for var in ENV_VARS:
        assert f"`{var}`" in readme, var
