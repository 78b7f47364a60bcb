"""The CLI on a lazy index: ingest --contexts lazy, stats, query, warm, --cache-size, eval's cost line."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import Result

from bertknn_search.config import Config
from bertknn_search.demo import Fact
from tests.test_cli import one_line_error, run
from tests.test_cli_eval import write_questions

QUESTION = "Zorblat was born in [MASK].\tZorblat\nMany people in [MASK] knew Zorblat as a famous painter.\n"


@pytest.fixture
def lazy_index(base_config: Config, corpus: Path, tmp_path: Path) -> Path:
    index = tmp_path / "lazy"
    r = run(
        *("ingest", "wiki", corpus, "--model", base_config.model, "--max-length", "64"),
        *("--contexts", "lazy", "--no-progress", "--index", index, "--device", "cpu", "--precision", "fp32"),
    )
    assert r.exit_code == 0, r.output
    assert "MB of text stored and indexed for IR" in r.output  # the text pass encodes nothing
    assert "contexts are encoded on first use (lazy index)" in r.output and "encoder:" not in r.output
    return index


def stats(index: Path) -> dict:
    r = run("stats", "--index", index, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def ask(index: Path, *extra: str) -> Result:
    return run(
        "query", "--file", "-", "--json", "--temperature", "1", "--index", index, *extra, input=QUESTION
    )


def test_a_lazy_index_answers_as_an_eager_one_and_says_what_it_holds(
    lazy_index: Path, built_index: Config
) -> None:
    before = stats(lazy_index)
    assert (before["meta"]["contexts"], before["contexts"], before["encoded_articles"]) == ("lazy", 0, 0)
    assert before["estimated_contexts"] is None  # unknown, as the text says, not an estimate of 0
    text = run("stats", "--index", lazy_index).output
    assert "contexts mode     lazy" in text and "encoded articles  0 of 20" in text
    assert "eager estimate    unknown until a query encodes an article" in text
    lazy, eager = ask(lazy_index, "--exact"), ask(built_index.index)
    assert lazy.exit_code == 0, lazy.output
    for a, b in zip(lazy.output.splitlines(), eager.output.splitlines()):
        x, y = json.loads(a), json.loads(b)
        assert x["articles"] == y["articles"] and x["n_neighbors"] == y["n_neighbors"]
        assert [p["word"] for p in x["bert_knn"]] == [p["word"] for p in y["bert_knn"]]
        assert [e["sentences"][0]["sentence"] for e in x["evidence"]] == [
            e["sentences"][0]["sentence"] for e in y["evidence"]
        ]
    after = stats(lazy_index)
    searched = {a["id"] for line in lazy.output.splitlines() for a in json.loads(line)["articles"]}
    assert after["encoded_articles"] == len(searched) and after["contexts"] > 0
    assert after["estimated_contexts"] > after["contexts"]


def test_a_damaged_compressed_text_is_one_line_naming_its_article(lazy_index: Path) -> None:
    with sqlite3.connect(lazy_index / "index.sqlite") as conn:
        conn.execute("UPDATE texts SET text = x'28b52ffd0058'")  # every text: a zstd frame cut short
    line = one_line_error(ask(lazy_index))
    assert line.startswith(f"Error: index at {lazy_index}: the stored text of article '")
    assert "' is damaged (not a zstd frame of UTF-8 text:" in line


def test_no_ir_on_a_lazy_index_says_to_build_an_eager_one(lazy_index: Path) -> None:
    line = one_line_error(ask(lazy_index, "--no-ir"))
    assert "cannot search every context (--no-ir)" in line and "ingest wiki --contexts eager" in line


def test_a_lazy_index_keeps_its_mode(lazy_index: Path, corpus: Path) -> None:
    r = run("ingest", "wiki", corpus, "--contexts", "eager", "--no-progress", "--index", lazy_index)
    line = one_line_error(r)
    assert "was built with contexts='lazy', not 'eager' (from --contexts)" in line


def test_warm_encodes_what_titles_or_a_question_file_need(lazy_index: Path, tmp_path: Path) -> None:
    by_title = run("warm", "--titles", "-", "--json", "--index", lazy_index, input="Mirvane\n")
    assert by_title.exit_code == 0, by_title.output
    assert json.loads(by_title.output)["encoded_articles"] == stats(lazy_index)["encoded_articles"] == 1
    questions = tmp_path / "q.txt"
    questions.write_text(QUESTION, encoding="utf-8")
    r = run("warm", "--file", questions, "--json", "--index", lazy_index, "--device", "cpu")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    held = stats(lazy_index)
    assert summary["articles"] >= summary["encoded_articles"] == held["encoded_articles"] - 1 > 0
    assert summary["index_contexts"] == held["contexts"] > summary["contexts"] > 0
    again = run("warm", "--file", questions, "--index", lazy_index, "--device", "cpu", "--no-progress")
    assert again.exit_code == 0 and again.output.startswith(
        f"warmed {summary['articles']} articles (0 encoded now, the rest already held): 0 contexts"
    )


def test_warm_titles_are_titles_or_files_of_them(lazy_index: Path, tmp_path: Path) -> None:
    r = run("warm", "--titles", "Mirvane", "--titles", "Zorblat", "--json", "--index", lazy_index)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["encoded_articles"] == stats(lazy_index)["encoded_articles"] == 2
    listed = tmp_path / "titles.txt"
    listed.write_text("Elvaris\n\nMirvane\n", encoding="utf-8")
    for given in (f"@{listed}", str(listed)):
        r = run("warm", "--titles", given, "--index", lazy_index, "--no-progress")
        assert r.exit_code == 0, r.output
        assert r.output.startswith("warmed 2 articles (")  # Elvaris and Mirvane, not the file's name
    assert stats(lazy_index)["encoded_articles"] == 3
    r = run("warm", "--titles", f"@{tmp_path / 'absent.txt'}", "--index", lazy_index)
    assert r.exit_code == 2 and "cannot read" in r.output and "absent.txt" in r.output


def test_warm_needs_input(lazy_index: Path) -> None:
    r = run("warm", "--index", lazy_index)
    assert r.exit_code == 2 and "give --file with questions or --titles" in r.output


@pytest.mark.parametrize(("size", "ok"), [("20GB", True), ("1.5KiB", True), ("banana", False), ("0", False)])
def test_cache_size_takes_sizes(lazy_index: Path, size: str, ok: bool) -> None:
    r = ask(lazy_index, "--cache-size", size)
    assert (r.exit_code == 0) == ok, r.output
    if not ok:
        assert r.exit_code == 2 and "--cache-size" in r.output


def test_a_tiny_cache_keeps_only_the_articles_of_the_last_question(lazy_index: Path) -> None:
    assert ask(lazy_index, "--cache-size", "1KB").exit_code == 0
    held = stats(lazy_index)
    assert 1 <= held["encoded_articles"] <= 3  # the last question's articles are never dropped


def test_eval_run_on_a_lazy_index_reports_what_it_encoded(
    lazy_index: Path, facts: list[Fact], tmp_path: Path
) -> None:
    questions = tmp_path / "q.jsonl"
    write_questions(questions, facts[:4])
    out = tmp_path / "eval"
    r = run("eval", "run", "--questions", questions, "--index", lazy_index, "--no-progress", "--out", out)
    assert r.exit_code == 0, r.output
    held = stats(lazy_index)
    assert (
        f"contexts: {held['contexts']:,} encoded by this run; the index holds {held['contexts']:,}"
        f" ({held['encoded_articles']} of 20 articles)"
    ) in r.output
    assert "an eager index would hold" in r.output
    datastore = json.loads((out / "results.json").read_text())["meta"]["datastore"]
    assert datastore["contexts_encoded"] == held["contexts"] > 0
    assert datastore["estimated_eager_contexts"] == held["estimated_contexts"]


def test_a_lazy_ingest_shows_its_input_read_and_text_not_contexts(
    base_config: Config, corpus: Path, tmp_path: Path
) -> None:
    args = [
        *("ingest", "wiki", corpus, "--model", base_config.model, "--contexts", "lazy"),
        "--device",
        "cpu",
    ]
    shown = run(*args, "--index", tmp_path / "a")
    assert shown.exit_code == 0, shown.output
    err = shown.stderr
    # No --limit: the bar runs over the input's bytes (a total and an estimate), and says what it stores.
    assert "B read" in err and "MB of text" in err and "contexts encoded on first use" in err
    assert "encoder:" not in err and "contexts/s" not in err  # no model runs in a lazy ingest
    quiet = run(*args, "--index", tmp_path / "b", "--json")
    assert quiet.exit_code == 0 and quiet.stderr == ""  # --json: no bar
    summary = json.loads(quiet.stdout)
    assert summary["contexts_mode"] == "lazy" and summary["text_chars"] > 0 and summary["contexts"] == 0
