"""The eval commands end to end on the synthetic index; reading the real LAMA layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.eval.reliability import ece
from bertknn_search.query.confidence import FIT_FILE, Fit, shipped


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


def write_calibration_questions(path: Path, facts: list[Fact]) -> Path:
    """Birthplaces as two relations, every other gold another person's town: right and wrong answers in
    both (at --temperature 1), what a fit checked on a left-out relation needs."""
    n = len(facts)
    rows = [
        {
            "question": f"{f.person.title()} was born in [MASK].",
            "answers": [f.city if i % 2 == 0 else facts[(i + 1) % n].city],
            "subject": f.person,
            "relation": "born-a" if i < n // 2 else "born-b",
        }
        for i, f in enumerate(facts)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


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
    assert again.exit_code == 0, again.output
    n = 2 * len(facts)
    assert again.stdout.splitlines()[-1] == (
        f"{n} facts read: {n} scored, 0 skipped; {n} read back from the earlier run in {out}"
        f" (--no-resume starts over); report in {out}"
    )
    # Other settings on the same folder: only what differs, and the flag that starts over.
    changed = CliRunner().invoke(main, [*args, "--temperature", "2", "--no-progress"])
    assert changed.exit_code == 1
    assert changed.output == (
        f"Error: {out} holds results of a run with other settings (--temperature was 1.0, now 2.0);"
        " pass --no-resume to start over there, or use another --out\n"
    )
    fresh = CliRunner().invoke(main, [*args, "--temperature", "2", "--no-progress", "--no-resume"])
    assert fresh.stdout.splitlines()[-1] == f"{n} facts read: {n} scored, 0 skipped; report in {out}"


def test_eval_run_says_when_nothing_is_scored(built_index: Config, tmp_path: Path) -> None:
    questions = tmp_path / "q.jsonl"
    rows = [{"question": "Zorblat was born in [MASK].", "answers": ["unknown"], "relation": "r"}] * 3
    rows += [{"question": "Qqq worked as a [MASK].", "answers": ["poet"], "subject": "Qqq", "relation": "r"}]
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    base = ["eval", "run", "--questions", str(questions), "--index", str(built_index.index), "--no-progress"]
    r = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == (
        "4 facts read: 0 scored, 4 skipped (3 answer-not-one-token, 1 no-article);"
        f" report in {tmp_path / 'out'}"
    )
    assert r.stderr.startswith("warning: no fact was scored, so every P@k is '–'")
    # Scored as wrong, the no-article fact counts: P@k is 0, not '–'.
    wrong = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "wrong"), "--no-article", "wrong"])
    assert "4 facts read: 1 scored, 3 skipped (3 answer-not-one-token)" in wrong.stdout
    assert wrong.stderr == ""
    old = CliRunner().invoke(main, [*base, "--no-article-wrong"])
    assert old.exit_code == 2 and "No such option '--no-article-wrong'" in old.output


def test_eval_compare_offers_only_the_computed_k(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["eval", "compare", str(tmp_path), "-k", "3"])
    assert r.exit_code == 2 and "'3' is not one of '1', '5', '10'" in r.output


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
    assert set(best) == {"n-articles", "k", "temperature", "lambda"} and best["temperature"] in (0.5, 6.0)
    grid = json.loads((tmp_path / "settings.grid.json").read_text())
    score = f"{100 * grid['score']:.1f}%"
    assert r.output.splitlines()[0] == (
        f"best of 16 settings: n-articles {best['n-articles']}, k {best['k']}, temperature"
        f" {best['temperature']:g}, lambda {best['lambda']:g}: BERT-kNN P@1 {score} on 20 of 20 facts"
    )
    if grid["ties"] > 1:  # the rule that picked one of them is said
        assert r.output.splitlines()[1].startswith(f"{grid['ties']} settings tie at this score; the first")
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


def table_rows(text: str, first: str) -> list[list[str]]:
    """The cells of the Markdown table whose header starts with ``first`` (header and rule left out)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_eval_compare_puts_runs_side_by_side(built_index: Config, facts: list[Fact], tmp_path: Path) -> None:
    questions = tmp_path / "q.jsonl"
    write_questions(questions, facts)
    base = ["eval", "run", "--questions", str(questions), "--index", str(built_index.index), "--no-progress"]
    for name, extra in (("with-ir", []), ("no-ir", ["--no-ir"])):
        r = CliRunner().invoke(main, [*base, "--temperature", "1", "--out", str(tmp_path / name), *extra])
        assert r.exit_code == 0, r.output
    table = tmp_path / "ablation.md"
    runs = [str(tmp_path / "with-ir"), str(tmp_path / "no-ir")]
    r = CliRunner().invoke(main, ["eval", "compare", *runs, "--out", str(table)])
    assert r.exit_code == 0, r.output
    assert r.output.startswith(table.read_text())
    settings = {row[0]: row[1:] for row in table_rows(r.output, "Run")}
    model = Path(built_index.model).name
    assert settings == {
        "with-ir": [model, "11", "single-wordpiece", "float16", "yes", "3", "128", "1", "0.3", "20"],
        "no-ir": [model, "11", "single-wordpiece", "float16", "no", "3", "128", "1", "0.3", "20"],
    }
    # A row per relation, then the macro average; columns run x model.
    rows = table_rows(r.output, "Corpus")
    assert [row[:3] for row in rows] == [
        ["q", "born", "10"],
        ["q", "job", "10"],
        ["**q**", "macro (2 rel.)", "20"],
    ]
    header = next(line for line in r.output.splitlines() if line.startswith("| Corpus |"))
    assert header.endswith(
        "| with-ir BERT | with-ir kNN | with-ir BERT-kNN | no-ir BERT | no-ir kNN | no-ir BERT-kNN |"
    )
    reports = {n: json.loads((tmp_path / n / "results.json").read_text()) for n in ("with-ir", "no-ir")}
    expected = []
    for name in ("with-ir", "no-ir"):
        corpus = reports[name]["corpora"][0]
        expected += [f"{100 * corpus['precision'][m]['1']:.1f}" for m in ("bert", "knn", "bert_knn")]
    assert rows[2][3:] == expected
    relation = {s["name"]: s for s in reports["no-ir"]["relations"]}["born"]
    assert rows[0][6:9] == [f"{100 * relation['precision'][m]['1']:.1f}" for m in ("bert", "knn", "bert_knn")]

    # One model: a column per run; LaTeX for the paper; the same numbers as JSON on one line.
    knn = CliRunner().invoke(main, ["eval", "compare", *runs, "--models", "knn", "-k", "10"])
    assert table_rows(knn.output, "Corpus")[2][3:] == [
        f"{100 * reports[n]['corpora'][0]['precision']['knn']['10']:.1f}" for n in ("with-ir", "no-ir")
    ]
    macro = CliRunner().invoke(main, ["eval", "compare", *runs, "--macro-only"])
    assert [row[:2] for row in table_rows(macro.output, "Corpus")] == [["**q**", "macro (2 rel.)"]]
    latex = CliRunner().invoke(main, ["eval", "compare", *runs, "--models", "knn", "--format", "latex"])
    assert r"\begin{tabular}{llrrr}" in latex.output and "q & born & 10 & " in latex.output
    as_json = CliRunner().invoke(
        main, ["eval", "compare", *runs, "--json", "--plot", str(tmp_path / "c.png")]
    )
    assert len(as_json.output.splitlines()) == 1
    doc = json.loads(as_json.output)
    assert [run["name"] for run in doc["runs"]] == ["with-ir", "no-ir"]
    assert (
        doc["rows"][2]["precision"]["no-ir"]["knn"] == reports["no-ir"]["corpora"][0]["precision"]["knn"]["1"]
    )
    assert (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")

    # Two folders of the same name stay two runs, named by their paths.
    (tmp_path / "a").mkdir()
    (tmp_path / "with-ir").rename(tmp_path / "a" / "no-ir")
    r = CliRunner().invoke(main, ["eval", "compare", str(tmp_path / "a" / "no-ir"), str(tmp_path / "no-ir")])
    assert r.exit_code == 0, r.output
    assert [row[0] for row in table_rows(r.output, "Run")] == [
        str(tmp_path / "a" / "no-ir"),
        str(tmp_path / "no-ir"),
    ]


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


def test_eval_grid_tries_the_small_temperatures_small_models_need(
    built_index: Config, facts: list[Fact], tmp_path: Path
) -> None:
    questions = tmp_path / "q.jsonl"
    write_questions(questions, facts[:3])
    settings = tmp_path / "settings.json"
    r = CliRunner().invoke(
        main,
        [
            *("eval", "grid", "--questions", str(questions), "--out", str(settings), "--json"),
            *("--index", str(built_index.index), "--no-progress"),
            *("--grid-n", "1", "--grid-lambda", "0.3", "--grid-k", "8"),
        ],
    )
    assert r.exit_code == 0, r.output
    temperatures = [row["temperature"] for row in json.loads(r.output)["grid"]]
    assert 1.0 in temperatures and 6.0 in temperatures


def test_relations_select_by_id_in_every_eval_command(
    built_index: Config, facts: list[Fact], tmp_path: Path
) -> None:
    questions = tmp_path / "q.jsonl"
    write_questions(questions, facts)
    asked = ["--questions", str(questions), "--index", str(built_index.index), "--no-progress"]
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["eval", "run", *asked, "--relations", "born", "--out", str(out)])
    assert r.exit_code == 0, r.output
    lines = [json.loads(line) for line in (out / "facts.jsonl").read_text().splitlines()]
    assert {line["relation"] for line in lines} == {"born"} and len(lines) == len(facts)
    grid = [*asked, "--grid-n", "1", "--grid-k", "8", "--grid-lambda", "0.3", "--grid-temperature", "1"]
    grid += ["--out", str(tmp_path / "s.json")]
    r = CliRunner().invoke(main, ["eval", "grid", *grid, "--relations", "JOB"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "s.grid.json").read_text())["read"] == len(facts)
    r = CliRunner().invoke(main, ["eval", "warm", *asked, "--relations", "born", "--json"])
    assert r.exit_code == 0, r.output
    for command in (["run", "--out", str(tmp_path / "x")], ["grid", "--out", str(tmp_path / "y")], ["warm"]):
        bad = CliRunner().invoke(main, ["eval", command[0], *asked, *command[1:], "--relations", "born,P19"])
        assert bad.exit_code == 1
        assert bad.output == "Error: unknown relation P19; the data named holds: born, job\n"
    # --relations used to name the templates file: the error points to its new name.
    templates = tmp_path / "relations.jsonl"
    templates.write_text('{"relation": "P19", "template": "[X] was born in [Y] ."}\n')
    old = CliRunner().invoke(main, ["eval", "run", *asked, "--relations", str(templates)])
    assert old.exit_code == 1 and old.output.endswith("goes to --relations-file)\n")


def test_eval_run_writes_a_reliability_diagram_and_the_ece_of_p(
    built_index: Config, facts: list[Fact], tmp_path: Path
) -> None:
    questions = tmp_path / "q.jsonl"
    write_questions(questions, facts)
    out = tmp_path / "out"
    asked = [
        "--questions",
        str(questions),
        "--index",
        str(built_index.index),
        "--no-progress",
        "--out",
        str(out),
    ]
    r = CliRunner().invoke(main, ["eval", "run", *asked, "--json"])
    assert r.exit_code == 0, r.output
    assert (out / "reliability.png").read_bytes().startswith(b"\x89PNG")
    conf = json.loads((out / "results.json").read_text())["meta"]["confidence"]
    lines = [json.loads(line) for line in (out / "facts.jsonl").read_text().splitlines()]
    p = [line["confidence"]["p"] for line in lines]
    hits = [line["ranks"]["bert_knn"] == 1 for line in lines]
    assert conf["answers"] == len(lines) == 2 * len(facts) and conf["ece"] == pytest.approx(
        ece(p, hits), abs=1e-3
    )
    assert sum(b["answers"] for b in conf["reliability"]) == len(lines)
    assert "## Confidence" in (out / "results.md").read_text() and "ECE" in (out / "results.md").read_text()


def test_eval_calibrate_stores_a_fit_that_later_queries_use(
    index_copy: Config, facts: list[Fact], tmp_path: Path
) -> None:
    questions = write_calibration_questions(tmp_path / "q.jsonl", facts)
    index = str(index_copy.index)
    ask = ["query", "Zorblat was born in [MASK].", "--subject", "Zorblat", "--index", index, "--json"]
    ask += [
        "--temperature",
        "1",
    ]  # the tiny model's neighbours tell towns apart at l=1 (as in eval run's test)
    before = json.loads(CliRunner().invoke(main, ask, catch_exceptions=False).output)["confidence"]
    out = tmp_path / "cal"
    common = ["eval", "calibrate", "--questions", str(questions), "--index", index, "--no-progress"]
    common += ["--temperature", "1"]
    # Two small relations are too few to replace the fit in use: it says why and stores nothing.
    r = CliRunner().invoke(main, [*common, "--out", str(tmp_path / "few")])
    stored = index_copy.index / FIT_FILE
    assert r.exit_code == 0 and "fit NOT stored" in r.output and "300 answers" in r.output, r.output
    assert not stored.exists()
    r = CliRunner().invoke(main, [*common, "--force", "--out", str(out)])
    assert r.exit_code == 0, r.output
    fit = Fit.read(stored)
    assert {p.name for p in out.iterdir()} >= {
        "calibration.md",
        "calibration.json",
        FIT_FILE,
        "reliability-left-out.png",
    }
    check = json.loads((out / "calibration.json").read_text())["check"]
    assert set(check["relations"]) == {"born-a", "born-b"} and fit.about["relations"] == ["born-a", "born-b"]
    assert f"Stored in {stored}" in r.output and "AUROC" in r.output
    after = json.loads(CliRunner().invoke(main, ask, catch_exceptions=False).output)["confidence"]
    assert fit != shipped() and after["p"] != before["p"]
    assert (after["votes"], after["neighbours"]) == (before["votes"], before["neighbours"])
    assert after["fit"] == f"stored:{stored}" and before["fit"].startswith("shipped:")
    said = CliRunner().invoke(main, ["stats", "--index", index, "--json"], catch_exceptions=False).output
    assert json.loads(said)["confidence_fit"].startswith(f"stored:{stored}")
    # --reset goes back to the shipped fit, evaluating nothing.
    back = CliRunner().invoke(main, ["eval", "calibrate", "--reset", "--index", index])
    assert back.exit_code == 0 and "shipped fit again" in back.output and not stored.exists()
    again = json.loads(CliRunner().invoke(main, ask, catch_exceptions=False).output)["confidence"]
    assert again == before
    r = CliRunner().invoke(main, [*common, "--force", "--out", str(out)])  # stored again for what follows
    # One relation cannot be checked on a relation left out: a one-line error, no traceback.
    one = CliRunner().invoke(main, [*common, "--relations", "born-a", "--out", str(tmp_path / "one")])
    assert one.exit_code == 1 and one.output.startswith("Error: a fit checked on left-out relations needs")
    assert one.output.count("\n") == 1
