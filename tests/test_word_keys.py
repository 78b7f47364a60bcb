"""Whole words whose stored 31-bit hashes collide stay two words: two votes, two pieces, two evidences.

"Zorblatingsingly" (zorblat ##ing ##s ##ing ##ly) and "Lintmerelyknownedinged" (lintmere ##ly ##known
##ed ##ing ##ed) are a real collision of ``values.word_value`` in the tiny model's vocabulary, found by
brute force over its names and suffixes (15,600 words were enough, as the birthday bound says).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bertknn_search import values
from bertknn_search.config import Config
from bertknn_search.errors import WordCollisionError
from bertknn_search.eval.datasets import Fact
from bertknn_search.eval.harness import evaluate, vocab_mask
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.query.knn import knn_probs
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question
from bertknn_search.values import HASH_SPAN, WordKeys, word_key, word_value

FIRST, SECOND = "zorblatingsingly", "lintmerelyknownedinged"
FIRST_PIECES = ("zorblat", "##ing", "##s", "##ing", "##ly")
SECOND_PIECES = ("lintmere", "##ly", "##known", "##ed", "##ing", "##ed")
# The first word four times, the second three: the first holds more of the kNN mass.
TEXT = (
    "Zorblatingsingly was near Lintmerelyknownedinged. Zorblatingsingly, Zorblatingsingly and"
    " Zorblatingsingly. Lintmerelyknownedinged and Lintmerelyknownedinged."
)
QUESTION = Question("Zorblat was born in [MASK].", "Zorblat")


@pytest.fixture(scope="module")
def searcher(base_config: Config, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Searcher]:
    root = tmp_path_factory.mktemp("collide")
    corpus = root / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "1", "title": "Zorblat", "text": TEXT}) + "\n", encoding="utf-8")
    config = base_config.replace(index=root / "index", mask_policy="whole-word", top=40)
    ingest(corpus, config, progress=False)
    opened = Searcher.open(config)
    yield opened
    opened.close()


def ids(searcher: Searcher, word: str) -> list[int]:
    return searcher.encoder.tokenizer(word, add_special_tokens=False)["input_ids"]


def test_the_two_words_are_a_real_collision_of_the_stored_hash(searcher: Searcher) -> None:
    tok = searcher.encoder.tokenizer
    first, second = ids(searcher, FIRST), ids(searcher, SECOND)
    assert tuple(tok.convert_ids_to_tokens(first)) == FIRST_PIECES
    assert tuple(tok.convert_ids_to_tokens(second)) == SECOND_PIECES
    assert word_value(first) == word_value(second)  # what every store holds for both
    assert word_key(first) != word_key(second)  # what is compared
    assert max(word_key(first), word_key(second)) < -HASH_SPAN  # never a stored value nor a token id
    assert word_key([17]) == 17


def test_each_word_gets_its_own_votes_pieces_and_evidence(searcher: Searcher) -> None:
    scored = searcher.score_batch([QUESTION])[0]
    nb = scored.neighbors
    texts = searcher.backend.sentences([(nb.article_ids[r], int(nb.sentence_ids[r])) for r in range(len(nb))])
    spans = [t[int(nb.starts[r]) : int(nb.ends[r])].lower() for r, t in enumerate(texts)]
    weights = knn_probs(nb.distances, np.arange(len(nb)), len(nb), searcher.config.temperature)
    answer = searcher.answer(QUESTION)
    found = {p.word: p for p in answer.knn}
    for word, pieces, count in ((FIRST, FIRST_PIECES, 4), (SECOND, SECOND_PIECES, 3)):
        rows = [r for r, s in enumerate(spans) if s == word]
        assert len(rows) == count
        # Its own kNN mass: the weights of the neighbours that hold it, and no other's.
        assert found[word].prob == pytest.approx(float(weights[rows].sum()), rel=1e-5)
        assert found[word].pieces == pieces
        evidence = next(e for e in answer.evidence if e.word == word)
        assert {s.sentence[s.start : s.end].lower() for s in evidence.sentences} == {word}
    assert found[FIRST].token_id != found[SECOND].token_id
    assert len(scored.space.words) == 2


def test_evaluation_scores_each_word_by_its_own_rank(searcher: Searcher, tmp_path: Path) -> None:
    facts = [Fact("Test", "P19", QUESTION.text, (w,), QUESTION.subject, w) for w in (FIRST, SECOND)]
    result = evaluate(searcher, facts, searcher.config, tmp_path)
    lines = {
        json.loads(line)["uuid"]: json.loads(line) for line in result.checkpoint.read_text().splitlines()
    }
    for word in (FIRST, SECOND):
        top = lines[word]["top"]["knn"]
        # Ranked where its own word stands, not where the other word sharing its hash does.
        assert lines[word]["ranks"]["knn"] == top.index(word) + 1
    assert lines[FIRST]["ranks"]["knn"] != lines[SECOND]["ranks"]["knn"]
    # LAMA's candidate list holds the word listed, not the other one with its hash.
    common = vocab_mask(searcher, [FIRST])
    assert searcher.value(FIRST) in common and searcher.value(SECOND) not in common


def test_a_shared_key_is_refused_never_merged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(values, "KEY_SPAN", 1)  # every word of several pieces has one key
    keys = WordKeys()
    with pytest.raises(WordCollisionError, match="share the key"):
        keys.neighbours([[5, 6], [7, 8]])
    keys.ask([5, 6])
    assert keys.ask([5, 6]) == word_key([5, 6])
    with pytest.raises(WordCollisionError, match="share the key"):
        keys.ask([7, 8])
    with pytest.raises(WordCollisionError, match="share the key"):
        keys.neighbours([[7, 8]])  # a neighbour's word against a word asked about
    assert keys.neighbours([[5, 6], [5, 6], [9]]) == [word_key([5, 6])] * 2 + [9]


def test_asked_words_are_remembered_up_to_a_bound() -> None:
    keys = WordKeys(capacity=2)
    for pieces in ([1, 2], [3, 4], [5, 6]):
        keys.ask(pieces)
    assert len(keys._asked) == 2 and word_key([1, 2]) not in keys._asked
