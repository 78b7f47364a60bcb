"""Evidence for chosen words (`query --evidence-for`, the API's `evidence_for`), in the top answers or not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.output import to_json
from bertknn_search.query.evidence_words import MAX_EVIDENCE_FOR
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question

SHARP = 1.0  # the tiny model's l (see test_search.py)
UNKNOWN = "xyzzq"  # [UNK] to the tiny model: never an answer


def born(f: Fact) -> Question:
    return Question(f"{f.person.title()} was born in [MASK].", f.person.title())


@pytest.fixture(scope="module")
def sharp(built_index: Config) -> Iterator[Searcher]:
    s = Searcher.open(built_index.replace(temperature=SHARP))
    yield s
    s.close()


def test_a_chosen_word_outside_the_top_three_gets_the_sentences_that_voted_for_it(
    sharp: Searcher, facts: list[Fact]
) -> None:
    f, other = facts[0], facts[1]
    plain = sharp.answer(born(f))
    top3 = [p.word for p in plain.bert_knn[:3]]
    assert f.job not in top3  # the point: a word the top three's evidence never shows
    asked = Question(born(f).text, born(f).subject, evidence_for=(f.job, other.city, UNKNOWN))
    answer = sharp.answer(asked)
    assert answer.evidence == plain.evidence  # the top answers' evidence is unchanged
    job, city, unknown = answer.evidence_for
    scored = sharp.score_batch([born(f)])[0]
    assert job.word == f.job and job.answerable
    assert job.votes == int((scored.neighbors.token_ids == sharp.value(f.job)).sum()) > 0
    assert 0 < len(job.sentences) <= 3
    for s in job.sentences:
        assert s.sentence[s.start : s.end] == f.job and s.title == f.person.title()
    # A word of the vocabulary that no neighbour holds (another person's town), and one that is none.
    assert (city.word, city.sentences, city.votes, city.answerable) == (other.city, [], 0, True)
    assert (unknown.sentences, unknown.votes, unknown.answerable) == ([], 0, False)


def test_evidence_for_words_are_bounded(sharp: Searcher, facts: list[Fact]) -> None:
    from bertknn_search.errors import QuestionError

    many = tuple(f"w{i}" for i in range(MAX_EVIDENCE_FOR + 1))
    with pytest.raises(QuestionError, match="at most 10 words"):
        sharp.answer(Question(born(facts[0]).text, evidence_for=many))
    with pytest.raises(QuestionError, match="at most 100 characters"):
        sharp.answer(Question(born(facts[0]).text, evidence_for=("x" * 101,)))


def cli(*args: Any) -> Any:
    return CliRunner().invoke(main, [str(a) for a in args])


def test_query_evidence_for_prints_the_sentences_or_one_line_why_not(
    built_index: Config, facts: list[Fact]
) -> None:
    f, other = facts[0], facts[1]
    common = ["query", born(f).text, "--subject", f.person.title(), "--index", built_index.index]
    result = cli(
        *common, "--temperature", SHARP, "--evidence-for", f"{f.job},{other.city}", "--evidence-for", UNKNOWN
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith(f"evidence for '{f.job}' ("))
    assert "neighbours hold it):" in lines[head] or "neighbours holds it):" in lines[head]
    assert lines[head + 1].startswith("  - ") and f"[{f.job}]" in lines[head + 1]
    assert f"evidence for '{other.city}': none; no neighbour of the " in result.stdout
    assert f"evidence for '{UNKNOWN}': none; it cannot be an answer on this index" in result.stdout
    data = json.loads(cli(*common, "--json", "--evidence-for", f.job).stdout)
    assert [e["word"] for e in data["evidence_for"]] == [f.job]
    assert data["evidence_for"][0]["sentences"][0]["sentence"].count(f.job) >= 1
    assert json.loads(cli(*common, "--json").stdout)["evidence_for"] == []


@pytest.mark.parametrize(
    ("given", "words"),
    [
        (",".join(f"w{i}" for i in range(MAX_EVIDENCE_FOR + 1)), "at most 10 words"),
        ("x" * 101, "at most 100 characters"),
    ],
)
def test_query_evidence_for_refuses_too_much_in_one_line(built_index: Config, given: str, words: str) -> None:
    result = cli(
        "query", "Zorblat was born in [MASK].", "--index", built_index.index, "--evidence-for", given
    )
    assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output
    assert "--evidence-for" in result.output


# -- the API ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def api(built_index: Config) -> Iterator[Any]:
    pytest.importorskip("fastapi", reason="the server needs fastapi (pip install -e '.[test]')")
    from fastapi.testclient import TestClient

    from bertknn_search.server.app import ServerSettings, create_app
    from tests.test_server import LOCAL, start

    app = create_app(ServerSettings(built_index.replace(temperature=SHARP)))
    with TestClient(app, base_url=LOCAL) as client:
        yield start(client)


def test_the_api_answers_evidence_for_as_the_python_api_does(
    api: Any, sharp: Searcher, facts: list[Fact]
) -> None:
    from bertknn_search.server.client import answer_from_json

    f = facts[0]
    body = {"question": born(f).text, "subject": f.person.title(), "evidence_for": [f.job, UNKNOWN]}
    reply = api.post("/query", json=body)
    assert reply.status_code == 200, reply.text
    got = reply.json()["answers"][0]
    expected = sharp.answer(Question(body["question"], body["subject"], evidence_for=(f.job, UNKNOWN)))
    assert got == json.loads(to_json(expected))
    assert got["evidence_for"][0]["word"] == f.job and got["evidence_for"][0]["sentences"]
    assert got["evidence_for"][1] == {"word": UNKNOWN, "sentences": [], "votes": 0, "answerable": False}
    assert json.loads(to_json(answer_from_json(got))) == got  # query --server reads it back whole
    many = {"questions": [{"question": body["question"], "evidence_for": [f.job]}]}
    assert api.post("/query", json=many).json()["answers"][0]["evidence_for"][0]["word"] == f.job


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"evidence_for": [f"w{i}" for i in range(MAX_EVIDENCE_FOR + 1)]}, "evidence_for"),
        ({"evidence_for": ["x" * 101]}, "evidence_for.0"),
        ({"evidence_for": [""]}, "evidence_for.0"),
        ({"evidence_for": "ulm"}, "evidence_for"),
    ],
)
def test_the_api_refuses_too_many_or_too_long_words_in_one_line(
    api: Any, extra: dict[str, Any], words: str
) -> None:
    reply = api.post("/query", json={"question": "Zorblat was born in [MASK].", **extra})
    assert reply.status_code == 422, reply.text
    detail = reply.json()["detail"]
    assert "\n" not in detail and detail.startswith(words)


def test_evidence_for_goes_inside_each_item_of_questions(api: Any) -> None:
    body = {"questions": [{"question": "Zorblat was born in [MASK]."}], "evidence_for": ["ulm"]}
    reply = api.post("/query", json=body)
    assert reply.status_code == 422 and "'evidence_for' goes inside each item of 'questions'" in reply.text
