"""A malformed question is refused in one line before any index, model or torch is loaded."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from click.testing import CliRunner
from bertknn_search.cli import main
r = CliRunner().invoke(main, ["query", *sys.argv[1:], "--index", "/nonexistent/index"])
print(r.exit_code)
print(r.output.strip())
print("torch" in sys.modules, "transformers" in sys.modules)
"""


@pytest.mark.parametrize(
    ("question", "line"),
    [
        ("no mask here", "Error: the question must contain exactly one [MASK], found 0: 'no mask here'"),
        (
            "Ulm is where Einstein was born in [mask].",
            "Error: the question has '[mask]': did you mean [MASK] (upper case)?"
            " 'Ulm is where Einstein was born in [mask].'",
        ),
        (
            "[MASK] and [MASK]",
            "Error: the question must contain exactly one [MASK], found 2: '[MASK] and [MASK]'",
        ),
        ("   ", "Error: the question is empty; write a sentence with one [MASK]"),
    ],
)
def test_a_bad_question_is_refused_before_anything_loads(question: str, line: str) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, question], capture_output=True, text=True, timeout=60)
    code, message, loaded = out.stdout.strip().splitlines()
    assert (code, message) == ("1", line)
    assert loaded == "False False", "torch or transformers was imported to refuse a malformed question"


def test_the_demo_names_the_command_as_a_new_user_can_run_it(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    from bertknn_search.cli.demo import _this_command

    venv_bin = Path(str(tmp_path)) / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    exe = venv_bin / "bertknn-search"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(exe), "demo"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert _this_command() == str(exe)  # not on the PATH after `make demo`: the path it ran by
    monkeypatch.setenv("PATH", f"{venv_bin}:/usr/bin")
    assert _this_command() == "bertknn-search"  # an activated venv


def test_query_takes_no_progress() -> None:
    from click.testing import CliRunner

    from bertknn_search.cli import main

    assert "--no-progress" in CliRunner().invoke(main, ["query", "--help"]).output


def test_a_new_index_of_a_headless_model_leaves_stopwords_out_unless_asked(
    minilm: object, tmp_path: pytest.TempPathFactory
) -> None:
    from pathlib import Path

    from bertknn_search.session import Resolved, policy_for_model, resolve_config

    resolved = resolve_config({"model": str(minilm), "layer": 6, "index": str(Path(str(tmp_path)) / "i")})
    chosen, line = policy_for_model(resolved)
    assert chosen.config.mask_policy == "single-wordpiece-no-stopwords"
    assert line is not None and line.startswith("mask policy: single-wordpiece-no-stopwords (the model has")
    asked = resolve_config({"model": str(minilm), "layer": 6, "mask_policy": "whole-word"})
    assert policy_for_model(asked) == (asked, None)  # a policy the user gave is kept
    adopted = Resolved(resolved.config, {"mask_policy": "the index at x"})
    assert policy_for_model(adopted) == (adopted, None)  # an existing index keeps its own


def test_a_model_with_a_head_keeps_the_default_policy(tiny_model: object) -> None:
    from bertknn_search.session import policy_for_model, resolve_config

    resolved = resolve_config({"model": str(tiny_model)})
    assert policy_for_model(resolved) == (resolved, None)
