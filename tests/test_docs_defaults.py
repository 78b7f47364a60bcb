"""One value for each default: what the docs (README.md, docs/*.md) and ``--help`` say a setting's default
is equals the code's (issue 52: docs/wikipedia.md and docs/lazy.md said 64 for ``--budget``, the code 1,024).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import CPU_BUDGET, CPU_BUDGET_S, Config

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = Config()
# Setting -> (the code's value, the ways prose states its default). ``v`` is the number stated.
SETTINGS: dict[str, tuple[float, list[str]]] = {
    "--budget": (
        CPU_BUDGET,
        [
            r"default budget,? (?P<v>[\d,]+) contexts",
            r"`--budget`[^.;]{0,60}?\((?P<v>[\d,]+) (?:contexts )?by default",
            r"`--budget`(?!-s)[^.;()]{0,40}?(?P<v>[\d,]+) by default",
            r"--budget`?(?!-s)[^.;]{0,40}?\bdefault (?P<v>[\d,]+)(?! s)",
        ],
    ),
    "--budget-s": (
        CPU_BUDGET_S,
        [
            r"--budget-s`?[^;]{0,120}?\bdefault (?P<v>[\d.]+) (?:s )?on a CPU",
            r"--budget-s`? seconds \((?P<v>[\d.]+) by default on a CPU",
        ],
    ),
    "--layer": (
        DEFAULTS.layer,
        [r"default (?P<v>\d+) is BERT-base", r"--layer`?[^.;]{0,30}?\bdefault (?P<v>\d+)"],
    ),
    "--temperature": (
        DEFAULTS.temperature,
        [r"default l ?= ?(?P<v>[\d.]+)", r"--temperature`?[^.;]{0,30}?\bdefault (?P<v>[\d.]+)"],
    ),
    "-k": (DEFAULTS.k, [r"default k ?= ?(?P<v>\d+)", r"`-k`[^.;]{0,30}?\bdefault (?P<v>\d+)"]),
    "--n-articles": (
        DEFAULTS.n_articles,
        [r"default N ?= ?(?P<v>\d+)", r"--n-articles`?[^.;]{0,30}?\bdefault (?P<v>\d+)"],
    ),
    "--lambda": (
        DEFAULTS.lam,
        [r"default λ ?= ?(?P<v>[\d.]+)", r"--lambda`?[^.;]{0,30}?\bdefault (?P<v>[\d.]+)"],
    ),
}


def stated(text: str) -> dict[str, list[tuple[float, str]]]:
    """Each setting's default as ``text`` states it: (the number, the words around it)."""
    flat = re.sub(r"\s+", " ", text)
    found: dict[str, list[tuple[float, str]]] = {name: [] for name in SETTINGS}
    for name, (_value, patterns) in SETTINGS.items():
        for pattern in patterns:
            for match in re.finditer(pattern, flat):
                number = float(match["v"].replace(",", "").rstrip("."))
                found[name].append((number, flat[max(0, match.start() - 40) : match.end() + 20]))
    return found


def test_what_the_docs_say_each_default_is_is_the_codes() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    wrong, seen = [], set()
    for page in pages:
        for name, statements in stated(page.read_text(encoding="utf-8")).items():
            for number, words in statements:
                seen.add(name)
                if number != SETTINGS[name][0]:
                    code = SETTINGS[name][0]
                    wrong.append(f"{page.relative_to(ROOT)}: {name} {number:g}, the code {code:g}: {words!r}")
    assert not wrong, "\n".join(wrong)
    assert {"--budget-s", "--layer", "--temperature"} <= seen  # the patterns still find what the docs say


def test_the_patterns_catch_a_wrong_default() -> None:
    said = stated(
        "it encodes `--budget` of its contexts (64 by default, about 2 s). The default budget, 64 contexts,"
    )
    assert [n for n, _ in said["--budget"]] == [64, 64]


@pytest.mark.parametrize("name", [n for n in SETTINGS if n != "--layer"])  # query takes the index's
def test_what_help_says_each_default_is_is_the_codes(name: str) -> None:
    shown = re.sub(r"\s+", " ", CliRunner().invoke(main, ["query", "--help"], terminal_width=400).output)
    option = re.search(
        rf"(?:^| ){re.escape(name)} \S+(?: RANGE)? (?P<help>.*?)\[default (?P<v>[\d.,]+)", shown
    )
    assert option is not None, shown
    assert float(option["v"].replace(",", "")) == SETTINGS[name][0], option.group(0)


def test_ingest_help_says_the_default_layer() -> None:
    shown = re.sub(
        r"\s+", " ", CliRunner().invoke(main, ["ingest", "wiki", "--help"], terminal_width=400).output
    )
    match = re.search(r"--layer \S+(?: RANGE)? .*?\[default the index's; (?P<v>\d+) for a new index", shown)
    assert match is not None and int(match["v"]) == DEFAULTS.layer
