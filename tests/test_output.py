"""Rendering: the text of summaries says what their JSON says, in the same words."""

from __future__ import annotations

from bertknn_search.ingest.pipeline import IngestSummary
from bertknn_search.output import render_summary, render_warm


def test_an_add_summary_names_every_count_as_its_json_key_does() -> None:
    summary = IngestSummary(2, 3, 1, 6, 50, 2.0, "idx", replaced=1, duplicates=4)
    assert render_summary(summary, "added") == (
        "added 2 articles (1 replaced, 3 already stored, 1 empty skipped, 4 duplicate ids): 6 sentences,"
        " 50 contexts in 2.0 s (25 contexts/s) into idx"
    )


def test_one_of_a_thing_is_singular_in_summaries() -> None:
    from bertknn_search.warm import WarmSummary

    one = IngestSummary(1, 0, 0, 1, 1, 1.0, "idx", duplicates=1)
    assert render_summary(one, "added").startswith(
        "added 1 article (0 replaced, 0 already stored, 0 empty skipped, 1 duplicate id): 1 sentence,"
        " 1 context in 1.0 s"
    )
    warmed = render_warm(WarmSummary(1, 1, 1, 1.0, "idx", index_contexts=1, estimated_contexts=0))
    assert warmed.startswith("warmed 1 article (1 encoded now, the rest already held): 1 context in 1.0 s")
    assert "the index holds 1 context (idx)" in warmed


def test_slow_bars_give_units_per_second_not_seconds_glued_to_the_unit() -> None:
    from tqdm import tqdm

    from bertknn_search.cli.encode_bar import ENCODE_BAR
    from bertknn_search.warm import WARM_BAR

    # One article in 6.66 s: tqdm's default rate reads "6.66s/ articles".
    warm = tqdm.format_meter(1, 3, 6.66, bar_format=WARM_BAR, unit=" articles", prefix="warm")
    assert "0.15 articles/s" in warm and "s/ " not in warm and "1/3 articles" in warm
    encode = tqdm.format_meter(5, 80, 50.0, bar_format=ENCODE_BAR, unit=" contexts", prefix="encoding")
    assert "0.10 contexts/s" in encode and "s/ " not in encode
