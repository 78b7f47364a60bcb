"""Issue 52's walk: the wrong backend named, the page's hints, quiet pipes (each a thing a new user hit)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bertknn_search.cli import main

QUESTION = "Einstein was born in [MASK]."


# -- 52.2: the wrong backend ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("var", "engine"), [("OPENSEARCH_URL", "opensearch"), ("ELASTICSEARCH_URL", "elasticsearch")]
)
def test_a_missing_embedded_index_names_the_engine_whose_url_is_set(
    var: str, engine: str, tmp_path: Path
) -> None:
    env = {var: "http://127.0.0.1:9", "BERTKNN_BACKEND": "", "BERTKNN_INDEX": ""}
    for command in (["query", QUESTION], ["stats"]):
        result = CliRunner().invoke(main, [*command, "--index", str(tmp_path / "none")], env=env)
        assert result.exit_code == 1
        assert result.output.strip().splitlines() == [
            f"Error: no index at {tmp_path / 'none'}; build one with 'bertknn-search ingest wiki';"
            f" {var} is set: for the index on {engine}, add --backend {engine} (or export"
            f" BERTKNN_BACKEND={engine})"
        ]


def test_a_missing_embedded_index_without_an_engine_url_says_only_how_to_build_one(tmp_path: Path) -> None:
    env = {"OPENSEARCH_URL": "", "ELASTICSEARCH_URL": "", "BERTKNN_BACKEND": ""}
    result = CliRunner().invoke(main, ["stats", "--index", str(tmp_path / "none")], env=env)
    assert result.exit_code == 1
    assert "--backend" not in result.output and "build one with" in result.output


@pytest.mark.parametrize(
    ("where", "undo"),
    [(["--backend", "opensearch"], "drop --backend"), (["--backend", "elasticsearch"], "drop --backend")],
)
def test_index_with_an_engine_backend_is_one_line_not_ignored(
    where: list[str], undo: str, tmp_path: Path
) -> None:
    for command in (["query", QUESTION], ["stats"], ["ingest", "wiki", str(Path(__file__))]):
        result = CliRunner().invoke(main, [*command, "--index", str(tmp_path), *where])
        assert result.exit_code in (1, 2), result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.output
        assert lines[0].startswith("Error: --index names an embedded index's folder, but the backend is")
        assert lines[0].endswith(f"drop --index, or {undo} to use the folder")


def test_index_from_the_environment_with_an_engine_backend_still_works(tmp_path: Path) -> None:
    # BERTKNN_INDEX exported for the embedded index does not stop an engine's commands (only the flag does).
    env = {"BERTKNN_INDEX": str(tmp_path), "OPENSEARCH_URL": "http://127.0.0.1:9"}
    result = CliRunner().invoke(main, ["stats", "--backend", "opensearch"], env=env)
    assert "--index names" not in result.output
