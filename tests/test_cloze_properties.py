"""Property tests for the cloze builder: any subject gives one [MASK] and appears verbatim."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertknn_search.eval.datasets import cloze
from bertknn_search.eval.popqa import TEMPLATES

LAMA_TEMPLATES = [
    "[X] was born in [Y] .",
    "[X] (born [Y]).",
    "The capital of [X] is [Y] .",
    "[Y] is the mother of [X].",
]


@pytest.mark.reliability
@settings(max_examples=300, deadline=None)
@given(
    template=st.sampled_from(LAMA_TEMPLATES + sorted(TEMPLATES.values())),
    subject=st.text(min_size=1, max_size=40).filter(lambda s: "[MASK]" not in s and "[X]" not in s),
)
def test_one_mask_and_the_subject_verbatim(template: str, subject: str) -> None:
    question = cloze(template, subject)
    assert question.count("[MASK]") == 1
    assert subject in question
    assert "[X]" not in question and ("[Y]" not in question or "[Y]" in subject)


def test_a_subject_containing_a_placeholder_stays_literal() -> None:
    assert cloze("[X] was born in [Y] .", "Agent [Y]") == "Agent [Y] was born in [MASK] ."
