"""Tests for eval.report: the files written, every number in the JSON, the tables and valid PNGs."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import pytest

from bertknn_search.eval.metrics import NO_ARTICLE, FactResult, MacroResult, macro_average
from bertknn_search.eval.report import render_markdown, write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def ranks(bert: int | None, knn: int | None, both: int | None) -> dict[str, int | None]:
    return {"bert": bert, "knn": knn, "bert_knn": both}


@pytest.fixture
def result() -> MacroResult:
    rows = [
        FactResult("T-REx", "P19", "a", ranks(1, None, 2)),
        FactResult("T-REx", "P19", "b", ranks(None, 1, 1)),
        FactResult("T-REx", "P20", "c", skipped="multi-token-answer"),
        FactResult("T-REx", "P20", "d", ranks(6, None, 1)),
        FactResult("Google-RE", "place_of_birth", "e", ranks(None, None, None), skipped=NO_ARTICLE),
        FactResult("Google-RE", "place_of_birth", "f", ranks(3, 1, 1)),
        FactResult("PopQA", "genre", "g", ranks(1, 1, 1), popularity=10.0),
        FactResult("PopQA", "genre", "h", ranks(None, 1, 1), popularity=1000.0),
    ]
    return macro_average(rows)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_write_report_writes_every_file(result: MacroResult, tmp_path: Path):
    out = tmp_path / "report"
    paths = write_report(result, out, meta={"model": "tiny", "lam": 0.3})
    assert paths == {
        "json": out / "results.json",
        "markdown": out / "results.md",
        "plot": out / "results.png",
        "popularity_plot": out / "popularity.png",
    }
    assert sorted(p.name for p in out.iterdir()) == [
        "popularity.png",
        "results.json",
        "results.md",
        "results.png",
    ]
    for name in ("plot", "popularity_plot"):
        width, height = png_size(paths[name])
        assert width > 300 and height > 200
        assert paths[name].stat().st_size > 5000
    assert paths["markdown"].read_text(encoding="utf-8") == render_markdown(result)


def test_results_json_has_every_number(result: MacroResult, tmp_path: Path):
    paths = write_report(result, tmp_path, meta={"model": "tiny"})
    payload = json.loads(paths["json"].read_text(encoding="utf-8"))
    # JSON turns the int keys of P@k into strings; otherwise the payload is the dataclass, number for number.
    assert payload == {"meta": {"model": "tiny"}, **json.loads(json.dumps(dataclasses.asdict(result)))}
    lama = payload["aggregates"][0]
    assert (lama["name"], lama["relations"], lama["scored"], lama["facts"]) == ("LAMA", 3, 4, 6)
    assert lama["precision"]["bert_knn"]["1"] == pytest.approx(5 / 6)
    assert payload["relations"][2]["no_article"] == 1


def test_markdown_tables(result: MacroResult):
    text = render_markdown(result)
    assert [line for line in text.splitlines() if line.startswith("#")] == [
        "# BERT-kNN evaluation",
        "## P@1",
        "## P@5",
        "## P@10",
        "## Skipped facts",
        "## Per relation, P@1",
        "## P@1 by subject popularity",
    ]
    p_at_1 = text.split("## P@1\n\n")[1].split("\n\n")[0]
    assert p_at_1 == "\n".join(
        [
            "| Corpus | Relations | Facts scored | BERT | kNN | BERT-kNN |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
            "| T-REx | 2 | 3/4 | 25.0 | 25.0 | 75.0 |",
            "| Google-RE | 1 | 1/2 | 0.0 | 100.0 | 100.0 |",
            "| PopQA | 1 | 2/2 | 50.0 | 100.0 | 100.0 |",
            "| **LAMA** (T-REx+Google-RE) | 3 | 4/6 | 16.7 | 50.0 | 83.3 |",
        ]
    )
    skipped = text.split("## Skipped facts\n\n")[1].split("\n\n")[0]
    assert skipped == "\n".join(
        [
            "| Corpus | Relation | Facts | Scored | No article | multi-token-answer |",
            "| --- | --- | ---: | ---: | ---: | ---: |",
            "| T-REx | P19 | 2 | 2 | 0 | 0 |",
            "| T-REx | P20 | 2 | 1 | 0 | 1 |",
            "| Google-RE | place_of_birth | 2 | 1 | 1 | 0 |",
            "| PopQA | genre | 2 | 2 | 0 | 0 |",
        ]
    )
    buckets = text.split("## P@1 by subject popularity\n\n")[1].split("\n\n")[1].splitlines()
    assert buckets[2] == "| [2.30, 2.76) | 1 | 100.0 | 100.0 | 100.0 |"
    assert buckets[3] == "| [2.76, 3.22) | 0 | – | – | – |"
    assert buckets[-1] == "| [6.45, 6.91] | 1 | 0.0 | 100.0 | 100.0 |"


def test_report_without_scored_facts_or_popularity(tmp_path: Path):
    result = macro_average([FactResult("SQuAD", "SQuAD", "x", skipped="multi-token-answer")])
    paths = write_report(result, tmp_path)
    assert sorted(paths) == ["json", "markdown", "plot"]
    assert png_size(paths["plot"])[0] > 300
    assert "| SQuAD | 0 | 0/1 | – | – | – |" in paths["markdown"].read_text(encoding="utf-8")
