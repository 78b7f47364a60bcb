"""Date facts for ``bench_confidence.py``, built from LAMA T-REx evidences: the T-REx relations in
../shared/data never ask a date.

An evidence sentence that gives a person's dates gives facts about that person, asked with Google-RE's
date_of_birth template or one of our own, with the sentence (the date unmasked) in the corpus, as LAMA's
evidences are. Wikipedia writes a life's dates in several forms, and which one the corpus holds decides
what a kNN answers ('26' or '1960' to "Allan Peiper (born [MASK])." over "Allan Peiper (born 26 April
1960 ...)"), so the year facts take the forms in turn:

- "Allan Peiper (born 26 April 1960 in ...)": the year of birth (P569, Wikidata's date of birth) and the
  month of birth (P0569, a made-up id: the harness reads T-REx files named P<digits>);
- "Ben Harper (born 1969)", "Ben Harper was born in 1969": the year of birth;
- "Alan Turing (1912–1954)": the year of birth and the year of death (P570), the one the other's
  neighbour.

Until issue 49's ``common_word`` release only the first form was built (BERT-base's shipped fits were
fitted on that: ``bench_confidence.py --date-forms 'born on'``); MiniLM's answers to it were never years,
so its fit had never seen a year answer to a date question, and on the other forms it put right years
under "low".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from itertools import zip_longest
from pathlib import Path
from typing import Any

from bertknn_search.query.answer_kinds import MONTHS

YEAR = r"(?:1[5-9]\d\d|20[0-2]\d)"
MONTH = "|".join(m.title() for m in sorted(MONTHS))
BORN_ON = re.compile(rf"\(born (?:(?:on )?\d{{1,2}} )?(?P<month>{MONTH})(?: \d{{1,2}},)? (?P<year>{YEAR})\b")
BORN_IN = rf" \(born (?P<year>{YEAR})\)| was born in (?P<year2>{YEAR})\b"
LIFE = rf" \((?:c\. )?(?P<year>{YEAR}) ?[–-] ?(?P<death>{YEAR})\)"
DATE_TEMPLATES = {
    "P569": "[X] (born [Y]).",
    "P0569": "[X] was born in the month of [Y] .",
    "P570": "[X] (died [Y]).",
}
FORMS = ("born on", "born in", "life")


def _fact(row: dict[str, Any], name: str, text: str, span: tuple[int, int]) -> dict[str, Any]:
    value = text[span[0] : span[1]]
    return {
        "sub_uri": row["sub_uri"],  # the person's article: the sentence joins it
        "sub_label": row["sub_label"],
        "obj_label": value.lower(),
        "predicate_id": name,
        "uuid": f"{row['uuid']}-{name}",
        "evidences": [
            {
                "sub_surface": row["sub_label"],
                "obj_surface": value,
                "masked_sentence": text[: span[0]] + "[MASK]" + text[span[1] :],
            }
        ],
    }


def _found(row: dict[str, Any], text: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(form, relation, fact) for every date fact the sentence ``text`` gives about ``row``'s subject: the
    first form as it was always read (the subject anywhere in the sentence), the others right after it."""
    sub = row["sub_label"]
    if sub not in text:
        return
    if found := BORN_ON.search(text):
        yield "born on", "P569", _fact(row, "P569", text, found.span("year"))
        yield "born on", "P0569", _fact(row, "P0569", text, found.span("month"))
    elif found := re.search(f"{re.escape(sub)}(?:{BORN_IN})", text):
        group = "year" if found["year"] else "year2"
        yield "born in", "P569", _fact(row, "P569", text, found.span(group))
    elif found := re.search(re.escape(sub) + LIFE, text):
        yield "life", "P569", _fact(row, "P569", text, found.span("year"))
        yield "life", "P570", _fact(row, "P570", text, found.span("death"))


# The relations each form gives facts of.
GIVES = {"born on": ("P569", "P0569"), "born in": ("P569",), "life": ("P569", "P570")}


def date_facts(
    lama: Path, per_relation: int, skip: int = 0, forms: Sequence[str] = FORMS
) -> dict[str, list[dict[str, Any]]]:
    """Up to ``per_relation`` facts of each date relation the ``forms`` give, after the first ``skip``, a
    person's first sentence that gives them; the year of birth takes the forms in turn.

    Raises:
        ValueError: a form not in ``FORMS``.
    """
    unknown = sorted(set(forms) - set(FORMS))
    if unknown:
        raise ValueError(f"date forms {unknown}: not among {FORMS}")
    wanted = skip + per_relation
    names = {name for form in forms for name in GIVES[form]}
    by_form: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in names}
    seen: dict[str, set[str]] = {name: set() for name in names}
    # (relation, form) lists to fill before the files need not be read further
    filling = {(name, form) for form in forms for name in GIVES[form]}
    for path in sorted((lama / "TREx").glob("*.jsonl")):
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                row = json.loads(line)
                for ev in row["evidences"]:
                    text = ev["masked_sentence"].replace("[MASK]", ev["obj_surface"])
                    for form, name, fact in _found(row, text):
                        if form in forms and row["sub_label"] not in seen[name]:
                            seen[name].add(row["sub_label"])
                            by_form[name].setdefault(form, []).append(fact)
        if all(len(by_form[name].get(form, [])) >= wanted for name, form in filling):
            break
    out = {}
    for name in sorted(names):
        turns = zip_longest(*(by_form[name].get(form, []) for form in FORMS if form in forms))
        out[name] = [fact for turn in turns for fact in turn if fact is not None][skip:wanted]
    return out
