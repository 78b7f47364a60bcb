"""The eval commands end to end on the synthetic index; reading the real LAMA layout."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.demo import Fact


def write_questions(path: Path, facts: list[Fact]) -> None:
    rows = [
        {
            "question": f"{f.person.title()} was born in [MASK].",
            "answers": [f.city],
            "subject": f.person,
            "relation": "born",
        }
        for f in facts
    ] + [
        {"question": f"{f.person.title()} worked as a [MASK].", "answers": [f.job], "relation": "job"}
        for f in facts
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_eval_run_writes_the_report_and_resumes(
    built_index: Config, facts: list[Fact], tmp_path: Path
) -> None:
    questions = tmp_path / "q.jsonl"
    write_questions(questions, facts)
    out = tmp_path / "out"
    args = [
        "eval",
        "run",
        "--questions",
        str(questions),
        "--out",
        str(out),
        "--index",
        str(built_index.index),
    ]
    r = CliRunner().invoke(main, [*args, "--temperature", "1", "--no-progress", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert {p.name for p in out.iterdir()} >= {"results.json", "results.md", "results.png", "facts.jsonl"}
    text = json.dumps(report)
    assert "bert_knn" in text and "born" in text
    lines = [json.loads(line) for line in (out / "facts.jsonl").read_text().splitlines()]
    born = [line for line in lines if line["relation"] == "born"]
    assert len(born) == len(facts)
    # Every invented birthplace is the BERT-kNN top answer (ranks count from 1).
    assert [line["ranks"]["bert_knn"] for line in born] == [1] * len(facts)
    assert [line["top"]["bert_knn"][0] for line in born] == [f.city for f in facts]
    again = CliRunner().invoke(main, [*args, "--temperature", "1", "--no-progress"])
    assert again.exit_code == 0 and f"{2 * len(facts)} facts (0 computed now)" in again.output


def test_eval_grid_writes_settings_the_query_command_reads(
    built_index: Config, facts: list[Fact], tmp_path: Path
) -> None:
    questions = tmp_path / "q.jsonl"
    write_questions(questions, facts)
    settings = tmp_path / "settings.json"
    r = CliRunner().invoke(
        main,
        [
            *("eval", "grid", "--questions", str(questions), "--out", str(settings)),
            *("--index", str(built_index.index), "--no-progress"),
            *(
                "--grid-n",
                "1,3",
                "--grid-lambda",
                "0.3,0.9",
                "--grid-k",
                "8,128",
                "--grid-temperature",
                "0.5,6",
            ),
        ],
    )
    assert r.exit_code == 0, r.output
    best = json.loads(settings.read_text())
    assert set(best) <= {"n_articles", "k", "temperature", "lam"} and best["temperature"] in (0.5, 6.0)
    q = CliRunner().invoke(
        main,
        [
            *("query", "Zorblat was born in [MASK].", "--subject", "Zorblat", "--settings", str(settings)),
            *("--index", str(built_index.index), "--json"),
        ],
    )
    assert q.exit_code == 0, q.output


def test_eval_needs_a_dataset(built_index: Config) -> None:
    r = CliRunner().invoke(main, ["eval", "run", "--index", str(built_index.index)])
    assert r.exit_code == 2 and "name a dataset" in r.output


def test_eval_compare_puts_runs_side_by_side(built_index: Config, facts: list[Fact], tmp_path: Path) -> None:
    questions = tmp_path / "q.jsonl"
    write_questions(questions, facts)
    base = ["eval", "run", "--questions", str(questions), "--index", str(built_index.index), "--no-progress"]
    for name, extra in (("with-ir", []), ("no-ir", ["--no-ir"])):
        r = CliRunner().invoke(main, [*base, "--temperature", "1", "--out", str(tmp_path / name), *extra])
        assert r.exit_code == 0, r.output
    table = tmp_path / "ablation.md"
    r = CliRunner().invoke(
        main, ["eval", "compare", str(tmp_path / "with-ir"), str(tmp_path / "no-ir"), "--out", str(table)]
    )
    assert r.exit_code == 0, r.output
    assert r.output.startswith(table.read_text())
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in r.output.splitlines()[4:] if line}
    assert set(rows) == {"with-ir", "no-ir"}
    assert rows["with-ir"][1:3] == ["11", "yes"] and rows["no-ir"][1:3] == ["11", "no"]
    reports = {n: json.loads((tmp_path / n / "results.json").read_text()) for n in ("with-ir", "no-ir")}
    for name, cells in rows.items():
        corpus = reports[name]["corpora"][0]
        expected = [f"{100 * corpus['precision'][m]['1']:.1f}" for m in ("bert", "knn", "bert_knn")]
        assert [c.strip(" |") for c in cells[3:6]] == expected

    # Two folders of the same name stay two rows, named by their paths.
    (tmp_path / "a").mkdir()
    (tmp_path / "with-ir").rename(tmp_path / "a" / "no-ir")
    r = CliRunner().invoke(main, ["eval", "compare", str(tmp_path / "a" / "no-ir"), str(tmp_path / "no-ir")])
    assert r.exit_code == 0, r.output
    assert len([line for line in r.output.splitlines()[4:] if line]) == 2
    assert str(tmp_path / "a" / "no-ir") in r.output


def test_eval_compare_rejects_a_folder_without_a_report(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["eval", "compare", str(tmp_path)])
    assert r.exit_code == 1
    assert r.output.startswith("Error: ") and "results.json cannot be read" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_eval_compare_writes_into_a_new_folder(
    built_index: Config, facts: list[Fact], tmp_path: Path
) -> None:
    questions = tmp_path / "q.jsonl"
    write_questions(questions, facts[:2])
    run = ["eval", "run", "--questions", str(questions), "--index", str(built_index.index), "--no-progress"]
    assert CliRunner().invoke(main, [*run, "--out", str(tmp_path / "r")]).exit_code == 0
    out = tmp_path / "new" / "folder" / "table.md"
    r = CliRunner().invoke(main, ["eval", "compare", str(tmp_path / "r"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_text().startswith("# BERT-kNN runs compared")
