"""The leave-one-out cloze on the tiny model: whole words scored, single wordpieces' misses counted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.eval.cloze import ClozeResult, cloze, leave_out
from bertknn_search.eval.cloze_targets import Target
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question

# "Quentons" is quenton ##s and "singers" singer ##s in the demo vocabulary: each comes back in other
# sentences of its article, so a whole-word index can answer it from them.
ROWS = [
    {
        "id": "1",
        "title": "Quenton",
        "text": "The Quentons lived in Quenton. Many Quentons were a famous poet. Quentons worked as a"
        " painter in the town. The Quentons moved north.",
    },
    {
        "id": "2",
        "title": "Farrowby",
        "text": "Farrowby is a town of singers. The singers of Farrowby played. Many singers moved to"
        " Farrowby. Singers lived there.",
    },
]
ARTICLES = [(r["id"], r["title"]) for r in ROWS]
POLICIES = ("single-wordpiece", "whole-word")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cloze") / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def indexes(base_config: Config, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Config]:
    out = {}
    for policy in (*POLICIES, "lazy"):
        config = base_config.replace(
            index=tmp_path_factory.mktemp(policy) / "index",
            mask_policy="whole-word" if policy == "lazy" else policy,
            contexts="lazy" if policy == "lazy" else "eager",
            temperature=1.0,
        )
        ingest(corpus, config, progress=False)
        out[policy] = config
    return out


@pytest.fixture(scope="module")
def results(indexes: dict[str, Config]) -> Iterator[dict[str, ClozeResult]]:
    out = {}
    for name, config in indexes.items():
        searcher = Searcher.open(config)
        try:
            out[name] = cloze(searcher, ARTICLES, config, per_kind=5, per_article=3, seed=1)
        finally:
            searcher.close()
    yield out


def places(result: ClozeResult) -> list[tuple[str, int, int, int]]:
    return [(r.target.article_id, r.target.sentence_id, r.target.start, r.target.end) for r in result.results]


def test_both_policies_get_the_same_targets_of_both_kinds(results: dict[str, ClozeResult]) -> None:
    assert places(results["single-wordpiece"]) == places(results["whole-word"]) == places(results["lazy"])
    kinds = [r.target.kind for r in results["whole-word"].results]
    assert kinds.count("single") == 5 and kinds.count("multi") == 5
    multi = {r.target.word.lower() for r in results["whole-word"].results if r.target.kind == "multi"}
    assert multi == {"quentons", "singers"}


def test_whole_word_scores_words_of_several_wordpieces(results: dict[str, ClozeResult]) -> None:
    multi = next(s for s in results["whole-word"].scores if s.kind == "multi")
    assert multi.targets == 5 and multi.no_value == 0
    # Each word comes back in its article's other sentences, so kNN lists it among its top 10.
    assert multi.precision["knn"][10] == 1.0
    assert all(
        r.value is not None and r.value < 0 for r in results["whole-word"].results if r.target.pieces > 1
    )


def test_single_wordpiece_counts_words_of_several_as_misses(results: dict[str, ClozeResult]) -> None:
    multi = next(s for s in results["single-wordpiece"].scores if s.kind == "multi")
    assert multi.targets == 5 and multi.no_value == 5
    assert all(p == {1: 0.0, 10: 0.0} for p in multi.precision.values())
    single = next(s for s in results["single-wordpiece"].scores if s.kind == "single")
    assert single.targets == 5 and single.no_value == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_reachable_means_the_value_is_stored_outside_the_sentence(
    indexes: dict[str, Config], results: dict[str, ClozeResult], policy: str
) -> None:
    """A target is reachable exactly when some context of the articles searched, not of its own
    sentence, holds its value: checked against every context the store returns."""
    searcher = Searcher.open(indexes[policy])
    try:
        for r in results[policy].results:
            t = r.target
            hits = [h.id for h in searcher.retrieve(Question(t.question, t.title))]
            # Keyed as the searcher keys them: a word of several pieces by its own pieces.
            every = searcher.resolve_words(
                searcher.backend.knn(np.zeros(searcher.encoder.dim, np.float32), 10_000, hits)
            )
            elsewhere = any(
                int(every.token_ids[i]) == r.value
                and (every.article_ids[i], int(every.sentence_ids[i])) != (t.article_id, t.sentence_id)
                for i in range(len(every))
            )
            assert r.reachable == elsewhere, t
            if not r.reachable:
                assert r.ranks.get("knn") is None  # kNN cannot name it
    finally:
        searcher.close()
    for score in results[policy].scores:
        assert score.reachable == sum(
            r.reachable and r.target.kind == score.kind for r in results[policy].results
        )
    multi = next(s for s in results[policy].scores if s.kind == "multi")
    assert (multi.reachable > 0) == (policy == "whole-word")


def test_a_lazy_index_answers_as_the_eager_one(results: dict[str, ClozeResult]) -> None:
    """The lazy index encodes the articles drawn whole first: its answers are the eager index's."""
    assert [r.ranks for r in results["lazy"].results] == [r.ranks for r in results["whole-word"].results]


@pytest.mark.parametrize("policy", POLICIES)
def test_the_left_out_sentence_never_answers(
    indexes: dict[str, Config], results: dict[str, ClozeResult], policy: str
) -> None:
    searcher = Searcher.open(indexes[policy])
    try:
        for r in results[policy].results:
            t: Target = r.target
            hits = searcher.retrieve(Question(t.question, t.title))
            assert t.article_id in [h.id for h in hits]
            state = searcher.encode([Question(t.question, t.title)])[0][0]
            kept, dropped = leave_out(searcher, state, hits, t, 4)
            own = [(a, int(s)) for a, s in zip(kept.article_ids, kept.sentence_ids)]
            assert (t.article_id, t.sentence_id) not in own and dropped >= 1
            # Exact: the 4 kept are the 4 nearest of every other context of the articles searched.
            every = searcher.backend.knn(state, 10_000, [h.id for h in hits])
            others = [
                i
                for i in range(len(every))
                if every.sentence_ids[i] != t.sentence_id or every.article_ids[i] != t.article_id
            ]
            assert kept.distances.tolist() == every.distances[others[:4]].tolist()
    finally:
        searcher.close()


def test_cli_prints_json(indexes: dict[str, Config], corpus: Path) -> None:
    args = ["eval", "cloze", "--corpus", str(corpus), "--index", str(indexes["whole-word"].index)]
    r = CliRunner().invoke(main, [*args, "--targets", "3", "--temperature", "1", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["mask_policy"] == "whole-word"
    assert {kind: v["targets"] for kind, v in data["kinds"].items()} == {"single": 3, "multi": 3}
    assert set(data["kinds"]["multi"]["P@1"]) == {"bert", "knn", "bert_knn"}
    table = CliRunner().invoke(main, [*args, "--targets", "3", "--no-progress"])
    assert table.exit_code == 0 and "| several wordpieces | 3 | 0 |" in table.output


def test_cli_refuses_a_corpus_the_index_does_not_hold(indexes: dict[str, Config], tmp_path: Path) -> None:
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "9", "title": "Elsewhere", "text": "Nothing here."}) + "\n")
    args = ["eval", "cloze", "--corpus", str(other), "--index", str(indexes["whole-word"].index)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1
    assert r.output.startswith("Error: none of the corpus's 1 articles is in the index at ")
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
