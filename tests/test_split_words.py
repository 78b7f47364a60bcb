"""Words no answer can be: the word at [MASK]'s place in a searched sentence, of several wordpieces."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bertknn_search.config import Config
from bertknn_search.output import render_answer
from bertknn_search.query.split_words import MAX_WORDS, slot_words, split_words
from bertknn_search.server.client import answer_from_json
from tests.test_cli import run
from tests.test_readers import GENSIM_DUMP

README = Path(__file__).resolve().parents[1] / "README.md"

# BERT's uncased vocabulary, as far as these tests need it.
PIECES = {"ulm": ["ul", "##m"], "wurttemberg": ["wu", "##rt", "##tem", "##berg"], "germany": ["germany"]}


def tokenize(word: str) -> list[str]:
    return PIECES.get(word.lower(), [word.lower()])


def test_the_word_in_the_mask_s_place_is_found_by_the_words_beside_it() -> None:
    q = "Albert Einstein was born in [MASK]."
    assert slot_words(q, "Einstein was born in Ulm, in the Kingdom of Wurttemberg.") == ["Ulm"]
    assert slot_words(q, "He was BORN  in\nUlm.") == ["Ulm"]  # case and the space between words do not matter
    # One shared word is not enough: "in the" is no "born in".
    assert slot_words(q, "He lived in Ulm, in the Kingdom of Wurttemberg.") == []
    # A question that starts with [MASK] is matched by the words after it.
    assert slot_words("[MASK] is the capital of Germany.", "Berlin is the capital of Germany.") == ["Berlin"]
    assert slot_words("[MASK].", "Ulm.") == []


def test_only_words_of_several_pieces_are_reported_once_each_nearest_first() -> None:
    rows = [
        ("Einstein was born in Germany.", "1", "Albert Einstein"),
        ("Einstein was born in Ulm.", "1", "Albert Einstein"),
        ("His sister was born in ulm too.", "2", "Maja Einstein"),
    ]
    found = split_words("Albert Einstein was born in [MASK].", rows, tokenize)
    assert [(w.word, w.pieces, w.title) for w in found] == [("Ulm", ["ul", "##m"], "Albert Einstein")]
    many = [(f"X was born in Wurttemberg{i}x.", str(i), "T") for i in range(MAX_WORDS + 2)]
    assert len(split_words("Y was born in [MASK].", many, lambda w: [w[:2], "##" + w[2:]])) == MAX_WORDS


def test_an_answer_says_why_a_word_of_several_pieces_is_missing(index_copy: Config, tmp_path: Path) -> None:
    # The tiny model's vocabulary splits "unknown" as "un ##known", as BERT's splits "Ulm".
    added = tmp_path / "tolgrin.jsonl"
    text = "Tolgrin was born in Unknown. Tolgrin worked as a poet in the north of the country."
    added.write_text(json.dumps({"id": "107", "title": "Tolgrin", "text": text}) + "\n", encoding="utf-8")
    index = ["--index", index_copy.index, "--device", "cpu"]
    assert run("add", added, *index, "--no-progress").exit_code == 0
    index += ["--temperature", "1"]
    asked = ["query", "Tolgrin was born in [MASK].", "--subject", "Tolgrin", *index]
    line = run(*asked, "--json").output
    answer = json.loads(line)
    assert answer["split_words"] == [
        {"word": "Unknown", "pieces": ["un", "##known"], "article_id": "107", "title": "Tolgrin"}
    ]
    assert all(p["word"] != "unknown" for p in answer["bert_knn"])
    text_out = run(*asked).output
    assert (
        "note: 'Unknown' (un ##known, in Tolgrin) stands where the question has [MASK], but an answer is one"
        " wordpiece of the model's vocabulary, so it cannot be one"
    ) in text_out
    assert render_answer(answer_from_json(answer), 10) in text_out  # the server's client says the same
    # A question whose sentence holds a one-piece word has no note.
    other = json.loads(
        run("query", "Zorblat was born in [MASK].", "--subject", "Zorblat", *index, "--json").output
    )
    assert other["split_words"] == []


def test_the_readme_s_headline_question_can_be_answered_from_its_article(minilm: Path) -> None:
    from transformers import AutoTokenizer

    from bertknn_search.ingest.readers import read_articles

    if not GENSIM_DUMP.exists():
        pytest.skip(f"the shared Wikipedia sample is not at {GENSIM_DUMP}")
    # MiniLM's WordPiece vocabulary is bert-base-uncased's.
    tokenize = AutoTokenizer.from_pretrained(minilm).tokenize
    headline = re.search(r'Answers cloze questions \("([^"]+\[MASK\][^"]*)"\)', README.read_text("utf-8"))
    assert headline is not None
    question = headline.group(1)
    assert question in README.read_text("utf-8").split("## Using it on Wikipedia")[1]  # its quick start
    einstein = next(a for a in read_articles(GENSIM_DUMP) if a.title == "Albert Einstein")
    slot = {w for line in einstein.text.splitlines() for w in slot_words(question, line)}
    # The article says what the question asks, with a word that can be an answer ("Ulm" could not).
    assert slot and all(len(tokenize(w)) == 1 for w in slot), {w: tokenize(w) for w in slot}
    assert split_words(
        "Albert Einstein was born in [MASK].", [(einstein.text, "736", "Albert Einstein")], tokenize
    )
