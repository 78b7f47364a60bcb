"""PopQA files (the official TSV or the derived dev/test JSON) -> rows; a cloze template per relation."""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertknn_search.errors import InputFormatError

COLUMNS = frozenset({"id", "subj", "prop", "s_pop", "possible_answers"})
# Cloze versions of PopQA's 16 relations (Mallen et al. 2023), keyed by the TSV's ``prop``.
TEMPLATES = {
    "occupation": "[X]'s occupation is [Y] .",
    "place of birth": "[X] was born in [Y] .",
    "genre": "The genre of [X] is [Y] .",
    "father": "The father of [X] is [Y] .",
    "country": "[X] is located in [Y] .",
    "producer": "[X] was produced by [Y] .",
    "director": "[X] was directed by [Y] .",
    "capital of": "[X] is the capital of [Y] .",
    "screenwriter": "The screenwriter of [X] is [Y] .",
    "composer": "The composer of [X] is [Y] .",
    "color": "The color of [X] is [Y] .",
    "religion": "The religion of [X] is [Y] .",
    "sport": "[X] plays [Y] .",
    "author": "The author of [X] is [Y] .",
    "mother": "The mother of [X] is [Y] .",
    "capital": "The capital of [X] is [Y] .",
}
# PopQA's own question templates. Order matters: "capital of" is tried before the looser "capital".
QUESTIONS = {
    prop: re.compile(pattern)
    for prop, pattern in {
        "occupation": r"What is (.+)'s occupation\?",
        "place of birth": r"In what city was (.+) born\?",
        "genre": r"What genre is (.+)\?",
        "father": r"Who is the father of (.+)\?",
        "country": r"In what country is (.+)\?",
        "producer": r"Who was the producer of (.+)\?",
        "director": r"Who was the director of (.+)\?",
        "capital of": r"What is (.+) the capital of\?",
        "screenwriter": r"Who was the screenwriter for (.+)\?",
        "composer": r"Who was the composer of (.+)\?",
        "color": r"What color is (.+)\?",
        "religion": r"What is the religion of (.+)\?",
        "sport": r"What sport does (.+) play\?",
        "author": r"Who is the author of (.+)\?",
        "mother": r"Who is the mother of (.+)\?",
        "capital": r"What is the capital of (.+)\?",
    }.items()
}


@dataclass(frozen=True)
class PopQARow:
    """The fields of one PopQA question that the evaluation uses."""

    id: str
    prop: str
    subject: str
    answers: tuple[str, ...]
    popularity: float


def parse_question(question: str, where: str = "question") -> tuple[str, str]:
    """(relation, subject) of a PopQA question, e.g. "What is Var the capital of?" -> ("capital of", "Var").

    Raises:
        InputFormatError: the question matches none of PopQA's 16 question templates.
    """
    for prop, pattern in QUESTIONS.items():
        match = pattern.fullmatch(question.strip())
        if match:
            return prop, match.group(1)
    raise InputFormatError(f"{where}: {question!r} matches no PopQA question template")


def read_rows(path: Path, split: str = "test") -> list[PopQARow]:
    """Rows of ``popQA.tsv`` (any ``.tsv``), else of the derived JSON's ``split`` list.

    Raises:
        InputFormatError: unreadable file, missing column or field, unknown relation or question pattern.
    """
    return read_tsv(path) if path.suffix.lower() == ".tsv" else read_derived(path, split)


def read_tsv(path: Path) -> list[PopQARow]:
    """The official TSV: columns id, subj, prop, ..., s_pop, ..., possible_answers (a JSON list)."""
    try:
        handle = path.open(encoding="utf-8", newline="")
    except OSError as exc:
        raise InputFormatError(f"cannot open {path}: {exc.strerror}") from exc
    rows = []
    with handle:
        try:
            reader = csv.DictReader(handle, delimiter="\t")
            missing = COLUMNS - set(reader.fieldnames or ())
            if missing:
                raise InputFormatError(f"{path}:1: PopQA TSV lacks columns {sorted(missing)}")
            for row in reader:
                where = f"{path}:{reader.line_num}"
                prop = row["prop"]
                if prop not in TEMPLATES:
                    raise InputFormatError(f"{where}: unknown PopQA relation {prop!r}")
                subject = _text(row.get("subj"), "subj", where)
                answers = _answers(row["possible_answers"], where)
                rows.append(
                    PopQARow(_text(row.get("id"), "id", where), prop, subject, answers, _pop(row, where))
                )
        except (UnicodeDecodeError, csv.Error) as exc:
            raise InputFormatError(f"{path}: not a UTF-8 tab-separated file ({exc})") from exc
    return rows


def read_derived(path: Path, split: str) -> list[PopQARow]:
    """The derived JSON ``{dev: [...], test: [...]}``, items ``{input, output, id, s_pop, o_pop}``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputFormatError(f"cannot read PopQA JSON {path}: {exc}") from exc
    items = data.get(split) if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise InputFormatError(
            f"{path}: no list {split!r}; a derived PopQA JSON holds 'dev' and 'test' lists"
        )
    rows = []
    for i, item in enumerate(items):
        where = f"{path}:{split}[{i}]"
        if not isinstance(item, dict):
            raise InputFormatError(f"{where}: expected a JSON object")
        prop, subject = parse_question(_text(item.get("input"), "input", where), where)
        answers = _answers(_text(item.get("output"), "output", where), where)
        rows.append(PopQARow(_text(item.get("id"), "id", where), prop, subject, answers, _pop(item, where)))
    return rows


def _text(value: Any, name: str, where: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # the derived JSON stores ids as numbers
    if not isinstance(value, str) or not value.strip():
        raise InputFormatError(f"{where}: field {name!r} is missing or empty")
    return value


def _answers(text: str, where: str) -> tuple[str, ...]:
    try:
        answers = json.loads(text)
    except ValueError as exc:
        raise InputFormatError(f"{where}: possible answers are not a JSON list ({exc})") from exc
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise InputFormatError(f"{where}: possible answers must be a non-empty JSON list of strings")
    return tuple(answers)


def _pop(row: dict[str, Any], where: str) -> float:
    value = row.get("s_pop")
    try:
        pop = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise InputFormatError(f"{where}: s_pop {value!r} is not a number") from exc
    if not math.isfinite(pop) or pop < 0:
        raise InputFormatError(f"{where}: s_pop {value!r} must be a finite number >= 0")
    return pop
