"""``bertknn-search titles``: what an index holds, on every backend; titles never fake output lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bertknn_search.backends import open_backend
from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.output import printable, render_titles
from bertknn_search.session import Title, list_titles

ROWS = [
    {"id": "1", "title": "Albert Einstein", "text": "Albert Einstein was born in Ulm. He was a physicist."},
    {"id": "2", "title": "Einstein (crater)", "text": "Einstein is a crater on the Moon."},
    {"id": "3", "title": "Ulm", "text": "Ulm is a city in Germany."},
    {"id": "4", "title": "100%_pure", "text": "A title with LIKE's wildcards in it."},
]


def write(path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


@pytest.mark.parametrize("backend", ["embedded", "opensearch", "elasticsearch"])
def test_titles_holding_a_pattern_in_any_case(
    base_config: Config, tmp_path: Path, backend: str, make_cluster_config: Any
) -> None:
    config = base_config.replace(index=tmp_path / "i", contexts="lazy")
    if backend != "embedded":
        config = make_cluster_config(backend).replace(contexts="lazy")
    ingest(write(tmp_path / "t.jsonl"), config, progress=False)
    store = open_backend(config)
    try:
        assert [h.title for h in store.list_titles("EINSTEIN", 10)] == [
            "Albert Einstein",
            "Einstein (crater)",
        ]
        assert [h.title for h in store.list_titles("", 10)] == [
            "100%_pure",
            "Albert Einstein",
            "Einstein (crater)",
            "Ulm",
        ]
        assert [h.id for h in store.list_titles("", 2)] == ["4", "1"]
        assert [h.id for h in store.list_titles("%_", 10)] == ["4"]  # wildcards stand for themselves
        assert store.list_titles("0*", 10) == [] and store.list_titles("zzz", 10) == []
    finally:
        store.close()
    listed = list_titles(config, "ulm", 10)
    assert listed == [Title("3", "Ulm", 0, None)]  # lazy: nothing encoded before a question needs it


def test_the_cli_lists_titles_with_their_coverage(built_index: Config) -> None:
    r = CliRunner().invoke(main, ["titles", "--index", str(built_index.index), "--limit", "3", "--json"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.output.splitlines()]
    assert len(rows) == 3 and all(row["encoded"] is None for row in rows)  # an eager index: all encoded
    text = CliRunner().invoke(main, ["titles", "--index", str(built_index.index), "--limit", "3"]).output
    assert [line.split()[0] for line in text.splitlines()] == [row["id"] for row in rows]
    none = CliRunner().invoke(main, ["titles", "zzzz", "--index", str(built_index.index)])
    assert none.output == "no titles holding 'zzzz' in the index\n"


def test_control_characters_in_titles_are_shown_escaped() -> None:
    assert printable("Fake\nreal line") == "Fake\\nreal line"
    assert printable("Tab\there\x1b[31m") == "Tab\\there\\x1b[31m"
    assert printable("Ümlaut — fine") == "Ümlaut — fine"
    text = render_titles([Title("9", "Evil\nanswer: 1. paris", None, None)], "")
    assert text.count("\n") == 0 and "Evil\\nanswer" in text


def test_a_subject_that_is_no_title_says_so_and_names_the_closest_titles(
    base_config: Config, tmp_path: Path
) -> None:
    from bertknn_search.output import render_answer
    from bertknn_search.query.search import Searcher
    from bertknn_search.records import Question

    config = base_config.replace(index=tmp_path / "i")
    ingest(write(tmp_path / "t.jsonl"), config, progress=False)
    searcher = Searcher.open(config)
    try:
        einstein, own, nothing = searcher.answer_batch(
            [
                Question("He was born in [MASK].", "Einstein"),
                Question("He was born in [MASK].", "albert einstein"),
                Question("He was born in [MASK].", "Zzyzx Qorv"),
            ]
        )
    finally:
        searcher.close()
    assert einstein.closest_titles == ["Albert Einstein", "Einstein (crater)"]
    assert own.closest_titles is None  # a title (any case): its own article, nothing to say
    assert nothing.closest_titles == []
    text = render_answer(einstein, 3)
    assert (
        "note: subject 'Einstein' is no title in the index, so its words were searched (BM25); titles that"
        " hold them: 'Albert Einstein', 'Einstein (crater)' (give one as --subject)"
    ) in text
    assert "'bertknn-search titles PATTERN' lists titles" in render_answer(nothing, 3)
