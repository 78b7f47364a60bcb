"""A checkpoint without a masked-LM head (issue 17): kNN alone, BERT marked n/a, never a random head."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from bertknn_search import demo
from bertknn_search.cli import main
from bertknn_search.encoding.encoder import Encoder
from bertknn_search.encoding.heads import model_has_head
from bertknn_search.output import render_answer, to_json
from bertknn_search.query.interpolate import interpolate
from bertknn_search.server.client import answer_from_json

QUESTION = "Zorblat was born in [MASK]."
NO_HEAD = "has no masked-LM head"


@pytest.fixture(scope="session")
def headless_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's encoder saved alone, as a sentence encoder ships (``architectures: BertModel``)."""
    from transformers import BertModel

    out = tmp_path_factory.mktemp("headless") / "tiny-encoder"
    BertModel.from_pretrained(tiny_model).save_pretrained(out)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_model / name).exists():
            shutil.copy(tiny_model / name, out / name)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
    return out


@pytest.fixture(scope="session")
def mislabelled_model(headless_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Encoder-only weights under a config that claims a masked LM: the weights must decide."""
    out = tmp_path_factory.mktemp("mislabelled") / "tiny-encoder"
    shutil.copytree(headless_model, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMaskedLM"]}))
    return out


@pytest.fixture(scope="session")
def headless_index(headless_model: Path, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    index = tmp_path_factory.mktemp("headless-index") / "idx"
    r = run(
        *("ingest", "wiki", corpus, "--model", headless_model, "--max-length", "64", "--no-progress"),
        *("--contexts", "eager", "--index", index, "--device", "cpu"),
    )
    assert r.exit_code == 0, r.output
    return index


def run(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_the_config_or_the_weights_decide_whether_there_is_a_head(
    tiny_model: Path, headless_model: Path, mislabelled_model: Path, tmp_path: Path
) -> None:
    assert Encoder(str(tiny_model), 11, "cpu", 64).has_head
    assert not Encoder(str(headless_model), 11, "cpu", 64).has_head
    # Not from the name or the config alone: a BertForMaskedLM config over weights without cls.predictions.*
    assert not Encoder(str(mislabelled_model), 11, "cpu", 64).has_head
    # stats reads the same from the files, without loading the model.
    assert model_has_head(str(tiny_model)) is True
    assert model_has_head(str(headless_model)) is False
    assert model_has_head(str(mislabelled_model)) is False
    assert model_has_head(str(tmp_path / "absent")) is None


def test_no_p_bert_and_the_same_states_as_the_model_with_its_head(
    tiny_model: Path, headless_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    questions = ["zorblat was born in [MASK] .", "[MASK] is a small town ."]
    states, p_bert = Encoder(str(headless_model), 11, "cpu", 64).query(questions)
    assert p_bert is None  # no distribution from a randomly initialised head
    # The encoder's weights are the same, so are its states: the kNN side is untouched.
    with_head, _ = Encoder(str(tiny_model), 11, "cpu", 64).query(questions)
    np.testing.assert_allclose(states, with_head, atol=1e-4)
    err = capsys.readouterr().err
    assert err.count(NO_HEAD) == 1 and "its config names BertModel" in err


def test_the_load_line_names_the_missing_weights(
    mislabelled_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Encoder(str(mislabelled_model), 11, "cpu", 64).query(["zorblat was born in [MASK] ."])
    err = capsys.readouterr().err
    assert err.count(NO_HEAD) == 1 and "its weights lack cls.predictions." in err


def test_without_p_bert_interpolation_is_knn_alone() -> None:
    p_knn = np.array([0.0, 0.25, 0.75])
    for lam in (0.0, 0.3, 1.0):
        np.testing.assert_array_equal(interpolate(p_knn, None, lam), p_knn)
    np.testing.assert_array_equal(interpolate(np.zeros(3), None, 0.3), np.zeros(3))


def test_query_marks_bert_unavailable_in_json_and_text(headless_index: Path) -> None:
    common = ["--index", headless_index, "--device", "cpu", "--temperature", "1", "--subject", "Zorblat"]
    r = CliRunner().invoke(main, [str(a) for a in ["query", QUESTION, "--json", *common]])
    assert r.exit_code == 0, r.output
    answer = json.loads(r.stdout)
    assert answer["bert"] is None and answer["bert_available"] is False
    assert answer["bert_knn"] == answer["knn"] and answer["bert_knn"][0]["word"] == "quenton"
    assert r.stderr.count(NO_HEAD) == 1  # said once, on stderr, never on stdout
    r = CliRunner().invoke(main, [str(a) for a in ["query", QUESTION, "--top", "3", *common]])
    assert "n/a (no MLM head)" in r.stdout and "quenton" in r.stdout


def test_answer_json_round_trips_through_the_server_client(headless_index: Path) -> None:
    common = ["--index", headless_index, "--device", "cpu", "--subject", "Zorblat", "--json"]
    line = run("query", QUESTION, *common).stdout
    answer = answer_from_json(json.loads(line))
    assert answer.bert is None and not answer.bert_available
    assert json.loads(to_json(answer)) == json.loads(line)
    assert "n/a (no MLM head)" in render_answer(answer, 3)


def test_stats_says_whether_the_model_has_a_head(headless_index: Path, built_index: object) -> None:
    r = run("stats", "--index", headless_index, "--json")
    assert json.loads(r.output)["mlm_head"] is False
    assert "mlm head          no: answers are kNN alone" in run("stats", "--index", headless_index).output
    r = run("stats", "--index", built_index.index, "--json")  # type: ignore[attr-defined]
    assert json.loads(r.output)["mlm_head"] is True


def _facts_file(facts: list[demo.Fact], path: Path) -> Path:
    rows = [
        {"question": f"{f.person.title()} was born in [MASK] .", "answers": [f.city], "subject": f.person}
        for f in facts
    ]
    path.write_text("".join(json.dumps({**r, "relation": "born"}) + "\n" for r in rows), encoding="utf-8")
    return path


def test_eval_reports_and_compare_mark_bert_unavailable(
    headless_index: Path, built_index: object, facts: list[demo.Fact], tmp_path: Path
) -> None:
    questions = _facts_file(facts, tmp_path / "facts.jsonl")
    common = ["--questions", questions, "--device", "cpu", "--temperature", "1", "--no-progress"]
    r = run("eval", "run", *common, "--index", headless_index, "--out", tmp_path / "headless", "--json")
    assert r.exit_code == 0, r.output
    payload = json.loads(r.stdout)
    assert payload["models"] == ["knn", "bert_knn"] and payload["meta"]["unavailable_models"] == ["bert"]
    corpus = payload["corpora"][0]["precision"]
    assert "bert" not in corpus and corpus["knn"] == corpus["bert_knn"] and corpus["knn"]["1"] > 0.5
    markdown = (tmp_path / "headless" / "results.md").read_text(encoding="utf-8")
    assert "BERT is n/a: the model has no masked-LM head" in markdown
    assert "| BERT | kNN | BERT-kNN |" in markdown and "| n/a |" in markdown and "| 0.0 |" not in markdown
    assert (tmp_path / "headless" / "results.png").stat().st_size > 0

    index = built_index.index  # type: ignore[attr-defined]
    r = run("eval", "run", *common, "--index", index, "--out", tmp_path / "with-head", "--no-resume")
    assert r.exit_code == 0, r.output
    r = run("eval", "compare", tmp_path / "with-head", tmp_path / "headless", "--json")
    comparison = json.loads(r.stdout)
    assert [run["unavailable"] for run in comparison["runs"]] == [[], ["bert"]]
    r = run("eval", "compare", tmp_path / "with-head", tmp_path / "headless")
    row = next(line for line in r.stdout.splitlines() if line.startswith("| facts | born"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # with-head BERT, kNN, BERT-kNN, then headless BERT (n/a), kNN, BERT-kNN
    assert cells[3] != "n/a" and cells[6] == "n/a" and "n/a" not in cells[7:]


def test_grid_runs_on_a_model_without_a_head_and_every_lambda_ties(
    headless_index: Path, facts: list[demo.Fact], tmp_path: Path
) -> None:
    questions = _facts_file(facts, tmp_path / "facts.jsonl")
    r = run(
        *("eval", "grid", "--questions", questions, "--index", headless_index, "--device", "cpu"),
        *("--grid-n", "3", "--grid-k", "128", "--grid-temperature", "1", "--grid-lambda", "0.2,0.8"),
        *("--no-progress", "--out", tmp_path / "settings.json", "--json"),
    )
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    # kNN alone: λ changes nothing, and the score is kNN's.
    assert result["ties"] == 2 and result["score"] == 1.0
    assert result["mlm_head"] is False
    r = run(
        *("eval", "grid", "--questions", questions, "--index", headless_index, "--device", "cpu"),
        *("--grid-n", "3", "--grid-k", "128", "--grid-temperature", "1", "--grid-lambda", "0.2,0.8"),
        *("--no-progress", "--out", tmp_path / "settings.json"),
    )
    assert "no masked-LM head: BERT-kNN is kNN alone, so λ changes nothing" in r.output


def test_a_confidence_gate_is_refused_without_a_head(headless_index: Path) -> None:
    # A random head's top-1 probability would decide retrieval at random: one line, non-zero exit.
    args = ["query", QUESTION, "--index", headless_index, "--device", "cpu", "--subject", "Zorblat"]
    r = CliRunner().invoke(main, [str(a) for a in [*args, "--gate", "top1", "--gate-threshold", "0.5"]])
    assert r.exit_code != 0 and "no masked-LM head" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, [str(a) for a in [*args, "--gate", "popularity", "--gate-threshold", "5"]])
    assert r.exit_code == 0, r.output


def test_grid_learns_no_confidence_gate_without_a_head(
    headless_index: Path, facts: list[demo.Fact], tmp_path: Path
) -> None:
    questions = _facts_file(facts, tmp_path / "facts.jsonl")
    r = run(
        *("eval", "grid", "--questions", questions, "--index", headless_index, "--device", "cpu"),
        *("--grid-n", "3", "--grid-k", "128", "--grid-temperature", "1", "--grid-lambda", "0.3"),
        *("--gate", "top1", "--no-progress", "--out", tmp_path / "settings.json", "--json"),
    )
    assert r.exit_code != 0 and "no masked-LM head" in r.output and "Traceback" not in r.output


def test_the_server_says_lambda_is_one_without_a_head(headless_index: Path, headless_model: Path) -> None:
    pytest.importorskip("fastapi", reason="the server needs fastapi (pip install -e '.[test]')")
    from fastapi.testclient import TestClient

    from bertknn_search.config import Config
    from bertknn_search.server.app import ServerSettings, create_app

    config = Config(model=str(headless_model), index=headless_index, device="cpu", max_length=64)
    with TestClient(create_app(ServerSettings(config)), base_url="http://localhost") as client:
        assert client.app.state.batcher.done.wait(120)  # type: ignore[attr-defined]
        defaults = client.get("/stats").json()["server"]["defaults"]
        # BERT-kNN is kNN alone here, whatever --lambda says: the default that applies is 1.
        assert defaults["lambda"] == 1.0 and config.lam == 0.3
