"""Tests for eval.harness and eval.grid on the synthetic index: agreement with the Searcher, skips, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertknn_search import demo
from bertknn_search.config import Config
from bertknn_search.errors import ConfigError, InputFormatError
from bertknn_search.eval.datasets import Fact
from bertknn_search.eval.grid import grid_search
from bertknn_search.eval.harness import BAD_QUESTION, NOT_IN_COMMON_VOCAB, NOT_ONE_TOKEN, evaluate
from bertknn_search.eval.metrics import NO_ARTICLE, FactResult, macro_average
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question

MODELS = ("bert", "knn", "bert_knn")


def born_facts(facts: list[demo.Fact]) -> list[Fact]:
    """Where each invented person was born, as an evaluation's facts (the answer is one token)."""
    return [
        Fact(
            "Synthetic",
            "born",
            f"{f.person.title()} was born in [MASK] .",
            (f.city,),
            f.person.title(),
            f.person,
        )
        for f in facts
    ]


@pytest.fixture(scope="module")
def scorable(facts: list[demo.Fact]) -> list[Fact]:
    """Two relations over the invented people; every answer is one token of the tiny vocabulary."""
    born = born_facts(facts)
    job = [
        Fact(
            "Synthetic",
            "job",
            f"{f.person.title()} worked as a [MASK] .",
            (f.job,),
            f.person.title(),
            f.person,
        )
        for f in facts
    ]
    return born + job


# Facts that cannot be scored, one per reason.
UNSCORABLE = [
    Fact("Synthetic", "job", "Zorblat is [MASK] .", ("unknown",), "Zorblat", "two-pieces"),  # un ##known
    Fact("Synthetic", "job", "Zorblat is [MASK] .", ("Paris",), "Zorblat", "unk"),  # [UNK] is no answer
    Fact("Synthetic", "job", "Zorblat was [MASK] and [MASK] .", ("poet",), "Zorblat", "two-masks"),
    Fact("Synthetic", "job", "Qqq worked as a [MASK] .", ("poet",), "Qqq", "no-article"),  # IR finds nothing
]


def checkpoint(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_evaluate_ranks_like_the_searcher(
    searcher: Searcher, built_index: Config, scorable: list[Fact], tmp_path
):
    result = evaluate(searcher, scorable, built_index, tmp_path)
    lines = {line["key"]: line for line in checkpoint(result.checkpoint)}
    answers = searcher.answer_batch([Question(f.question, f.subject) for f in scorable])
    for fact, answer in zip(scorable, answers):
        line = lines[fact.key]
        assert line["top"] == {m: [p.word for p in getattr(answer, m)] for m in MODELS}
        assert line["neighbors"] == answer.n_neighbors and line["skipped"] is None
        assert line["ranks"] == {
            m: next((i for i, w in enumerate(line["top"][m], 1) if w == fact.answers[0]), None)
            for m in MODELS
        }
    rows = [FactResult(f.corpus, f.relation, f.uuid, lines[f.key]["ranks"]) for f in scorable]
    assert result.scores == macro_average(rows)
    assert (result.facts, result.computed) == (20, 20)
    assert sorted(result.report) == ["json", "markdown", "plot", "reliability"]
    assert result.report["json"].parent == tmp_path


def test_evaluate_counts_what_it_skips(
    searcher: Searcher, built_index: Config, scorable: list[Fact], tmp_path
):
    result = evaluate(searcher, scorable + UNSCORABLE, built_index, tmp_path)
    job = result.scores.relations[1]
    assert (job.name, job.facts, job.scored, job.no_article) == ("job", 14, 10, 1)
    assert job.skipped == {BAD_QUESTION: 1, NO_ARTICLE: 1, NOT_ONE_TOKEN: 2}
    assert (result.facts, result.scored, result.resumed) == (24, 20, 0)
    assert result.skipped == {BAD_QUESTION: 1, NO_ARTICLE: 1, NOT_ONE_TOKEN: 2}
    lines = {line["key"]: line for line in checkpoint(result.checkpoint)}
    assert len(lines) == 24
    assert (
        lines["Synthetic/job/no-article"]["articles"] == []
        and lines["Synthetic/job/no-article"]["neighbors"] == 0
    )
    # Only the scorable facts enter the means: the same numbers as without the unscorable ones.
    alone = evaluate(searcher, scorable, built_index, tmp_path / "alone")
    assert [s.precision for s in result.scores.relations] == [s.precision for s in alone.scores.relations]
    wrong = evaluate(searcher, scorable + UNSCORABLE, built_index, tmp_path, no_article_wrong=True)
    assert wrong.computed == 0 and wrong.scores.relations[1].scored == 11


def test_evaluate_resumes_after_a_crash(
    searcher: Searcher, built_index: Config, scorable: list[Fact], tmp_path
):
    first = evaluate(searcher, scorable, built_index, tmp_path, batch_size=4)
    path = first.checkpoint
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[:7]) + lines[7][:15], encoding="utf-8")  # a crash mid-write
    again = evaluate(searcher, scorable, built_index, tmp_path, batch_size=4)
    assert (again.computed, again.resumed) == (13, 7)
    assert again.scores == first.scores
    # One whole line per fact again, equal to the uninterrupted run's (lines 8-20 recomputed, in any order).
    assert len(checkpoint(path)) == 20

    # Each line's IR + kNN time ("seconds") is measured afresh; everything else must be equal.
    def timeless(line: dict) -> dict:
        return {k: v for k, v in line.items() if k != "seconds"}

    assert {x["key"]: timeless(x) for x in checkpoint(path)} == {
        x["key"]: timeless(x) for x in map(json.loads, lines)
    }
    assert evaluate(searcher, scorable, built_index, tmp_path).computed == 0
    assert evaluate(searcher, scorable, built_index, tmp_path, resume=False).computed == 20


def test_evaluate_refuses_a_checkpoint_of_other_settings(
    searcher: Searcher, built_index: Config, scorable, tmp_path
):
    evaluate(searcher, scorable[:2], built_index, tmp_path)
    with pytest.raises(ConfigError) as err:
        evaluate(searcher, scorable[:2], built_index.replace(lam=0.5, k=64), tmp_path)
    # Only what differs, named as the flags are, and the flag that starts over.
    assert str(err.value) == (
        f"{tmp_path} holds results of a run with other settings (--lambda was 0.3, now 0.5; -k was 128,"
        " now 64); pass --no-resume to start over there, or use another --out"
    )
    assert (
        evaluate(searcher, scorable[:2], built_index.replace(lam=0.5), tmp_path, resume=False).computed == 2
    )


def test_common_vocab_restricts_answers_and_candidates(
    searcher: Searcher, built_index: Config, scorable, tmp_path
):
    vocab = set(demo.CITIES[:5]) | {"painter", "poet", "the", "."}
    result = evaluate(searcher, scorable, built_index, tmp_path, common_vocab=vocab)
    lines = checkpoint(result.checkpoint)
    kept = {line["uuid"] + "/" + line["relation"] for line in lines if line["skipped"] is None}
    assert kept == {f"{f.uuid}/{f.relation}" for f in scorable if f.answers[0] in vocab}
    assert {w for line in lines for m in MODELS for w in line.get("top", {}).get(m, [])} <= vocab
    skipped = {s.name: s.skipped for s in result.scores.relations}
    assert skipped == {"born": {NOT_IN_COMMON_VOCAB: 5}, "job": {NOT_IN_COMMON_VOCAB: 6}}


def test_grid_search_scores_equal_evaluate(searcher: Searcher, built_index: Config, scorable, tmp_path):
    grid = {"lam": [0.0, 0.3, 1.0], "temperature": [0.5, 6.0], "k": [4, 128]}
    out = tmp_path / "best.json"
    result = grid_search(searcher, scorable + UNSCORABLE, grid, out)
    assert len(result["grid"]) == 12 and (result["facts"], result["read"]) == (20, 24)
    assert result["skipped"] == {BAD_QUESTION: 1, NO_ARTICLE: 1, NOT_ONE_TOKEN: 2}
    assert result["score"] == max(row["score"] for row in result["grid"])
    assert result["ties"] == sum(row["score"] == result["score"] for row in result["grid"]) >= 1
    # The file spells the settings as the flags do.
    best = result["best"]
    assert json.loads(out.read_text(encoding="utf-8")) == {
        "n-articles": best["n_articles"],
        "k": best["k"],
        "temperature": best["temperature"],
        "lambda": best["lam"],
    }
    assert json.loads((tmp_path / "best.grid.json").read_text(encoding="utf-8")) == result
    tuned = built_index.with_settings_file(out)
    assert {key: getattr(tuned, key) for key in result["best"]} == result["best"]
    # λ = 0 is BERT alone: the kNN settings cannot matter.
    assert len({row["score"] for row in result["grid"] if row["lam"] == 0.0}) == 1
    for row in result["grid"][::5]:
        config = built_index.replace(lam=row["lam"], temperature=row["temperature"], k=row["k"])
        scores = evaluate(searcher, scorable + UNSCORABLE, config, tmp_path / str(row)).scores
        assert scores.corpora[0].precision["bert_knn"][1] == pytest.approx(row["score"])


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({"layer": [10]}, r"grid keys \['layer'\] are not tunable here"),
        ({"lam": []}, r"grid key 'lam' has no values"),
        ({"lam": [1.5]}, r"--lambda must be in \[0, 1\], got 1.5"),
    ],
)
def test_grid_search_rejects_bad_grids(searcher: Searcher, scorable, tmp_path, grid, message):
    with pytest.raises(ConfigError, match=message):
        grid_search(searcher, scorable, grid, tmp_path / "best.json")
    assert not (tmp_path / "best.json").exists()


def test_grid_search_needs_a_scorable_fact(searcher: Searcher, tmp_path):
    reasons = r"\(2 answer-not-one-token, 1 bad-question, 1 no-article\)$"
    with pytest.raises(ConfigError, match=r"^no tuning fact could be scored: 4 read, all skipped " + reasons):
        grid_search(searcher, UNSCORABLE, {"lam": [0.3]}, tmp_path / "best.json")


def test_evaluate_reports_a_damaged_checkpoint(searcher: Searcher, built_index: Config, scorable, tmp_path):
    first = evaluate(searcher, scorable[:3], built_index, tmp_path)
    lines = first.checkpoint.read_text(encoding="utf-8").splitlines(keepends=True)
    first.checkpoint.write_text(lines[0] + "{not json\n" + lines[1], encoding="utf-8")
    with pytest.raises(InputFormatError, match=r"facts.jsonl is damaged .*; delete it or pass --no-resume$"):
        evaluate(searcher, scorable[:3], built_index, tmp_path)
