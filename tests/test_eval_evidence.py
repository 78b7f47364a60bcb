"""eval corpus: LAMA's evidence sentences as a corpus that ingest wiki reads, one article per subject."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.errors import ConfigError
from bertknn_search.eval.evidence import evidence_files, write_evidence_corpus
from tests.test_eval_datasets import google_line, trex_line, write_jsonl


@pytest.fixture
def lama(tmp_path: Path) -> Path:
    root = tmp_path / "lama"
    born = trex_line("t1", "Zorblat", "Quenton", "P19") | {"sub_uri": "Q1"}
    born["evidences"].append({"masked_sentence": "Zorblat left [MASK] at ten.", "obj_surface": "Quenton"})
    write_jsonl(root / "TREx" / "P19.jsonl", [born])
    # Zorblat again in another relation, with the same sentence once more: one article, each sentence once.
    job = trex_line("t2", "Zorblat", "painting", "P101") | {"sub_uri": "Q1"}
    job["evidences"].append({"masked_sentence": "Zorblat left [MASK] at ten.", "obj_surface": "Quenton"})
    write_jsonl(root / "TREx" / "P101.jsonl", [job, trex_line("t3", "Mirvane", "farming", "P101")])
    google = google_line("g1", "Khatchig Mouradian", "Lebanon", ["yes"]) | {"sub": "/m/0abc"}
    write_jsonl(root / "Google_RE" / "place_of_birth_test.jsonl", [google])
    return root


def read_corpus(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_one_article_per_subject_across_relations(lama: Path, tmp_path: Path) -> None:
    files = evidence_files(lama)
    assert [r for r, _ in files] == ["place_of_birth", "P19", "P101"]
    summary = write_evidence_corpus(files, tmp_path / "out" / "corpus.jsonl")
    rows = read_corpus(summary.out)
    assert [(r["id"], r["title"]) for r in rows] == [
        ("/m/0abc", "Khatchig Mouradian"),
        ("Q1", "Zorblat"),
        ("Mirvane", "Mirvane"),
    ]
    assert rows[0]["text"] == "Khatchig Mouradian was raised in Lebanon."
    assert rows[1]["text"].split("\n") == [
        "Zorblat lives in Quenton.",
        "Zorblat left Quenton at ten.",
        "Zorblat lives in painting.",
    ]
    assert (summary.articles, summary.sentences, summary.facts) == (3, 5, 4)
    assert summary.relations == ["place_of_birth", "P19", "P101"]


def test_relations_pick_the_files(lama: Path, tmp_path: Path) -> None:
    assert [r for r, _ in evidence_files(lama, relations=["p101"])] == ["P101"]
    uhn = tmp_path / "uhn"
    write_jsonl(uhn / "TREx_UHN" / "P19.jsonl", [trex_line("u1", "Allan Peiper", "Alexandra", "P19")])
    assert evidence_files(lama, uhn, ["P19"]) == [
        ("P19", lama / "TREx" / "P19.jsonl"),
        ("P19", uhn / "TREx_UHN" / "P19.jsonl"),
    ]
    with pytest.raises(ConfigError) as err:
        evidence_files(lama, relations=["P19", "SQuAD"])
    assert str(err.value) == (
        "unknown relation SQuAD; the relations with evidence sentences are: place_of_birth, P19, P101"
    )
    with pytest.raises(ConfigError, match="name the facts"):
        evidence_files()


def test_eval_corpus_command(lama: Path, tmp_path: Path) -> None:
    out = tmp_path / "corpus.jsonl"
    args = ["eval", "corpus", "--lama", str(lama), "--relations", "P19,place_of_birth", "--out", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == [
        f"wrote 2 articles (3 evidence sentences of 2 facts; relations place_of_birth, P19) to {out}",
        f"next: bertknn-search ingest wiki {out} --model MODEL --index INDEX",
    ]
    as_json = CliRunner().invoke(main, [*args, "--json"])
    assert json.loads(as_json.output) == {
        "articles": 2,
        "sentences": 3,
        "facts": 2,
        "relations": ["place_of_birth", "P19"],
        "out": str(out),
    }
    # The first fact of each relation: the facts 'eval run --per-relation 1' reads.
    first = ["eval", "corpus", "--lama", str(lama), "--relations", "P101", "--per-relation", "1", "--json"]
    assert json.loads(CliRunner().invoke(main, [*first, "--out", str(out)]).output)["facts"] == 1
    assert [row["title"] for row in read_corpus(out)] == ["Zorblat"]
    bad = CliRunner().invoke(
        main, ["eval", "corpus", "--lama", str(lama), "--relations", "P7", "--out", str(out)]
    )
    assert bad.exit_code == 1
    assert bad.output == (
        "Error: unknown relation P7; the relations with evidence sentences are: place_of_birth, P19, P101\n"
    )


def test_real_evidence_corpus_is_what_ingest_reads(
    shared_data: Path, tiny_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "corpus.jsonl"
    r = CliRunner().invoke(
        main,
        ["eval", "corpus", "--lama", str(shared_data / "lama"), "--relations", "P19,P103", "--out", str(out)],
    )
    assert r.exit_code == 0, r.output
    # 944 + 977 facts; five subjects have both relations; 5,113 distinct evidence sentences.
    assert r.output.splitlines()[0] == (
        f"wrote 1,916 articles (5,113 evidence sentences of 1,921 facts; relations P19, P103) to {out}"
    )
    index = tmp_path / "index"
    ingest = CliRunner().invoke(
        main,
        [
            "ingest",
            "wiki",
            str(out),
            "--model",
            str(tiny_model),
            "--index",
            str(index),
            "--no-progress",
            "--json",
        ],
    )
    assert ingest.exit_code == 0, ingest.output
    assert json.loads(ingest.stdout)["articles"] == 1916
    stats = json.loads(CliRunner().invoke(main, ["stats", "--index", str(index), "--json"]).stdout)
    assert stats["articles"] == 1916 and stats["meta"]["contexts"] == "lazy"


def test_uhn_corpus(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "uhn.jsonl"
    r = CliRunner().invoke(
        main,
        [
            *("eval", "corpus", "--lama-uhn", str(shared_data / "lama-uhn"), "--relations", "P19"),
            *("--out", str(out), "--json"),
        ],
    )
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert summary["facts"] == 728 and summary["relations"] == ["P19"]
    assert summary["articles"] == len(read_corpus(out))
