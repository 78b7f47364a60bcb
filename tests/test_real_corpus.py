"""End to end on real text: LAMA's T-REx evidence sentences as the corpus, LAMA's facts as the questions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bertknn_search.config import Config
from bertknn_search.demo import build_tiny_model
from bertknn_search.eval.datasets import read_lama
from bertknn_search.eval.evidence import evidence_articles, write_jsonl
from bertknn_search.eval.harness import evaluate
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.query.search import Searcher

RELATIONS = ("P19", "P413")  # place of birth; position played on team
PER_RELATION = 40


@pytest.fixture(scope="module")
def lama_subset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    from tests.conftest import SHARED_DATA

    root = SHARED_DATA / "lama"
    if not root.exists():
        pytest.skip(f"shared LAMA data not found at {root}: real-corpus test skipped")
    facts = [f for f in read_lama(root, ["T-REx"]) if f.relation in RELATIONS]
    facts = [f for r in RELATIONS for f in [x for x in facts if x.relation == r][:PER_RELATION]]
    work = tmp_path_factory.mktemp("real")
    # Only the subjects asked about, so the corpus stays small.
    subjects = {f.subject for f in facts}
    rows = [
        a for a in evidence_articles([root / "TREx" / f"{r}.jsonl" for r in RELATIONS]) if a.title in subjects
    ]
    corpus = work / "evidence.jsonl"
    write_jsonl(rows, corpus)
    return corpus, facts


def test_evidence_corpus_groups_sentences_by_subject(lama_subset: tuple[Path, list]) -> None:
    corpus, facts = lama_subset
    text = corpus.read_text(encoding="utf-8")
    assert "[MASK]" not in text
    assert len(text.splitlines()) == len({f.subject for f in facts})


def test_knn_over_real_evidence_beats_a_model_that_knows_nothing(
    lama_subset: tuple[Path, list], tmp_path: Path
) -> None:
    corpus, facts = lama_subset
    words = re.findall(r"\w+", corpus.read_text(encoding="utf-8").lower())
    words += [w for f in facts for w in re.findall(r"\w+", (f.question + " " + " ".join(f.answers)).lower())]
    model = build_tiny_model(tmp_path / "model", words=sorted(set(words)), max_positions=256)
    config = Config(
        model=str(model),
        index=tmp_path / "index",
        device="cpu",
        max_length=256,
        temperature=1.0,
        contexts="eager",
    )
    summary = ingest(corpus, config, progress=False)
    assert summary.articles == len({f.subject for f in facts}) and summary.contexts > 1000
    searcher = Searcher.open(config)
    try:
        result = evaluate(searcher, facts, config, tmp_path / "out")
    finally:
        searcher.close()
    (corpus_score,) = result.scores.corpora
    assert corpus_score.facts == len(facts) and corpus_score.no_article == 0
    relations = {r.name: r for r in result.scores.relations}
    for relation in RELATIONS:
        p = relations[relation].precision
        # A random model is at chance; the kNN over each subject's own evidence finds the object.
        assert p["knn"][10] > p["bert"][10] + 0.2, (relation, p)
    assert (tmp_path / "out" / "results.md").exists()
