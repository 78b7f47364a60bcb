"""The CLI: ingest, add, query, stats, demo through click's runner; exit codes and one-line errors."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.ingest.sentences import SPLITTER


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)


def one_line_error(result: Result, code: int = 1) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 or code == 2, result.output
    return lines[-1]


def test_ingest_query_stats_round_trip(base_config: Config, corpus: Path, tmp_path: Path) -> None:
    index = tmp_path / "idx"
    common = ["--index", index, "--device", "cpu"]
    r = run(
        *("ingest", "wiki", corpus, "--model", base_config.model, "--max-length", "64", "--no-progress"),
        *("--contexts", "eager", *common),
    )
    assert r.exit_code == 0, r.output
    assert r.output.startswith(
        "ingested 20 articles (0 replaced, 0 already stored, 0 empty skipped, 0 duplicate ids):"
        " 60 sentences, 500 contexts"
    )

    r = run("stats", "--index", index, "--json")
    stats = json.loads(r.output)
    assert (stats["articles"], stats["sentences"], stats["contexts"]) == (20, 60, 500)
    assert stats["meta"]["model"] == str(Path(base_config.model).resolve()) and stats["meta"]["layer"] == 11
    assert stats["meta"]["splitter"] == SPLITTER
    r = run("stats", "--index", index)
    assert f"splitter          {SPLITTER}" in r.output

    r = run(
        "query",
        "Zorblat was born in [MASK].",
        "--subject",
        "Zorblat",
        "--temperature",
        "1",
        "--json",
        *common,
    )
    answer = json.loads(r.output)
    assert answer["bert_knn"][0]["word"] == "quenton"
    assert answer["articles"] == [{"id": "100", "title": "Zorblat", "score": None, "popularity": None}]
    assert len(answer["bert"]) == 10 and answer["n_neighbors"] == 25

    r = run("query", "Zorblat was born in [MASK].", "--subject", "Zorblat", "--top", "3", *common)
    assert r.exit_code == 0
    assert "articles: Zorblat [own article]" in r.output and "BERT-kNN" in r.output
    assert "Zorblat was born in [Quenton]." in r.output  # the evidence, with the answer marked

    r = run("stats", "--index", index)
    assert "contexts          500" in r.output and "bytes per context" in r.output
    # The text says what the JSON says, in the JSON's words; 64 is the tiny model's own limit.
    assert f"dim               {stats['meta']['dim']}\n" in r.output
    assert "max length        64 (capped at the model's limit)\n" in r.output
    assert stats["model_max_length"] == 64


def test_batch_questions_from_stdin(built_index: Config) -> None:
    lines = "Zorblat was born in [MASK].\tZorblat\nMirvane was born in [MASK].\tMirvane\n\n"
    r = run("query", "--file", "-", "--json", "--temperature", "1", "--index", built_index.index, input=lines)
    answers = [json.loads(line) for line in r.output.splitlines()]
    assert [a["subject"] for a in answers] == ["Zorblat", "Mirvane"]
    assert [a["bert_knn"][0]["word"] for a in answers] == ["quenton", "farrowby"]


def test_add_then_query(index_copy: Config, tmp_path: Path) -> None:
    new = tmp_path / "new.jsonl"
    new.write_text(
        json.dumps({"id": "900", "title": "Gorvash", "text": "Gorvash was born in Yentil."}) + "\n"
    )
    r = run("add", new, "--index", index_copy.index, "--json")
    assert r.stderr == ""  # JSON is for scripts: no progress bar on stderr
    assert json.loads(r.output)["articles"] == 1
    r = run(
        "query", "Gorvash was born in [MASK].", "--subject", "Gorvash", "--json", "--index", index_copy.index
    )
    assert json.loads(r.output)["knn"][0]["word"] == "yentil"


@pytest.mark.reliability
@pytest.mark.parametrize(
    ("question", "message"),
    [
        ("Zorblat was born in Quenton.", "Error: the question must contain exactly one [MASK], found 0"),
        ("[MASK] was born in [MASK].", "Error: the question must contain exactly one [MASK], found 2"),
        ("  ", "Error: the question is empty; write a sentence with one [MASK]"),
    ],
)
def test_bad_questions_are_one_line_errors(built_index: Config, question: str, message: str) -> None:
    line = one_line_error(run("query", question, "--index", built_index.index))
    assert line.startswith(message)


@pytest.mark.reliability
def test_missing_and_corrupt_index(tmp_path: Path) -> None:
    line = one_line_error(run("query", "a [MASK].", "--index", tmp_path / "nope"))
    assert line == f"Error: no index at {tmp_path / 'nope'}; build one with 'bertknn-search ingest wiki'"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "index.sqlite").write_bytes(b"\x00garbage" * 512)
    line = one_line_error(run("stats", "--index", bad))
    assert line.startswith(f"Error: index at {bad} cannot be read")


@pytest.mark.reliability
@pytest.mark.parametrize(
    ("flag", "value"), [("--top", "0"), ("-k", "0"), ("--lambda", "1.5"), ("--n-articles", "0")]
)
def test_out_of_range_flags_exit_2(built_index: Config, flag: str, value: str) -> None:
    r = run("query", "a [MASK].", flag, value, "--index", built_index.index)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert f"Invalid value for '{flag}'" in r.output or "Invalid value for" in r.output


@pytest.mark.reliability
def test_model_mismatch_is_a_clear_error(built_index: Config, tmp_path: Path) -> None:
    from bertknn_search.demo import build_tiny_model

    other = build_tiny_model(tmp_path / "other-model", hidden=32)
    line = one_line_error(run("query", "a [MASK].", "--model", other, "--index", built_index.index))
    assert line.startswith(f"Error: index at {built_index.index} was built with model=")
    assert "drop --model or use another --index" in line
    new = tmp_path / "a.jsonl"
    new.write_text(json.dumps({"id": "1", "title": "t", "text": "x"}) + "\n")
    line = one_line_error(run("add", new, "--model", other, "--index", built_index.index))
    assert "drop --model" in line


def test_demo_runs_offline(tmp_path: Path) -> None:
    r = run("demo", "--dir", tmp_path / "demo", "--no-progress")
    assert r.exit_code == 0, r.output
    assert "ingested 20 articles" in r.output
    assert r.output.count("Q: ") == 3
    # An index left by an older version does not stop the demo: it rebuilds its own index.
    with sqlite3.connect(tmp_path / "demo" / "index" / "index.sqlite") as conn:
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    again = run("demo", "--dir", tmp_path / "demo", "--no-progress")
    assert again.exit_code == 0, again.output
    assert "ingested 20 articles (0 replaced, 0 already stored" in again.output


def test_every_command_has_help_with_an_example() -> None:
    for path in (["ingest"], ["ingest", "wiki"], ["add"], ["query"], ["stats"], ["eval"], ["demo"]):
        r = run(*path, "--help")
        assert r.exit_code == 0 and "Example: bertknn-search" in r.output, path


def help_of(*path: str, option: str) -> str:
    """The help text of one option, joined across click's wrapped lines."""
    text = " ".join(run(*path, "--help").output.split())
    start = text.index(f"{option} ")
    following = [text.find(f" --{o}", start + len(option)) for o in ("device", "batch-size", "index", "help")]
    return text[start : min(i for i in following if i > 0)]


def test_help_names_the_index_defaults_and_the_variables() -> None:
    for path in (["query"], ["add"], ["eval", "run"]):
        layer = help_of(*path, option="--layer")
        assert "the index's" in layer and "11" not in layer, (path, layer)
        assert "env BERTKNN_MODEL" in help_of(*path, option="--model"), path
        assert "env BERTKNN_DEVICE" in help_of(*path, option="--device"), path
    assert "11 for a new index" in help_of("ingest", "wiki", option="--layer")
    assert "OPENSEARCH_VERIFY" in run("stats", "--help").output


def test_ingest_again_takes_the_encoding_settings_from_the_index(
    base_config: Config, corpus: Path, tmp_path: Path
) -> None:
    index = tmp_path / "idx"
    first = run(
        *("ingest", "wiki", corpus, "--model", base_config.model, "--max-length", "64"),
        *(
            "--mask-policy",
            "single-wordpiece-no-stopwords",
            "--device",
            "cpu",
            "--index",
            index,
            "--no-progress",
        ),
    )
    assert first.exit_code == 0, first.output
    # No --model, --mask-policy or --max-length: all come from the index, so nothing is encoded again.
    again = run("ingest", "wiki", corpus, "--index", index, "--device", "cpu", "--no-progress", "--json")
    assert again.exit_code == 0, again.output
    assert (json.loads(again.output)["articles"], json.loads(again.output)["already_stored"]) == (0, 20)
    added = run("add", corpus, "--index", index, "--device", "cpu", "--no-progress", "--json")
    assert (json.loads(added.output)["articles"], json.loads(added.output)["already_stored"]) == (0, 20)
    # Above the model's 64 positions, a request means the model's limit: the same command resumes.
    larger = run("ingest", "wiki", corpus, "--index", index, "--max-length", "128", "--no-progress", "--json")
    assert larger.exit_code == 0, larger.output
    assert json.loads(larger.output)["already_stored"] == 20
    for flag, value in (
        ("--store-dtype", "int8"),
        ("--max-length", "32"),
        ("--mask-policy", "single-wordpiece"),
    ):
        line = one_line_error(run("ingest", "wiki", corpus, "--index", index, flag, value, "--no-progress"))
        name = flag[2:].replace("-", "_")
        assert line.startswith(f"Error: index at {index} was built with {name}=") and f"drop {flag}" in line


@pytest.mark.reliability
def test_query_file_that_is_not_utf8_is_one_line(built_index: Config, tmp_path: Path) -> None:
    bad = tmp_path / "q.txt"
    bad.write_bytes(b"Zorblat was born in [MASK].\t\xe9t\xe9\n")
    line = one_line_error(run("query", "--file", bad, "--index", built_index.index))
    assert line.startswith(f"Error: {bad} is not UTF-8 (invalid continuation byte)")


@pytest.mark.reliability
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"k": "12"}, 'k must be a JSON int, got "12"'),
        ({"n_articles": 2.5}, "n_articles must be a JSON int, got 2.5"),
        ({"use_ir": 1}, "use_ir must be a JSON bool, got 1"),
        ([1, 2], "must hold a JSON object"),
    ],
)
def test_settings_file_of_the_wrong_types_is_one_line(
    built_index: Config, tmp_path: Path, settings: object, message: str
) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(settings))
    line = one_line_error(
        run("query", "Zorblat was born in [MASK].", "--settings", path, "--index", built_index.index)
    )
    assert message in line


def test_flags_win_over_the_settings_file(built_index: Config, tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"use_ir": True, "k": 5}))
    common = ["Zorblat was born in [MASK].", "--settings", path, "--index", built_index.index, "--json"]
    tuned = json.loads(run("query", *common).output)
    assert tuned["n_neighbors"] == 5 and tuned["articles"]
    flagged = json.loads(run("query", *common, "--no-ir", "-k", "7").output)
    assert flagged["n_neighbors"] == 7 and flagged["articles"] == []


def test_model_from_the_variable_is_made_absolute_like_the_flag(
    base_config: Config, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Path(base_config.model)
    monkeypatch.chdir(model.parent)
    index = tmp_path / "idx"
    r = CliRunner(env={"BERTKNN_MODEL": model.name}).invoke(
        main, ["ingest", "wiki", str(corpus), "--index", str(index), "--max-length", "64", "--no-progress"]
    )
    assert r.exit_code == 0, r.output
    # Recorded absolute, the index works from any other directory.
    monkeypatch.chdir(tmp_path)
    assert json.loads(run("stats", "--index", index, "--json").output)["meta"]["model"] == str(
        model.resolve()
    )


@pytest.mark.reliability
def test_model_from_the_variable_must_match_the_index(built_index: Config, tmp_path: Path) -> None:
    from bertknn_search.demo import build_tiny_model

    other = build_tiny_model(tmp_path / "other-model", hidden=32)
    r = CliRunner(env={"BERTKNN_MODEL": str(other)}).invoke(
        main, ["query", "a [MASK].", "--index", str(built_index.index)]
    )
    line = one_line_error(r)
    assert line.startswith(f"Error: index at {built_index.index} was built with model=")
    assert line.endswith(
        f"not {str(other)!r} (from BERTKNN_MODEL); unset BERTKNN_MODEL or use another --index"
    )


def test_a_subject_whose_title_two_articles_share_searches_both(index_copy: Config, tmp_path: Path) -> None:
    new = tmp_path / "new.jsonl"
    new.write_text(
        json.dumps({"id": "900", "title": "ZORBLAT", "text": "Zorblat was born in Yentil."}) + "\n"
    )
    assert run("add", new, "--index", index_copy.index, "--no-progress").exit_code == 0
    question = ["query", "Zorblat was born in [MASK].", "--subject", "Zorblat", "--index", index_copy.index]
    answer = json.loads(run(*question, "--json").output)
    assert [a["id"] for a in answer["articles"]] == ["100", "900"]
    assert "articles: Zorblat (id 100) [own article], ZORBLAT (id 900) [own article]" in run(*question).output
    # N caps them like any IR result: with -n 1 the lowest id alone.
    one = json.loads(run(*question, "--n-articles", "1", "--json").output)
    assert [a["id"] for a in one["articles"]] == ["100"]


def test_settings_file_takes_the_flag_names(built_index: Config, tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"lambda": 1.0, "no-ir": True, "n-articles": 2, "k": 5}))
    common = ["Zorblat was born in [MASK].", "--index", built_index.index, "--json"]
    answer = json.loads(run("query", *common, "--settings", path).output)
    assert answer["n_neighbors"] == 5 and answer["articles"] == []
    assert answer["bert_knn"] == answer["knn"]  # λ = 1: kNN alone
    path.write_text(json.dumps({"lambda": 0.5, "lam": 0.5}))
    line = one_line_error(run("query", *common, "--settings", path))
    assert line == f"Error: settings file {path} sets lam twice; keep one of its keys"
    path.write_text(json.dumps({"lamda": 0.5}))
    line = one_line_error(run("query", *common, "--settings", path))
    assert line.endswith(
        "unknown keys ['lamda']; allowed: n-articles, k, temperature, lambda, distance, no-ir, gate,"
        " gate-thresholds, evidence, budget, budget-s, exact"
    )


# Every float option, with the command that takes it; each refuses NaN and infinities before any work.
FLOAT_OPTIONS = [
    ("query", "--lambda"),
    ("query", "--temperature"),
    ("query", "--gate-threshold"),
    ("query", "--popularity"),
    ("serve", "--temperature"),
    ("serve", "--max-body-mb"),
    ("serve", "--batch-window-ms"),
    ("query", "--budget-s"),
    ("eval ablate", "--temperature"),
    ("eval ablate", "--lambda"),
    ("eval grid", "--grid-lambda"),
    ("eval grid", "--grid-temperature"),
]


@pytest.mark.reliability
@pytest.mark.parametrize(("command", "flag"), FLOAT_OPTIONS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_float_options_refuse_nan_and_infinities(command: str, flag: str, value: str, tmp_path: Path) -> None:
    r = run(*command.split(), flag, value if command != "eval grid" else f"1,{value}", "--index", tmp_path)
    line = one_line_error(r, 2)
    assert f"Invalid value for '{flag}'" in line and "must be a finite number" in line


@pytest.mark.parametrize("value", ["inf", "1e400GB", "nan"])
def test_a_cache_size_of_inf_is_not_a_size(value: str, tmp_path: Path) -> None:
    assert "is not a size" in one_line_error(run("query", "a [MASK].", "--cache-size", value), 2)


@pytest.mark.parametrize(
    ("flags", "check"),
    [
        (["--temperature", "5e-324", "--lambda", "1"], "sharpest"),
        (["--temperature", "1.7976931348623157e308", "--lambda", "0"], "flat"),
        (["--gate", "top1", "--gate-threshold", "-1.7976931348623157e308"], "never"),
        (["--gate", "entropy", "--gate-threshold", "-1.7976931348623157e308"], "always"),
    ],
)
def test_the_extremes_of_each_range_answer(built_index: Config, flags: list[str], check: str) -> None:
    question = ["Zorblat was born in [MASK].", "--subject", "Zorblat"]
    r = run("query", *question, "--json", "--index", built_index.index, *flags)
    assert r.exit_code == 0, r.output
    answer = json.loads(r.output)
    if check == "sharpest":  # all kNN mass on the nearest neighbours' word
        assert answer["knn"][0]["word"] == "quenton" and answer["bert_knn"] == answer["knn"]
    elif check == "flat":
        assert answer["knn"] and answer["bert_knn"] == answer["bert"]
    else:
        assert answer["gate"]["retrieve"] is (check == "always") and bool(answer["knn"]) is (
            check == "always"
        )
