"""The HTTP API in process (FastAPI's TestClient): answers, overrides, micro-batches, writes, bad input."""

from __future__ import annotations

import json
import re
import shutil
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs fastapi (pip install -e '.[test]')")
from fastapi.testclient import TestClient

from bertknn_search.backends import open_backend
from bertknn_search.config import CPU_BUDGET, CPU_BUDGET_S, Config
from bertknn_search.demo import Fact
from bertknn_search.output import to_json
from bertknn_search.query.search import Searcher
from bertknn_search.records import Answer, Question
from bertknn_search.server.app import ServerSettings, create_app
from bertknn_search.server.limits import RequestLimits

SHARP = 1.0  # the tiny model's l (see test_search.py)
TOKEN = "s3cret-token"
# TestClient's own default, http://testserver, names a host the server does not answer for (see hosts.py).
LOCAL = "http://localhost"
# The tests ask all ten facts in one request, more than a request may hold by default (limits.py).
TEN = RequestLimits(questions=16)


class Recording(Searcher):
    """A Searcher that records the size of every batch it answers (one encoder pass each)."""

    passes: list[int]

    def answer_batch(self, questions: Sequence[Question]) -> list[Answer]:
        self.passes.append(len(questions))
        return super().answer_batch(questions)


def start(client: TestClient) -> TestClient:
    batcher = client.app.state.batcher  # type: ignore[attr-defined]
    assert batcher.done.wait(120), "the model did not load"
    assert batcher.error is None, batcher.error
    return client


@pytest.fixture(scope="module")
def api(built_index: Config) -> Iterator[TestClient]:
    """A read-only server over the session's index."""
    app = create_app(ServerSettings(built_index.replace(temperature=SHARP), limits=TEN))
    with TestClient(app, base_url=LOCAL) as client:
        yield start(client)


@pytest.fixture
def writable(index_copy: Config) -> Iterator[tuple[TestClient, Config]]:
    """A server over a private copy, with a write token and a small body limit."""
    config = index_copy.replace(temperature=SHARP)
    app = create_app(ServerSettings(config, token=TOKEN, max_body=4096))
    with TestClient(app, base_url=LOCAL) as client:
        yield start(client), config


def born(f: Fact) -> dict[str, str]:
    return {"question": f"{f.person.title()} was born in [MASK].", "subject": f.person.title()}


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_one_line(reply: Any, status: int) -> str:
    assert reply.status_code == status, reply.text
    detail = reply.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and 0 < len(detail) <= 500
    return detail


# -- answers -------------------------------------------------------------------------------------------
def test_answers_are_the_json_of_query_json(api: TestClient, built_index: Config, facts: list[Fact]) -> None:
    searcher = Searcher.open(built_index.replace(temperature=SHARP))
    try:
        questions = [Question(b["question"], b["subject"]) for b in map(born, facts)]
        expected = [json.loads(to_json(a)) for a in searcher.answer_batch(questions)]
        # A batch of one, as the server runs a lone question: float rounding depends on the batch shape.
        alone = [json.loads(to_json(a)) for a in searcher.answer_batch(questions[:1])]
    finally:
        searcher.close()
    one = api.post("/query", json=born(facts[0]))
    assert one.status_code == 200 and one.json()["answers"] == alone
    many = api.post("/query", json={"questions": [born(f) for f in facts]})
    assert many.status_code == 200 and many.json()["answers"] == expected
    assert [a["bert_knn"][0]["word"] for a in expected] == [f.city for f in facts]


def test_a_request_overrides_the_method_options_for_itself_only(api: TestClient, facts: list[Fact]) -> None:
    q = born(facts[0])
    assert api.post("/query", json={**q, "k": 1}).json()["answers"][0]["n_neighbors"] == 1
    only_bert = api.post("/query", json={**q, "lambda": 0.0}).json()["answers"][0]
    assert only_bert["bert_knn"] == only_bert["bert"]
    assert len(api.post("/query", json={**q, "top": 3}).json()["answers"][0]["bert"]) == 3
    no_ir = api.post("/query", json={**q, "no-ir": True, "n-articles": 1}).json()["answers"][0]
    assert no_ir["articles"] == [] and no_ir["n_neighbors"] > 0
    default = api.post("/query", json=q).json()["answers"][0]
    assert len(default["bert"]) == 10 and default["n_neighbors"] > 1 and default["articles"]


def test_concurrent_questions_share_one_encoder_pass(built_index: Config, facts: list[Fact]) -> None:
    config = built_index.replace(temperature=SHARP)
    searcher: list[Recording] = []

    def open_recording() -> Searcher:
        s = Recording.open(config)
        s.passes = []
        searcher.append(s)
        return s

    # A long window and a batch of 8: the pass starts when the 8th question arrives, not on a timer.
    app = create_app(ServerSettings(config, max_batch=8, window_s=60.0), open_searcher=open_recording)
    bodies = [born(f) for f in facts[:7]] + [{"question": "No mask in this one."}]
    with TestClient(app, base_url=LOCAL) as client, ThreadPoolExecutor(8) as pool:
        start(client)
        replies = list(pool.map(lambda body: client.post("/query", json=body), bodies))
    assert searcher[0].passes == [7]  # the bad question was refused before the pass, alone
    assert [r.status_code for r in replies] == [200] * 7 + [422]
    assert [r.json()["answers"][0]["bert_knn"][0]["word"] for r in replies[:7]] == [f.city for f in facts[:7]]


def test_clients_coming_back_after_their_answer_are_batched_together(
    built_index: Config, facts: list[Fact]
) -> None:
    """Clients that ask again once answered come back spread out; the batch after a batch of 4 waits for
    4 questions (up to its patience) instead of splitting them into a pass for the first and one for the
    rest, which would then alternate. A lone client, after a batch of 1, waits for nobody."""
    config = built_index.replace(temperature=SHARP)
    entered, release = threading.Event(), threading.Event()
    opened: list[Recording] = []

    class Gated(Recording):
        def answer_batch(self, questions: Sequence[Question]) -> list[Answer]:
            if len(self.passes) == 1:  # hold the second pass (the batch of 4) until the test says
                entered.set()
                assert release.wait(60)
            return super().answer_batch(questions)

    def open_gated() -> Searcher:
        s = Gated.open(config)
        s.passes = []
        opened.append(s)
        return s

    settings = ServerSettings(config, max_batch=8, window_s=0.0, patience_s=60.0)
    questions = [Question(b["question"], b["subject"]) for b in map(born, facts[:8])]
    with TestClient(create_app(settings, open_searcher=open_gated), base_url=LOCAL) as client:
        batcher = start(client).app.state.batcher  # type: ignore[attr-defined]
        alone = batcher.submit(questions[:1], config)
        assert alone[0].result(timeout=50).bert_knn[0].word == facts[0].city  # no wait for anyone
        four = batcher.submit(questions[:4], config)
        assert entered.wait(60)
        first_back = batcher.submit(questions[4:5], config)  # queued while the batch of 4 runs
        release.set()
        assert [f.result(timeout=60).subject for f in four] == [q.subject for q in questions[:4]]
        rest = [batcher.submit([q], config)[0] for q in questions[5:8]]  # the others, one by one
        answers = [f.result(timeout=60) for f in first_back + rest]
    assert opened[0].passes == [1, 4, 4]
    assert [a.bert_knn[0].word for a in answers] == [f.city for f in facts[4:8]]


def test_health_is_ready_only_once_the_model_is_loaded(built_index: Config, facts: list[Fact]) -> None:
    app = create_app(ServerSettings(built_index))
    client = TestClient(app, base_url=LOCAL)  # not started: the model has not been loaded
    assert client.get("/health").status_code == 503
    assert client.get("/health").json()["status"] == "loading"
    assert "loading" in assert_one_line(client.post("/query", json=born(facts[0])), 503)
    with client:
        start(client)
        assert client.get("/health").json() == {"status": "ready", "detail": "the model is loaded"}


def test_a_model_that_fails_to_load_is_reported(built_index: Config, tmp_path: Path) -> None:
    broken = tmp_path / "model"
    shutil.copytree(built_index.model, broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    app = create_app(ServerSettings(built_index.replace(model=str(broken))))
    with TestClient(app, base_url=LOCAL) as client:
        assert app.state.batcher.done.wait(120)
        reply = client.get("/health")
        assert reply.status_code == 503 and reply.json()["status"] == "failed"
        assert "failed to load" in assert_one_line(client.post("/query", json={"question": "[MASK]."}), 503)


# -- writes --------------------------------------------------------------------------------------------
def test_an_added_article_is_answerable_when_the_add_returns(writable: tuple[TestClient, Config]) -> None:
    client, _ = writable
    q = {"question": "Glorbix was born in [MASK].", "subject": "Glorbix"}
    article = {"id": "900", "title": "Glorbix", "text": "Glorbix was born in Yentil. Glorbix was a poet."}
    added = client.post("/articles", json={"articles": [article]}, headers=auth())
    assert added.status_code == 200 and added.json()["articles"] == 1
    assert client.post("/query", json=q).json()["answers"][0]["bert_knn"][0]["word"] == "yentil"
    article["text"] = article["text"].replace("Yentil", "Quenton")
    assert client.post("/articles", json={"articles": [article]}, headers=auth()).status_code == 200
    answer = client.post("/query", json=q).json()["answers"][0]
    assert answer["bert_knn"][0]["word"] == "quenton"
    assert [s["sentence"] for s in answer["evidence"][0]["sentences"]] == ["Glorbix was born in Quenton."]


def test_writes_need_the_token_and_reads_do_not(
    writable: tuple[TestClient, Config], facts: list[Fact]
) -> None:
    client, config = writable
    body = {"articles": [{"id": "901", "title": "Plim", "text": "Plim was born in Sarnith."}]}
    assert "token" in assert_one_line(client.post("/articles", json=body), 401)
    assert_one_line(client.post("/articles", json=body, headers=auth("wrong")), 401)
    assert_one_line(client.delete("/articles/100", headers=auth("wrong")), 401)
    assert "901" not in stored_ids(config)
    assert client.post("/query", json=born(facts[0])).status_code == 200
    assert client.get("/stats").status_code == 200
    assert client.post("/articles", json=body, headers=auth()).status_code == 200
    assert "901" in stored_ids(config)


def stored_ids(config: Config) -> dict[str, str]:
    backend = open_backend(config)
    try:
        ids = [str(i) for i in range(100, 1000)]
        return backend.fingerprints(ids)
    finally:
        backend.close()


BAD_QUERIES = [
    (b"{not json", 400, "not valid JSON"),
    (b'["a list"]', 422, "the body"),
    (json.dumps({"question": "No mask here."}).encode(), 422, "exactly one [MASK], found 0"),
    (json.dumps({"question": "[MASK] was born in [MASK]."}).encode(), 422, "found 2"),
    (json.dumps({"question": "the " * 80 + "[MASK]."}).encode(), 422, "tokens long; the model takes 64"),
    (json.dumps({"question": "Zorblat was born in [MASK].", "colour": 1}).encode(), 422, "unknown field"),
    (json.dumps({"question": "a [MASK].", "questions": [{"question": "b [MASK]."}]}).encode(), 422, "either"),
    (json.dumps({"questions": []}).encode(), 422, "questions"),
    (json.dumps({"questions": [{"question": "[MASK].", "k": 3}]}).encode(), 422, "unknown field"),
    (json.dumps({"question": "a [MASK].", "k": 0}).encode(), 422, "k:"),
    (json.dumps({"question": "a [MASK].", "lambda": 1.5}).encode(), 422, "lambda"),
    (json.dumps({"question": "a [MASK].", "distance": "cosine"}).encode(), 422, "distance"),
    (json.dumps({"question": "a [MASK].", "temperature": 0}).encode(), 422, "temperature"),
    (json.dumps({"question": "a [MASK]." + " x" * 3000}).encode(), 413, "limit of 4,096 bytes"),
]
BAD_ARTICLES = [
    b"{not json",
    json.dumps({"articles": []}).encode(),
    json.dumps({"articles": "100"}).encode(),
    json.dumps({"articles": [{"id": "100", "title": "Zorblat"}]}).encode(),
    json.dumps({"articles": [{"id": "100", "title": "Zorblat", "text": "   "}]}).encode(),
    json.dumps({"articles": [{"id": "", "title": "Zorblat", "text": "Zorblat was born."}]}).encode(),
    json.dumps({"articles": [{"id": 100, "title": "Zorblat", "text": "Zorblat was born."}]}).encode(),
    json.dumps({"articles": [{"id": "100", "title": "Z", "text": "Z was born.", "url": "x"}]}).encode(),
    # One good article and one bad: nothing is written, not even the good one.
    json.dumps({"articles": [{"id": "100", "title": "Z", "text": "Z was born."}, {"id": "7"}]}).encode(),
    json.dumps({"articles": [{"id": "100", "title": "Z", "text": "Z was born. " * 400}]}).encode(),
]


def test_bad_input_is_a_one_line_4xx_and_writes_nothing(writable: tuple[TestClient, Config]) -> None:
    client, config = writable
    before, stats_before = stored_ids(config), client.get("/stats").json()
    headers = {**auth(), "Content-Type": "application/json"}
    for body, status, words in BAD_QUERIES:
        detail = assert_one_line(client.post("/query", content=body, headers=headers), status)
        assert words in detail, (body[:60], detail)
    for body in BAD_ARTICLES:
        reply = client.post("/articles", content=body, headers=headers)
        assert 400 <= reply.status_code < 500, (body[:80], reply.text)
        assert_one_line(reply, reply.status_code)
    # A chunked body has no Content-Length: it is counted as it arrives and refused past the limit.
    chunks = (b'{"question": "a [MASK].", "subject": "' + b"x" * 1000 for _ in range(8))
    assert_one_line(client.post("/query", content=chunks, headers=headers), 413)
    assert_one_line(client.delete("/articles/no-such-id", headers=auth()), 404)
    assert stored_ids(config) == before
    stats_after = client.get("/stats").json()
    for key in ("articles", "sentences", "contexts"):
        assert stats_after[key] == stats_before[key]
    assert client.get("/health").json()["status"] == "ready"  # and the server still answers


def test_a_lazy_index_is_served_like_an_eager_one(
    built_index: Config, corpus: Path, tmp_path: Path, facts: list[Fact]
) -> None:
    from bertknn_search.ingest.pipeline import ingest

    lazy = built_index.replace(index=tmp_path / "lazy", contexts="lazy", temperature=SHARP)
    ingest(corpus, lazy, progress=False)
    bodies = {"questions": [born(f) for f in facts]}
    answers = []
    for config in (built_index.replace(temperature=SHARP), lazy):
        with TestClient(create_app(ServerSettings(config, limits=TEN)), base_url=LOCAL) as client:
            answers.append(start(client).post("/query", json=bodies).json()["answers"])
    assert [a["bert_knn"][0]["word"] for a in answers[1]] == [f.city for f in facts]

    def sentences(answer: dict[str, Any]) -> list[tuple[str, list[str]]]:
        # Distances agree to float rounding only: keys encoded in another batch differ in the last bits.
        return [(e["word"], [s["sentence"] for s in e["sentences"]]) for e in answer["evidence"]]

    assert [sentences(a) for a in answers[1]] == [sentences(a) for a in answers[0]]


# -- the rest ------------------------------------------------------------------------------------------
def test_stats_are_those_of_the_stats_command(
    api: TestClient, built_index: Config, facts: list[Fact]
) -> None:
    from bertknn_search.session import index_stats

    api.post("/query", json={"questions": [born(f) for f in facts[:3]]})
    stats = api.get("/stats").json()
    server = stats.pop("server")
    assert stats == json.loads(to_json(index_stats(built_index)))
    assert server["questions"] >= 3 and server["defaults"]["temperature"] == SHARP


def test_stats_defaults_are_spelled_as_requests_spell_them(api: TestClient, facts: list[Fact]) -> None:
    defaults = api.get("/stats").json()["server"]["defaults"]
    assert set(defaults) == {
        *("top", "k", "n-articles", "lambda", "temperature", "distance", "no-ir", "gate"),
        *("gate-thresholds", "evidence", "budget", "budget-s", "exact"),
    }
    assert defaults["lambda"] == 0.3 and defaults["no-ir"] is False and defaults["n-articles"] == 3
    # The device's budget when none was given (a CPU here), not a null that reads as "exact".
    assert defaults["budget"] == CPU_BUDGET and defaults["exact"] is False
    assert defaults["budget-s"] == CPU_BUDGET_S  # and its seconds, which a request may now send
    # What /stats says a request gets is itself a valid request, with the same answer as none.
    given = api.post("/query", json={**born(facts[0]), **defaults}).json()["answers"][0]
    assert given == api.post("/query", json=born(facts[0])).json()["answers"][0]


def test_the_page_and_the_api_docs_load_nothing_from_the_internet(api: TestClient) -> None:
    page = api.get("/")
    assert page.status_code == 200 and "[MASK]" in page.text and "/static/app.js" in page.text
    for path in ("/", "/static/app.js", "/static/style.css", "/docs"):
        text = api.get(path).text
        assert "http://" not in text and "https://" not in text, path
    assert api.get("/docs-assets/swagger-ui-bundle.js").status_code == 200
    paths = api.get("/openapi.json").json()["paths"]
    assert {"/query", "/articles", "/articles/{article_id}", "/stats", "/health"} <= set(paths)


def test_the_docs_swagger_ui_reads_the_openapi_version_the_app_writes(api: TestClient) -> None:
    # Swagger UI before 5 says "does not specify a valid version field" for OpenAPI 3.1 and lists nothing;
    # the browser test sees the operations, this one holds where Chromium is not installed.
    openapi = api.get("/openapi.json").json()["openapi"]
    bundle = api.get("/docs-assets/swagger-ui-bundle.js").text
    found = re.search(r'PACKAGE_VERSION:"(\d+)\.(\d+)\.\d+"', bundle)
    assert found is not None, "no version in the served Swagger UI bundle"
    major = int(found.group(1))
    assert openapi.startswith("3.0") or major >= 5, (
        f"Swagger UI {found.group(0)} cannot read OpenAPI {openapi}"
    )
    assert "/docs-assets/swagger-ui-bundle.js" in api.get("/docs").text


def test_the_favicon_is_served(api: TestClient) -> None:
    for path in ("/favicon.ico", "/static/favicon.svg"):
        reply = api.get(path)
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("image/svg+xml"), path
        assert reply.text.lstrip().startswith("<svg")
    assert 'rel="icon" href="/static/favicon.svg"' in api.get("/").text


# -- NaN, infinities and the extremes of each range ----------------------------------------------------
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400"]  # Python's JSON parser reads all four as floats
FLOAT_FIELDS = [
    '"lambda": {}',
    '"temperature": {}',
    '"gate": "top1", "gate-threshold": {}',
    '"gate": "popularity", "gate-thresholds": {{"popularity": {{"*": 1.0, "P19": {}}}}}',
]


@pytest.mark.parametrize("value", NON_FINITE)
def test_nan_and_infinities_are_refused_in_every_float_field(api: TestClient, value: str) -> None:
    bodies = [f'{{"question": "a [MASK].", {field.format(value)}}}' for field in FLOAT_FIELDS]
    bodies.append(f'{{"questions": [{{"question": "a [MASK].", "popularity": {value}}}], "gate": "none"}}')
    for body in bodies:
        reply = api.post("/query", content=body.encode(), headers={"Content-Type": "application/json"})
        assert "finite number" in assert_one_line(reply, 422), body


MAX = 1.7976931348623157e308


def test_the_extremes_of_each_range_give_proper_answers(api: TestClient, facts: list[Fact]) -> None:
    q = born(facts[0])
    for temperature in (5e-324, MAX):  # all mass on the nearest neighbours' word; even over neighbours
        answer = api.post("/query", json={**q, "temperature": temperature}).json()["answers"][0]
        assert answer["knn"] and answer["bert_knn"] and answer["evidence"][0]["sentences"], temperature
        assert sum(p["prob"] for p in answer["knn"]) <= 1.0 + 1e-9
    sharpest = api.post("/query", json={**q, "temperature": 5e-324, "lambda": 1.0}).json()["answers"][0]
    assert sharpest["bert_knn"][0] == sharpest["knn"][0] and sharpest["knn"][0]["word"] == facts[0].city
    only_bert = api.post("/query", json={**q, "lambda": 0.0}).json()["answers"][0]
    assert only_bert["bert_knn"] == only_bert["bert"]
    for threshold, retrieve in ((-MAX, False), (MAX, True)):  # top1 retrieves below the threshold
        body = {**q, "gate": "top1", "gate-threshold": threshold}
        answer = api.post("/query", json=body).json()["answers"][0]
        assert answer["gate"]["retrieve"] is retrieve and bool(answer["knn"]) is retrieve
    for threshold, retrieve in ((-MAX, True), (MAX, False)):  # entropy retrieves above it
        body = {**q, "gate": "entropy", "gate-threshold": threshold}
        assert api.post("/query", json=body).json()["answers"][0]["gate"]["retrieve"] is retrieve
