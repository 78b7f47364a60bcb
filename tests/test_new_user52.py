"""Issue 52's walk: the wrong backend named, the page's hints, quiet pipes (each a thing a new user hit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


# -- 52.4: the page's [MASK] hint and model name -------------------------------------------------------
APP_JS = Path(__file__).resolve().parents[1] / "bertknn_search" / "server" / "static" / "app.js"

# Runs the page's script in node with a stand-in for the browser, then prints what the named functions
# return for the given arguments (one JSON array of results).
NODE_RUNNER = r"""
const vm = require("vm"), fs = require("fs");
const stub = new Proxy(function () {}, {
  get: (t, k) => (k === Symbol.toPrimitive ? () => "" : stub),
  apply: () => stub,
});
const context = vm.createContext({
  document: stub, window: stub, location: { search: "", pathname: "/" }, history: stub, console,
  fetch: () => Promise.reject(new Error("no server")), setTimeout: () => 0, clearTimeout: () => {},
  URLSearchParams,
});
vm.runInContext(fs.readFileSync(process.argv[1], "utf8"), context);
const calls = JSON.parse(process.argv[2]);
console.log(JSON.stringify(calls.map(([name, arg]) => vm.runInContext(name, context)(arg))));
"""


def run_page_functions(calls: list[tuple[str, str]]) -> list[object]:
    import json
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    done = subprocess.run(
        [node, "-e", NODE_RUNNER, str(APP_JS), json.dumps(calls)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("typed", ["<mask>", "<MASK>", "___", "{mask}", "[blank]", "[mask]"])
def test_the_page_gives_the_clis_did_you_mean_for_another_mask(typed: str) -> None:
    from bertknn_search.errors import QuestionError
    from bertknn_search.textcheck import check_question

    question = f"Einstein was born in {typed}."
    with pytest.raises(QuestionError) as cli_says:
        check_question(question)
    [page_says] = run_page_functions([("maskProblem", question)])
    assert isinstance(page_says, str)
    hint = str(cli_says.value).split("?")[0]  # the CLI's line, up to its question mark
    assert page_says.startswith("The" + hint[3:] + "?"), (page_says, hint)


def test_the_page_counts_masks_as_before() -> None:
    said = run_page_functions([("maskProblem", "A [MASK] and [MASK]."), ("maskProblem", "A [MASK].")])
    assert said == ["The question needs exactly one [MASK]; it has 2.", None]


def test_the_footer_names_a_model_folder_by_its_last_two_parts() -> None:
    names = [
        "bert-base-uncased",
        "sentence-transformers/all-MiniLM-L6-v2",
        "/tmp/walk/model",
        "/root/.cache/bertknn-search/models/bert-base-uncased",
        "./models/minilm",
    ]
    assert run_page_functions([("modelLabel", n) for n in names]) == [
        "bert-base-uncased",
        "sentence-transformers/all-MiniLM-L6-v2",
        "walk/model",
        "models/bert-base-uncased",
        "models/minilm",
    ]


# -- 52.6: make demo says what it installs, and how long, before it does -------------------------------
def test_make_demo_says_what_it_installs_and_how_long_before_it_starts(tmp_path: Path) -> None:
    import shutil
    import subprocess

    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    root = Path(__file__).resolve().parents[1]
    shown = subprocess.run(
        [make, "-n", "-B", "demo", f"VENV={tmp_path / 'venv'}"], cwd=root, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    commands = shown.stdout.splitlines()
    first_install = next(i for i, c in enumerate(commands) if "pip install" in c)
    said = " ".join(c for c in commands[:first_install] if c.startswith("echo "))
    assert "torch" in said and "min" in said and "test extras" in said, commands[:first_install]


def test_ingest_into_a_new_embedded_index_while_an_engine_url_is_set_says_so(
    base_config: Any, tmp_path: Path
) -> None:
    import json

    source = tmp_path / "input.jsonl"
    source.write_text(json.dumps({"id": "1", "title": "Vell", "text": "Vell was born in Ostria."}) + "\n")
    args = ["ingest", "wiki", str(source), "--model", base_config.model, "--index", str(tmp_path / "index")]
    env = {"OPENSEARCH_URL": "http://127.0.0.1:9", "BERTKNN_BACKEND": ""}
    first = CliRunner().invoke(main, [*args, "--no-progress"], env=env)
    assert first.exit_code == 0, first.output
    assert first.stderr.splitlines()[0] == (
        f"building an embedded index at {tmp_path / 'index'} (the default backend); OPENSEARCH_URL is set:"
        " --backend opensearch builds it on opensearch instead"
    )
    again = CliRunner().invoke(main, [*args, "--no-progress"], env=env)  # the index exists: nothing to say
    assert again.exit_code == 0 and "building an embedded index" not in again.stderr
