"""Adaptive retrieval: thresholds learned as PopQA does, and gates that must and must not retrieve."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.errors import ConfigError
from bertknn_search.ingest.pipeline import add_articles, ingest
from bertknn_search.query.gates import ALWAYS, confidence, learn_thresholds, retrieves
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question
from tests.test_eval_datasets import write_jsonl

KB = Question("Zorblat was born in [MASK].", "Zorblat")


def test_thresholds_retrieve_below_the_edge_that_maximises_adaptive_accuracy() -> None:
    # Retrieval is right for the two long-tail facts only; BERT for the two popular ones.
    logs = [0.0, 1.0, 9.0, 10.0]
    result = learn_thresholds(
        "popularity", logs, ["r"] * 4, [False, False, True, True], [True, True, False, False]
    )
    row = result["r"]
    # Edges 0, 1, ..., 10: edges 2..9 all give 4/4; the lowest (least retrieval) wins.
    assert (row["threshold"], row["accuracy"], row["retrieved"]) == (2.0, 1.0, 0.5)
    assert (row["parametric"], row["retrieval"], row["facts"]) == (0.5, 0.5, 4)
    assert result["*"]["threshold"] == 2.0  # the pooled threshold, for relations not seen on dev


def test_thresholds_can_say_always_and_never() -> None:
    logs = [1.0, 2.0, 3.0]
    always = learn_thresholds("popularity", logs, ["r"] * 3, [False] * 3, [True] * 3)["r"]
    assert (always["threshold"], always["retrieved"]) == (ALWAYS, 1.0)
    never = learn_thresholds("popularity", logs, ["r"] * 3, [True] * 3, [False] * 3)["r"]
    assert (never["threshold"], never["retrieved"], never["accuracy"]) == (1.0, 0.0, 1.0)


def test_entropy_retrieves_above_its_threshold_and_unknown_values_retrieve() -> None:
    assert retrieves("entropy", 2.0, 1.0) and not retrieves("entropy", 0.5, 1.0)
    assert retrieves("top1", 0.2, 0.5) and not retrieves("top1", 0.9, 0.5)
    assert retrieves("popularity", None, 3.0) and retrieves("popularity", 9.0, None)
    # Entropy thresholds are learned the other way round: uncertain facts (high entropy) retrieve.
    result = learn_thresholds(
        "entropy", [0.1, 0.2, 3.0, 4.0], ["r"] * 4, [True, True, False, False], [False] * 2 + [True] * 2
    )
    assert result["r"]["accuracy"] == 1.0 and result["r"]["retrieved"] == 0.5


def test_confidence_ignores_special_tokens() -> None:
    p = np.array([[0.6, 0.3, 0.1, 0.0]])
    answerable = np.array([False, True, True, True])
    found = confidence(p, answerable)
    assert found["top1"][0] == pytest.approx(0.3)
    q = np.array([0.75, 0.25])
    assert found["entropy"][0] == pytest.approx(-(q * np.log(q)).sum())


def test_a_gate_without_thresholds_is_refused() -> None:
    with pytest.raises(ConfigError, match="--gate popularity has no thresholds"):
        Config(gate="popularity")
    with pytest.raises(ConfigError, match="--gate-threshold needs --gate"):
        Config().with_gate_threshold("none", 3.0)


def _no_retrieval(monkeypatch: pytest.MonkeyPatch, searcher: Searcher) -> None:
    """Make any IR or kNN call fail: a question the gate stops must never reach them."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        if args == ([],):  # the batch's lazy-encoding call, with no article to encode
            return 0
        raise AssertionError("IR or kNN ran for a question the gate stopped")

    for name in ("find_titles", "search_articles", "knn", "ensure_contexts"):
        monkeypatch.setattr(searcher.backend, name, refuse)


def test_popularity_gate_skips_ir_and_knn_for_popular_subjects(
    searcher: Searcher, built_index: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    gated = built_index.with_gate_threshold("popularity", math.log(1000))
    rare = searcher.score_batch([Question(KB.text, KB.subject, popularity=10)], gated)[0]
    assert rare.retrieved and rare.hits and len(rare.neighbors) > 0
    assert rare.gate is not None and rare.gate.value == pytest.approx(math.log(10))
    _no_retrieval(monkeypatch, searcher)
    popular = searcher.score_batch([Question(KB.text, KB.subject, popularity=10**6)], gated)[0]
    assert not popular.retrieved and popular.hits == [] and len(popular.neighbors) == 0
    np.testing.assert_array_equal(popular.p, popular.p_bert.astype(np.float64))  # BERT-kNN is BERT
    assert popular.seconds == 0.0


def test_relation_thresholds_win_over_the_pooled_one(searcher: Searcher, built_index: Config) -> None:
    gated = built_index.replace(
        gate="popularity", gate_thresholds=(("popularity", "*", 1.0), ("popularity", "born", 20.0))
    )
    born = Question(KB.text, KB.subject, popularity=100, relation="born")
    other = Question(KB.text, KB.subject, popularity=100, relation="job")
    found = searcher.score_batch([born, other], gated)
    assert [s.retrieved for s in found] == [True, False]
    assert [s.gate.threshold for s in found if s.gate] == [20.0, 1.0]


POP_ROWS = [
    {"id": "1", "title": "Zorblat", "text": "Zorblat was born in Quenton.", "popularity": 50000},
    {"id": "2", "title": "Mirvane", "text": "Mirvane was born in Oskavel."},
]


@pytest.mark.parametrize("backend", ["embedded", "opensearch", "elasticsearch"])
def test_every_backend_stores_an_articles_popularity(
    base_config: Config, tmp_path: Path, backend: str, make_cluster_config: Any
) -> None:
    config = base_config.replace(index=tmp_path / "idx")
    if backend != "embedded":
        config = make_cluster_config(backend)
    ingest(write_jsonl(tmp_path / "pop.jsonl", POP_ROWS), config, progress=False)
    assert_pop_rows_popularity(config)


def assert_pop_rows_popularity(config: Config) -> None:
    """The index holds POP_ROWS' popularity: Zorblat's, and none for Mirvane."""
    from bertknn_search.backends import open_backend

    store = open_backend(config)
    try:
        assert [h.popularity for h in store.find_titles("Zorblat", 3)] == [50000.0]
        assert [h.popularity for h in store.find_titles("mirvane", 3)] == [None]
    finally:
        store.close()


def test_popularity_comes_from_the_subjects_article(base_config: Config, tmp_path: Path) -> None:
    config = base_config.replace(index=tmp_path / "idx")
    ingest(write_jsonl(tmp_path / "pop.jsonl", POP_ROWS), config, progress=False)
    gated = config.with_gate_threshold("popularity", math.log(1000))
    s = Searcher.open(gated)
    try:
        popular, unknown = s.score_batch(
            [
                Question("Zorblat was born in [MASK].", "Zorblat"),
                Question("Mirvane was born in [MASK].", "Mirvane"),
            ]
        )
        given = s.score_batch([Question("Zorblat was born in [MASK].", "Zorblat", popularity=3)])[0]
    finally:
        s.close()
    assert popular.gate and popular.gate.value == pytest.approx(math.log(50000)) and not popular.retrieved
    assert (
        unknown.gate and unknown.gate.value is None and unknown.retrieved and unknown.hits
    )  # unknown: retrieve
    assert given.retrieved  # the question's own popularity wins over the article's


@pytest.mark.parametrize("signal", ["top1", "entropy"])
def test_confidence_gates_must_and_must_not_retrieve(
    searcher: Searcher, built_index: Config, signal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = searcher.score_batch([KB], built_index.with_gate_threshold(signal, 0.5))[0].gate.value  # type: ignore[union-attr]
    unsure, sure = (value + 1e-3, value - 1e-3) if signal == "top1" else (value - 1e-3, value + 1e-3)
    found = searcher.score_batch([KB], built_index.with_gate_threshold(signal, unsure))[0]
    assert found.retrieved and len(found.neighbors) > 0
    _no_retrieval(monkeypatch, searcher)
    found = searcher.score_batch([KB], built_index.with_gate_threshold(signal, sure))[0]
    assert not found.retrieved and len(found.neighbors) == 0


def test_query_cli_shows_the_gate(built_index: Config) -> None:
    common = ("--index", str(built_index.index), "--temperature", "1")
    args = (
        "query",
        KB.text,
        "--subject",
        "Zorblat",
        "--gate",
        "popularity",
        "--gate-threshold",
        "5",
        *common,
    )
    r = CliRunner().invoke(main, [*args, "--popularity", "1000000"])
    assert r.exit_code == 0, r.output
    assert "gate: log popularity 13.816 >= 5.000, not retrieved: no IR, no kNN; BERT-kNN is BERT" in r.output
    assert "articles:" not in r.output and "neighbours: 0" in r.output
    r = CliRunner().invoke(main, [*args, "--popularity", "10", "--json"])
    answer = json.loads(r.output)
    assert answer["gate"] == {
        "signal": "popularity",
        "value": math.log(10),
        "threshold": 5.0,
        "retrieve": True,
    }
    assert answer["bert_knn"][0]["word"] == "quenton"
    r = CliRunner().invoke(main, ["query", KB.text, "--gate", "top1", *common])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.output.strip().endswith("give --gate-threshold")


def test_settings_file_holds_gate_and_thresholds(built_index: Config, tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(
        json.dumps({"gate": "popularity", "gate-thresholds": {"popularity": {"born": 7.5, "*": 6}}}),
        encoding="utf-8",
    )
    tuned = built_index.with_settings_file(path)
    assert tuned.gate == "popularity" and tuned.thresholds("popularity") == {"born": 7.5, "*": 6.0}
    path.write_text(json.dumps({"gate-thresholds": {"fame": {"*": 1}}}), encoding="utf-8")
    with pytest.raises(ConfigError, match="gate-thresholds maps a signal"):
        built_index.with_settings_file(path)


def test_the_server_takes_the_gate_and_each_questions_popularity(built_index: Config) -> None:
    from fastapi.testclient import TestClient

    from bertknn_search.server.app import ServerSettings, create_app

    app = create_app(ServerSettings(built_index.replace(temperature=1.0)))
    with TestClient(app, base_url="http://localhost") as client:
        assert client.app.state.batcher.done.wait(120), "the model did not load"  # type: ignore[attr-defined]
        body = {
            "questions": [
                {"question": KB.text, "subject": "Zorblat", "popularity": 10**6},
                {"question": KB.text, "subject": "Zorblat", "popularity": 10, "relation": "born"},
            ],
            "gate": "popularity",
            "gate-thresholds": {"popularity": {"*": 5.0, "born": 1.0}},
            "evidence": "nearest",
        }
        answers = client.post("/query", json=body).json()["answers"]
        assert [a["gate"]["retrieve"] for a in answers] == [False, False]  # born's own threshold: 1.0
        body["gate-threshold"] = 5.0  # one threshold for every relation
        answers = client.post("/query", json=body).json()["answers"]
        assert [a["gate"]["retrieve"] for a in answers] == [False, True]
        assert answers[1]["bert_knn"][0]["word"] == "quenton" and answers[0]["n_neighbors"] == 0
        bad = client.post("/query", json={**body, "gate": "fame"})
        assert bad.status_code == 422


def test_an_index_built_before_article_popularity_still_opens(index_copy: Config) -> None:
    import sqlite3

    from bertknn_search.backends.embedded.backend import EmbeddedBackend

    db = sqlite3.connect(index_copy.index / "index.sqlite")
    db.execute("DROP TABLE popularity")  # as an index of the previous release has it
    db.commit()
    db.close()
    store = EmbeddedBackend.open(index_copy.index)  # writable here: the table is added back
    try:
        assert [h.popularity for h in store.find_titles("Zorblat", 3)] == [None]
    finally:
        store.close()
    db = sqlite3.connect(index_copy.index / "index.sqlite")
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'popularity'").fetchone() == (
        "popularity",
    )
    db.close()


def test_an_engine_index_made_before_popularity_takes_one(
    tmp_path: Path, cluster_config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bertknn_search.backends.engines import bodies

    config = cluster_config
    without, with_it = POP_ROWS[1:], POP_ROWS[:1]
    real = bodies.load_mapping

    def before_popularity(kind: str) -> dict[str, Any]:
        body = real(kind)
        body["mappings"]["properties"].pop("popularity", None)
        return body

    # The index as an older version made it: a strict articles mapping without the field.
    with monkeypatch.context() as patch:
        patch.setattr(bodies, "load_mapping", before_popularity)
        ingest(write_jsonl(tmp_path / "old.jsonl", without), config, progress=False)
    add_articles(write_jsonl(tmp_path / "new.jsonl", with_it), config, progress=False)
    assert_pop_rows_popularity(config)
