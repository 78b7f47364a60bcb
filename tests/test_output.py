"""Rendering: the text of summaries says what their JSON says, in the same words."""

from __future__ import annotations

from bertknn_search.ingest.pipeline import IngestSummary
from bertknn_search.output import render_summary


def test_an_add_summary_names_every_count_as_its_json_key_does() -> None:
    summary = IngestSummary(2, 3, 1, 6, 50, 2.0, "idx", replaced=1, duplicates=4)
    assert render_summary(summary, "added") == (
        "added 2 articles (1 replaced, 3 already stored, 1 empty skipped, 4 duplicate ids): 6 sentences,"
        " 50 contexts in 2.0 s (25 contexts/s) into idx"
    )
