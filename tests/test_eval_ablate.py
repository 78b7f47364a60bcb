"""eval ablate: every setting and index evaluated as eval run would, joined in one table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bertknn_search import session
from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.errors import ConfigError
from bertknn_search.eval.ablate import check_variants, variants
from bertknn_search.query.search import Searcher
from tests.test_cli_eval import table_rows, write_questions


def test_variants_are_named_by_what_differs(tmp_path: Path) -> None:
    base = Config(index=tmp_path / "idx")
    found = variants([base], {"temperature": [1.0, 6.0], "use_ir": [True, False], "k": [128]})
    assert [v.name for v in found] == ["l1-ir", "l1-noir", "l6-ir", "l6-noir"]  # k has one value
    assert [(v.config.temperature, v.config.use_ir, v.config.k) for v in found] == [
        (1.0, True, 128),
        (1.0, False, 128),
        (6.0, True, 128),
        (6.0, False, 128),
    ]
    two = variants([base, base.replace(index=tmp_path / "nostop")], {"lam": [0.3]})
    assert [v.name for v in two] == ["idx", "nostop"]
    assert [v.name for v in variants([base], {})] == ["run"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"layer": [10]}, r"cannot vary \['layer'\] without another index"),
        ({"k": []}, r"no values given for \['k'\]"),
        ({"lam": [1.5]}, "lam"),
    ],
)
def test_variants_reject_what_cannot_be_run(values: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        variants([Config(index=tmp_path / "idx")], values)


def test_indexes_need_distinct_names(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="folders of different names"):
        variants([Config(index=tmp_path / "a" / "idx"), Config(index=tmp_path / "b" / "idx")], {})


def test_no_ir_on_a_lazy_index_is_refused_before_anything_runs(tmp_path: Path) -> None:
    found = variants([Config(index=tmp_path / "idx", contexts="lazy")], {"use_ir": [True, False]})
    with pytest.raises(
        ConfigError, match=r"^run noir searches every context .* is lazy and not every article is encoded"
    ):
        check_variants(found)


def test_eval_ablate_runs_every_setting_as_eval_run_does(
    built_index: Config, facts: list[Fact], tmp_path: Path
) -> None:
    questions = tmp_path / "q.jsonl"
    write_questions(questions, facts)
    index = ["--index", str(built_index.index), "--no-progress"]
    out = tmp_path / "ablation"
    args = ["eval", "ablate", "--questions", str(questions), *index, "--out", str(out)]
    r = CliRunner().invoke(main, [*args, "--temperature", "1,6", "--ir", "on,off", "--relations", "born"])
    assert r.exit_code == 0, r.output
    names = ["l1-ir", "l1-noir", "l6-ir", "l6-noir"]
    assert [row[0] for row in table_rows(r.output, "Run")] == names
    files = ", ".join(str(out / f"ablation.{ext}") for ext in ("md", "json", "png"))
    assert r.output.splitlines()[-1] == f"4 runs in {out}; table and plot: {files}"
    # Each run is the report 'eval run' writes with those settings.
    single = tmp_path / "single"
    run = ["eval", "run", "--questions", str(questions), *index, "--relations", "born", "--out", str(single)]
    assert CliRunner().invoke(main, [*run, "--temperature", "6", "--no-ir"]).exit_code == 0
    mine = json.loads((out / "l6-noir" / "results.json").read_text())
    theirs = json.loads((single / "results.json").read_text())
    assert mine["relations"] == theirs["relations"] and mine["corpora"] == theirs["corpora"]
    # The table is 'eval compare' of the run folders; the plot is drawn.
    compare = CliRunner().invoke(main, ["eval", "compare", *(str(out / n) for n in names)])
    assert (out / "ablation.md").read_text() == compare.output.rstrip("\n") + "\n"
    assert (out / "ablation.png").read_bytes().startswith(b"\x89PNG")
    assert [row["name"] for row in json.loads((out / "ablation.json").read_text())["rows"]] == ["born", "q"]


def test_eval_ablate_compares_store_choices_across_indexes(
    built_index: Config, corpus: Path, facts: list[Fact], tmp_path: Path
) -> None:
    nostop = tmp_path / "nostop"
    r = CliRunner().invoke(
        main,
        [
            *("ingest", "wiki", str(corpus), "--model", built_index.model, "--index", str(nostop)),
            *("--contexts", "eager", "--max-length", "64", "--mask-policy", "single-wordpiece-no-stopwords"),
            "--no-progress",
        ],
    )
    assert r.exit_code == 0, r.output
    questions = tmp_path / "q.jsonl"
    write_questions(questions, facts)
    r = CliRunner().invoke(
        main,
        [
            *("eval", "ablate", "--questions", str(questions), "--index", str(built_index.index)),
            *("--index", str(nostop), "--temperature", "1", "--models", "knn", "--out", str(tmp_path / "a")),
            "--no-progress",
        ],
    )
    assert r.exit_code == 0, r.output
    runs = {row[0]: row for row in table_rows(r.output, "Run")}
    assert set(runs) == {built_index.index.name, "nostop"}
    assert runs["nostop"][3] == "single-wordpiece-no-stopwords"
    assert runs[built_index.index.name][3] == "single-wordpiece"
    header = next(line for line in r.output.splitlines() if line.startswith("| Corpus |"))
    assert header == f"| Corpus | Relation | Facts | {built_index.index.name} | nostop |"


def test_eval_ablate_refuses_no_ir_on_a_lazy_index_until_it_is_encoded_whole(
    tiny_model: Path, corpus: Path, tmp_path: Path
) -> None:
    """Refused in one line while an article is not encoded; once every article is, the no-IR run searches
    the whole store as on an eager index."""
    lazy = tmp_path / "lazy"
    made = CliRunner().invoke(
        main,
        ["ingest", "wiki", str(corpus), "--model", str(tiny_model), "--index", str(lazy), "--no-progress"],
    )
    assert made.exit_code == 0, made.output
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question": "Zorblat was born in [MASK].", "answers": ["x"]}) + "\n")
    ablate = ["eval", "ablate", "--questions", str(questions), "--index", str(lazy), "--ir", "on,off"]
    r = CliRunner().invoke(main, [*ablate, "--out", str(tmp_path / "x")])
    assert r.exit_code == 1
    assert r.output.startswith("Error: run noir searches every context (no IR), but the index at")
    assert "not every article is encoded" in r.output
    assert len(r.output.splitlines()) == 1
    assert not (tmp_path / "x").exists()

    searcher = Searcher.open(session.open_index({"index": lazy}).config)
    try:
        ids = [hit.id for hit in searcher.backend.list_titles("", 10_000)]
        searcher.backend.ensure_contexts(ids)
        held = searcher.backend.stats()
    finally:
        searcher.close()
    assert held.encoded_articles == held.articles > 0
    r = CliRunner().invoke(main, [*ablate, "--out", str(tmp_path / "x"), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert {row[0] for row in table_rows(r.output, "Run")} == {"ir", "noir"}
