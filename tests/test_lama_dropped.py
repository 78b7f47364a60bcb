"""LAMA facts that cannot be scored are counted with their reason; malformed lines are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertknn_search.config import Config
from bertknn_search.errors import InputFormatError
from bertknn_search.eval.datasets import read_facts
from bertknn_search.eval.harness import (
    BAD_QUESTION,
    MASK_IN_SUBJECT,
    QUESTION_TOO_LONG,
    SPECIAL_ANSWER,
    evaluate,
)
from bertknn_search.query.search import Searcher

TEMPLATES = [{"relation": "P19", "template": "[X] was born in [Y] ."}]


def write_lama(root: Path, facts: list[dict], templates: list[dict] = TEMPLATES) -> Path:
    (root / "TREx").mkdir(parents=True)
    (root / "relations.jsonl").write_text("".join(json.dumps(t) + "\n" for t in templates), encoding="utf-8")
    (root / "TREx" / "P19.jsonl").write_text("".join(json.dumps(f) + "\n" for f in facts), encoding="utf-8")
    return root


def fact(subject: object, obj: object, uuid: object) -> dict:
    return {"sub_label": subject, "obj_label": obj, "uuid": uuid}


def test_every_fact_left_out_is_counted_with_its_reason(
    searcher: Searcher, built_index: Config, tmp_path: Path
) -> None:
    root = write_lama(
        tmp_path / "lama",
        [
            fact("Zorblat", "quenton", "ok"),
            fact("[MASK] [MASK]", "quenton", "masks"),
            fact("[mask]", "quenton", "lower-mask"),
            fact(" ".join(["zorblat"] * 3000), "quenton", "long"),
            fact("Zorblat", "[MASK]", "special"),
            fact("Zorblat [Y]", "quenton", 7),  # a numeric uuid is an id; "[Y]" in a subject stays text
        ],
    )
    facts = read_facts(lama=root)
    assert [f.uuid for f in facts] == ["ok", "masks", "lower-mask", "long", "special", "7"]
    result = evaluate(searcher, facts, built_index, tmp_path / "out")
    dropped = {MASK_IN_SUBJECT: 2, QUESTION_TOO_LONG: 1, SPECIAL_ANSWER: 1}
    assert result.skipped == dropped and result.scored == 2
    lines = [json.loads(line) for line in result.checkpoint.read_text(encoding="utf-8").splitlines()]
    assert {line["uuid"]: line["skipped"] for line in lines} == {
        "ok": None, "masks": MASK_IN_SUBJECT, "lower-mask": MASK_IN_SUBJECT, "long": QUESTION_TOO_LONG,
        "special": SPECIAL_ANSWER, "7": None,
    }  # fmt: skip
    summary = json.loads(result.report["json"].read_text(encoding="utf-8"))
    assert summary["meta"]["dropped"] == dropped
    assert BAD_QUESTION not in result.skipped  # each reason is said, not lumped together


@pytest.mark.parametrize(
    ("facts", "templates", "message"),
    [
        (
            [fact("Zorblat", 5, "a")],
            TEMPLATES,
            r"P19.jsonl:1: field 'obj_label' is missing or not a non-empty string \(got int 5\)",
        ),
        (
            [fact(12, "quenton", "a")],
            TEMPLATES,
            r"field 'sub_label' is missing or not a non-empty string \(got int 12\)",
        ),
        (
            [fact("Zorblat", True, "a")],
            TEMPLATES,
            r"field 'obj_label' is missing or not a non-empty string \(got bool true\)",
        ),
        (
            [fact("Zorblat", None, "a")],
            TEMPLATES,
            r"field 'obj_label' is missing or not a non-empty string$",
        ),
        (
            [fact("Zorblat", "quenton", "a")],
            [{"relation": "P19", "template": "[X] was born in [Y] . [MASK]"}],
            r"relations.jsonl:1: template .* holds \[MASK\]; write the object as \[Y\]",
        ),
    ],
)
def test_a_malformed_lama_line_is_refused_in_one_line(
    tmp_path: Path, facts: list[dict], templates: list[dict], message: str
) -> None:
    root = write_lama(tmp_path / "lama", facts, templates)
    with pytest.raises(InputFormatError, match=message) as caught:
        read_facts(lama=root)
    assert "\n" not in str(caught.value)


def test_the_cli_refuses_a_numeric_answer_in_one_line(built_index: Config, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from bertknn_search.cli import main

    root = write_lama(tmp_path / "lama", [fact("Zorblat", 5, "a")])
    args = [
        "eval",
        "run",
        "--lama",
        str(root),
        "--index",
        str(built_index.index),
        "--out",
        str(tmp_path / "o"),
    ]
    result = CliRunner().invoke(main, args)
    assert (
        result.exit_code == 1
        and "field 'obj_label' is missing or not a non-empty string (got int 5)" in result.output
    )
    assert "Traceback" not in result.output
