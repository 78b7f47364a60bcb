"""Stored confidence fits are validated and bounded (issue 51.3): one line naming the file and what to do."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.errors import ConfigError
from bertknn_search.query.confidence import FIT_FILE, Fit, describe_fit, fit_and_name, reset_fit, shipped
from bertknn_search.query.fit_files import MAX_BYTES


def stored(tmp_path: Path, text: str) -> Path:
    path = tmp_path / FIT_FILE
    path.write_text(text, encoding="utf-8")
    return path


def good() -> dict:  # type: ignore[type-arg]
    return shipped().as_json()


def with_(**changes: object) -> str:
    data = good()
    data.update(changes)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (with_(intercept=float("nan")), "NaN is not a number"),
        (with_(coef=[float("inf")] * len(good()["coef"])), "Infinity is not a number"),
        (with_(intercept=12345.5).replace("12345.5", "1e400"), "not finite"),
        (with_(scale=[0.0] * len(good()["scale"])), "a zero scale"),
        (with_(high=0.1, medium=0.5), "bands out of order"),
        (with_(curve=[[0.0, 0.5], [1.0, 0.2]]), "does not rise"),
        (with_(mean=[1.0]), "lists of different sizes"),
        (with_(features=["votes_of_mars"] * len(good()["features"])), "unknown features"),
        ('{"a":' * 20_000, "nested"),  # 100 KB: json.loads would recurse past Python's limit
        ("[" + ",".join(["0"] * 3000) + "]", "at most"),
        (with_(curve=[[0.0, 0.0]] * 3000), "3,000 items"),
        ("[1, 2]", "not a JSON object"),
        ("{not json", "not JSON"),
        (json.dumps({"format": 1}), "no 'features'"),
    ],
)
def test_a_bad_fit_is_one_line_naming_the_file_and_the_way_back(tmp_path: Path, text: str, said: str) -> None:
    path = stored(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        Fit.read(path)
    message = str(caught.value)
    assert said in message and str(path) in message and "\n" not in message
    assert f"eval calibrate --reset --index {tmp_path}" in message
    assert describe_fit(tmp_path, None, "knn").startswith("refused: ")


def test_a_huge_fit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / FIT_FILE
    with path.open("wb") as handle:  # sparse: 1 GB that costs no disk
        handle.truncate(1 << 30)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=f"over the {MAX_BYTES:,} a fit may have"):
        Fit.read(path)
    assert time.perf_counter() - start < 1.0


def test_the_shipped_fit_is_chosen_by_model_and_method_and_reset_goes_back(tmp_path: Path) -> None:
    fit, name = fit_and_name(tmp_path, "/models/all-MiniLM-L6-v2", "knn")
    assert name == "shipped:confidence_fit.json" and fit == shipped()
    # BERT-base's BERT-kNN answers get their own fit, as do another model's interpolated answers (the
    # nearest there is); any model's kNN-alone answers get MiniLM's.
    bert, name = fit_and_name(tmp_path, "/cache/models/bert-base-uncased", "interpolated")
    assert name == "shipped:confidence_fit_bert_knn.json" and bert != shipped()
    assert bert.about["applies_to"] == {"methods": ["interpolated"], "models": ["bert-base-uncased"]}
    assert (
        fit_and_name(tmp_path, "/cache/models/bert-base-uncased", "knn")[1] == "shipped:confidence_fit.json"
    )
    assert fit_and_name(tmp_path, "/cache/models/roberta", "interpolated")[1].endswith("_bert_knn.json")
    assert fit_and_name(tmp_path, "/cache/models/roberta", "knn")[1] == "shipped:confidence_fit.json"
    # BERT's answers alone (λ = 0): p is BERT's own top-1 probability, with the bands checked on it.
    alone, name = fit_and_name(tmp_path, "/cache/models/bert-base-uncased", "bert")
    assert name == "shipped:confidence_fit_bert.json" and alone.p_from == "top1"
    assert alone.about["applies_to"] == {"methods": ["bert"], "models": ["bert-base-uncased"]}
    model = Fit.from_json(good(), "test")
    model.save(tmp_path / FIT_FILE)
    assert fit_and_name(tmp_path, None, "knn") == (model, f"stored:{tmp_path / FIT_FILE}")
    assert "removed" in reset_fit(tmp_path) and not (tmp_path / FIT_FILE).exists()
    assert "already use the shipped fit" in reset_fit(tmp_path)


def test_query_over_an_index_with_a_bad_fit_is_one_line(index_copy: Config) -> None:
    # Issue 51.3: 100,000 nested '{"a":' gave query a RecursionError traceback.
    (index_copy.index / FIT_FILE).write_text('{"a":' * 20_000, encoding="utf-8")
    ask = ["query", "Zorblat was born in [MASK].", "--index", str(index_copy.index)]
    r = CliRunner().invoke(main, ask)
    assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
    assert r.output.startswith(f"Error: confidence fit {index_copy.index / FIT_FILE} is refused: nested")
    assert "eval calibrate --reset" in r.output
    said = CliRunner().invoke(main, ["stats", "--index", str(index_copy.index), "--json"]).output
    assert json.loads(said)["confidence_fit"].startswith("refused: ")
