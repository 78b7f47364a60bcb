"""Adaptive retrieval in eval: eval grid learns thresholds; eval run scores each gate beside BERT-kNN."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bertknn_search import demo
from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.eval.datasets import Fact
from bertknn_search.eval.grid import grid_search
from bertknn_search.eval.harness import evaluate
from bertknn_search.query.search import Searcher


@pytest.fixture(scope="module")
def popular_facts(facts: list[demo.Fact]) -> list[Fact]:
    """The invented birthplaces, half of them with famous subjects (popularity 10^6), half obscure (10)."""
    return [
        Fact(
            "PopQA",
            "born",
            f"{f.person.title()} was born in [MASK] .",
            (f.city,),
            f.person.title(),
            f.person,
            popularity=10**6 if i % 2 else 10,
        )
        for i, f in enumerate(facts)
    ]


def test_grid_learns_thresholds_and_eval_run_scores_every_gate(
    searcher: Searcher, built_index: Config, popular_facts: list[Fact], tmp_path: Path
) -> None:
    config = built_index.replace(temperature=1.0)
    grid = {"lam": [0.3], "temperature": [1.0], "k": [128], "n_articles": [3]}
    out = tmp_path / "s.json"
    result = grid_search(searcher, popular_facts, grid, out, config=config, gate="popularity")
    written = json.loads(out.read_text(encoding="utf-8"))
    assert written["gate"] == "popularity" and set(written["gate-thresholds"]) == {
        "popularity",
        "top1",
        "entropy",
    }
    # BERT knows none of the invented facts and kNN finds them all: retrieving always is best.
    born = result["gates"]["popularity"]["born"]
    assert (born["retrieval"], born["accuracy"], born["retrieved"]) == (1.0, 1.0, 1.0)
    assert born["parametric"] < 0.5  # BERT is at chance on them
    tuned = config.with_settings_file(out)
    assert tuned.gate == "popularity"

    # Now thresholds that stop the popular half: the adaptive model is BERT there, BERT-kNN elsewhere.
    gated = tuned.replace(
        gate_thresholds=(("popularity", "born", math.log(1000)), ("top1", "*", 0.0), ("entropy", "*", 1e9))
    )
    run = evaluate(searcher, popular_facts, gated, tmp_path / "run")
    assert run.scores.models == (
        "bert",
        "knn",
        "bert_knn",
        "adaptive_popularity",
        "adaptive_top1",
        "adaptive_entropy",
    )
    p1 = run.scores.corpora[0].precision
    lines = [json.loads(line) for line in run.checkpoint.read_text(encoding="utf-8").splitlines()]
    expected = [line["ranks"]["bert" if line["popularity"] > 1000 else "bert_knn"] == 1 for line in lines]
    assert p1["bert_knn"][1] == 1.0 and p1["adaptive_popularity"][1] == pytest.approx(np.mean(expected))
    assert p1["adaptive_top1"][1] == p1["adaptive_entropy"][1] == p1["bert"][1]  # never retrieve: BERT
    meta = json.loads(run.report["json"].read_text(encoding="utf-8"))["meta"]["adaptive"]
    pop = meta["popularity"]
    assert (pop["chosen"], pop["facts"], pop["retrieved"]) == (True, len(popular_facts), 0.5)
    assert 0 < pop["seconds_saved"] < pop["seconds_retrieval"]
    assert pop["relations"]["born"] == {
        "threshold": math.log(1000),
        "retrieved": 0.5,
        "facts": len(popular_facts),
    }
    assert meta["top1"]["retrieved"] == 0.0 and meta["entropy"]["retrieved"] == 0.0
    text = run.report["markdown"].read_text(encoding="utf-8")
    assert "## Adaptive retrieval" in text and "| popularity (--gate) | 10 | 50.0 |" in text
    assert "| born | 10 | 6.91 | 50.0 | 0 | 0.0 | never | 0.0 |" in text
    assert "Adaptive (popularity)" in text and run.report["popularity_plot"].exists()


def test_eval_rankings_never_list_special_tokens(
    searcher: Searcher, built_index: Config, popular_facts: list[Fact], tmp_path: Path, monkeypatch
) -> None:
    mask = searcher.encoder.tokenizer.mask_token_id
    real = Searcher.encode

    def loud_mask(self: Searcher, questions):  # BERT's most probable token is [MASK] itself
        states, p = real(self, questions)
        p = p.copy()
        p[:, mask] = 0.9
        return states, p

    monkeypatch.setattr(Searcher, "encode", loud_mask)
    run = evaluate(searcher, popular_facts[:4], built_index, tmp_path)
    lines = [json.loads(line) for line in run.checkpoint.read_text(encoding="utf-8").splitlines()]
    assert all("[MASK]" not in line["top"][m] for line in lines for m in ("bert", "bert_knn"))
    assert all(0 < line["signals"]["top1"] < 0.9 for line in lines)  # the gate ignores [MASK] too


def test_eval_cli_reports_the_adaptive_column(built_index: Config, tmp_path: Path) -> None:
    questions = tmp_path / "q.jsonl"
    rows = [
        {
            "question": "Zorblat was born in [MASK] .",
            "answers": ["quenton"],
            "subject": "Zorblat",
            "relation": "born",
        }
    ]
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    settings = tmp_path / "s.json"
    settings.write_text(json.dumps({"gate-thresholds": {"top1": {"*": 0.0}}}), encoding="utf-8")
    r = CliRunner().invoke(
        main,
        [
            "eval",
            "run",
            "--questions",
            str(questions),
            "--index",
            str(built_index.index),
            "--settings",
            str(settings),
            "--temperature",
            "1",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "Adaptive (top-1)" in r.output and "| top1 | 1 | 0.0 |" in r.output
    data = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    assert data["meta"]["settings"]["gate"] == "none"
