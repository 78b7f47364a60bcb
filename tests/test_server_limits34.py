"""Issue 34: per-request limits, strict request types, the token and body size checked before the body
is read, no framing, one Origin, and evidence spans the page highlights right (code points)."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs fastapi (pip install -e '.[test]')")
from fastapi.testclient import TestClient

from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.errors import ConfigError
from bertknn_search.records import Question
from bertknn_search.server import client as server_client
from bertknn_search.server.app import ServerSettings, create_app
from bertknn_search.server.limits import ENV, LARGE, MIB, RequestLimits
from tests.loopback import uvicorn_thread
from tests.test_server import LOCAL, SHARP, TOKEN, assert_one_line, auth, born, start, stored_ids

APP_JS = Path(__file__).resolve().parents[1] / "bertknn_search" / "server" / "static" / "app.js"
DEFAULTS = RequestLimits()  # explicit, so that a BERTKNN_SERVE_LIMITS in the environment changes nothing
LIFTED = RequestLimits(lifted_by_token=True)
MASKED = "a [MASK]."


@pytest.fixture(scope="module")
def guarded(built_index: Config) -> Iterator[TestClient]:
    """A read-only server with a token that does not lift the limits (the default)."""
    app = create_app(ServerSettings(built_index.replace(temperature=SHARP), token=TOKEN, limits=DEFAULTS))
    with TestClient(app, base_url=LOCAL) as client:
        yield start(client)


@pytest.fixture(scope="module")
def liftable(built_index: Config) -> Iterator[TestClient]:
    """A read-only server whose token lifts the limits."""
    app = create_app(ServerSettings(built_index.replace(temperature=SHARP), token=TOKEN, limits=LIFTED))
    with TestClient(app, base_url=LOCAL) as client:
        yield start(client)


def over_limits(facts: list[Fact]) -> dict[str, tuple[dict[str, Any], int]]:
    """A request over each limit (the default ones), with the status it gets."""
    q = born(facts[0])
    return {
        "budget": ({**q, "budget": DEFAULTS.budget + 1}, 422),
        "budget-s": ({**q, "budget-s": DEFAULTS.budget_s + 1}, 422),
        "exact": ({**q, "exact": True}, 422),
        "n-articles": ({**q, "n-articles": DEFAULTS.n_articles + 1}, 422),
        "questions": ({"questions": [born(f) for f in facts[: DEFAULTS.questions + 1]]}, 413),
    }


# -- 1. per-request limits -------------------------------------------------------------------------------
def test_a_request_without_a_token_is_held_to_each_limit(guarded: TestClient, facts: list[Fact]) -> None:
    for name, (body, status) in over_limits(facts).items():
        for headers in ({}, auth()):  # the token does not lift them unless the operator says so
            detail = assert_one_line(guarded.post("/query", json=body, headers=headers), status)
            assert f"(limit {name})" in detail and f"ask the server's operator to raise it ({ENV}" in detail
    # At the limits: answered.
    q = born(facts[0])
    for body in (
        {**q, "budget": DEFAULTS.budget, "n-articles": DEFAULTS.n_articles, "exact": False},
        {"questions": [born(f) for f in facts[: DEFAULTS.questions]]},
        # Seconds alone bound a question's encoding: no budget of contexts is asked, none is refused.
        {**q, "budget-s": DEFAULTS.budget_s},
        {**q, "budget-s": 0.5, "budget": DEFAULTS.budget},
    ):
        assert guarded.post("/query", json=body).status_code == 200, body


def test_a_valid_token_lifts_the_limits_where_the_operator_says_so(
    liftable: TestClient, facts: list[Fact]
) -> None:
    for name, (body, status) in over_limits(facts).items():
        for headers in ({}, auth("wrong")):
            detail = assert_one_line(liftable.post("/query", json=body, headers=headers), status)
            assert f"(limit {name})" in detail and "send the server's token" in detail
        reply = liftable.post("/query", json=body, headers=auth())
        assert reply.status_code == 200, (name, reply.text)


def test_the_articles_one_add_may_hold(index_copy: Config) -> None:
    articles = [
        {"id": f"n{i}", "title": f"Nim {i}", "text": f"Nim {i} was born in Quenton."} for i in range(101)
    ]
    open_server = ServerSettings(index_copy, limits=DEFAULTS)  # no token: writes open to this machine
    with TestClient(create_app(open_server), base_url=LOCAL) as client:
        detail = assert_one_line(client.post("/articles", json={"articles": articles}), 413)
        assert "adds 101 articles, more than the 100" in detail and "(limit articles)" in detail
        assert not any(i.startswith("n") for i in stored_ids(index_copy))
    lifted = ServerSettings(index_copy, token=TOKEN, limits=LIFTED)
    with TestClient(create_app(lifted), base_url=LOCAL) as client:
        assert client.post("/articles", json={"articles": articles}, headers=auth()).status_code == 200


def test_a_query_body_past_its_limit_is_413_unless_the_token_lifts_it(liftable: TestClient) -> None:
    body = json.dumps({"question": MASKED, "subject": "x" * (DEFAULTS.query_body + 10)}).encode()
    headers = {"Content-Type": "application/json"}
    detail = assert_one_line(liftable.post("/query", content=body, headers=headers), 413)
    assert "(limit query-body-mb)" in detail and "send the server's token" in detail
    lifted = liftable.post("/query", content=body, headers={**headers, **auth()})
    assert "subject" in assert_one_line(lifted, 422)  # past the guard: the schema's own bound


def test_the_servers_own_defaults_are_never_refused(built_index: Config, facts: list[Fact]) -> None:
    config = built_index.replace(temperature=SHARP, n_articles=20, budget=500, exact=True)
    with TestClient(create_app(ServerSettings(config, limits=DEFAULTS)), base_url=LOCAL) as client:
        start(client)
        limits = client.get("/stats").json()["server"]["limits"]
        assert limits == {
            **{
                "questions": DEFAULTS.questions,
                "n-articles": 20,
                "budget": 64,
                "exact": True,
                "articles": 100,
            },
            **{"query-body-mb": 1.0, "lifted-by-token": False, "budget-s": DEFAULTS.budget_s},
        }  # budget: exact needs none; without exact it would be the server's 500
        body = {**born(facts[0]), "n-articles": 20, "exact": True}
        assert client.post("/query", json=body).status_code == 200


def test_the_operator_sets_the_limits_in_the_environment(
    built_index: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = "questions=64, budget=512,exact=yes,n-articles=5,articles=7,query-body-mb=0.5,lifted-by-token=on"
    assert RequestLimits.from_env({ENV: spec}) == RequestLimits(64, 5, 512, True, 7, MIB // 2, True)
    assert RequestLimits.from_env({}) == RequestLimits()
    for bad, words in (
        ("questions=0", "questions must be a whole number >= 1"),
        ("questions=many", "questions must be a number"),
        ("exact=maybe", "exact must be yes or no"),
        ("speed=9", "NAME=VALUE with a NAME of questions, n-articles, budget"),
        ("budget=5,budget=6", "sets budget twice"),
    ):
        with pytest.raises(ConfigError, match=words):
            RequestLimits.from_env({ENV: bad})
    monkeypatch.setenv(ENV, "questions=3")
    assert ServerSettings(built_index).limits.questions == 3  # serve's settings read it
    with pytest.raises(ConfigError, match="lifted-by-token=yes but the server has no token"):
        create_app(ServerSettings(built_index, limits=LIFTED))


def test_query_server_sends_requests_the_server_takes(built_index: Config, facts: list[Fact]) -> None:
    """``query --server`` asks /stats how many questions one request may hold, and sends that many."""
    config = built_index.replace(temperature=SHARP)
    limits = RequestLimits(questions=3)
    with serving(create_app(ServerSettings(config, limits=limits))) as url:
        assert server_client.questions_per_request(url) == 3
        asked = [Question(b["question"], b["subject"]) for b in map(born, facts)]
        answers = list(server_client.ask(url, asked, {}))
    assert [a.bert_knn[0].word for a in answers] == [f.city for f in facts]


# -- 2. strict request types -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field",
    [
        '"exact": "yes"',
        '"exact": 1',
        '"k": "5"',
        '"k": true',
        '"k": 5.0',
        '"no-ir": "false"',
        '"top": "3"',
        '"budget": true',
        '"lambda": "0.5"',
        '"subject": 7',
    ],
)
def test_a_value_of_another_json_type_is_422(guarded: TestClient, field: str) -> None:
    body = f'{{"question": "{MASKED}", {field}}}'.encode()
    reply = guarded.post("/query", content=body, headers={"Content-Type": "application/json"})
    detail = assert_one_line(reply, 422)
    assert field.split(":")[0].strip('"') in detail, detail


def test_an_article_field_of_another_type_is_422(guarded: TestClient) -> None:
    for article in ({"id": "1", "title": 5, "text": "t"}, {"id": "1", "title": "T", "text": ["t"]}):
        reply = guarded.post("/articles", json={"articles": [article]}, headers=auth())
        assert_one_line(reply, 422)
    reply = guarded.post("/query", json={"questions": [{"question": MASKED, "popularity": "9"}]})
    assert "popularity" in assert_one_line(reply, 422)


# -- 3. the token and the body's size, before the body is read -------------------------------------------
class Body:
    """An ASGI receive channel that hands out ``size`` bytes in ``chunk``-byte messages and counts them;
    with ``pause_at``, it stops there until ``go`` is set."""

    def __init__(self, size: int, chunk: int = 64 * 1024, pause_at: int | None = None) -> None:
        self.left, self.chunk, self.read = size, chunk, 0
        self.pause_at, self.go = pause_at, asyncio.Event()

    async def __call__(self) -> dict[str, Any]:
        if self.left <= 0:
            await asyncio.sleep(3600)  # the client sent everything; the next message would be a disconnect
        if self.pause_at is not None and self.read >= self.pause_at:
            await self.go.wait()
        n = min(self.chunk, self.left)
        self.left -= n
        self.read += n
        return {"type": "http.request", "body": b"x" * n, "more_body": self.left > 0}


async def request(
    app: Any, method: str, path: str, body: Body, headers: dict[str, str]
) -> tuple[int, dict[str, str]]:
    """One request straight into the ASGI app; its status and headers."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        **{"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http"},
        **{"method": method, "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": ""},
        "headers": [(k.lower().encode(), v.encode()) for k, v in {"host": "localhost", **headers}.items()],
        **{"client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000), "state": {}},
    }
    await asyncio.wait_for(app(scope, body, send), 30)
    start_message = sent[0]
    return start_message["status"], {k.decode(): v.decode() for k, v in start_message["headers"]}


def call(app: Any, method: str, path: str, body: Body, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    return asyncio.run(request(app, method, path, body, headers))


SIXTEEN_MIB = 16 * MIB


def test_a_tokenless_write_is_refused_before_its_body_is_read(built_index: Config) -> None:
    app = create_app(ServerSettings(built_index, token=TOKEN, limits=DEFAULTS))
    for method, path in (("POST", "/articles"), ("DELETE", "/articles/100"), ("PUT", "/articles")):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
            body = Body(SIXTEEN_MIB)
            sized = {"Content-Type": "application/json", "Content-Length": str(SIXTEEN_MIB), **headers}
            status, reply = call(app, method, path, body, sized)
            assert (status, body.read) == (401, 0), (method, path, headers)
            assert reply["www-authenticate"] == "Bearer"
    # Two Authorization headers (a proxy's and the client's?): which one counts would be a guess.
    two = [("authorization", f"Bearer {TOKEN}"), ("authorization", "Bearer x")]
    with TestClient(app, base_url=LOCAL) as client:
        reply = client.post("/query", json={"question": MASKED}, headers=two)
        assert "more than one Authorization" in assert_one_line(reply, 400)


def test_a_body_over_its_limit_is_refused_unread_or_as_soon_as_it_passes_it(built_index: Config) -> None:
    app = create_app(ServerSettings(built_index, token=TOKEN, max_body=4 * MIB, limits=DEFAULTS))
    declared = {"Content-Type": "application/json", "Content-Length": str(SIXTEEN_MIB)}
    for path, headers in (("/query", {}), ("/articles", auth())):
        body = Body(SIXTEEN_MIB)
        assert call(app, "POST", path, body, {**declared, **headers})[0] == 413
        assert body.read == 0, path
    # Chunked: no Content-Length; refused at the chunk that passes the limit, the rest never read.
    for path, headers, limit in (("/query", {}, DEFAULTS.query_body), ("/articles", auth(), 4 * MIB)):
        body = Body(SIXTEEN_MIB)
        assert call(app, "POST", path, body, {"Content-Type": "application/json", **headers})[0] == 413
        assert limit < body.read <= limit + body.chunk, (path, body.read)


def test_large_bodies_are_read_two_at_a_time(built_index: Config) -> None:
    """A third body past 1 MiB waits, with what it sent so far, until one of two others is done."""
    app = create_app(ServerSettings(built_index, token=TOKEN, limits=DEFAULTS))
    chunked = {"Content-Type": "application/json", **auth()}

    async def three() -> tuple[list[int], list[int]]:
        bodies = [Body(4 * MIB, pause_at=3 * MIB) for _ in range(3)]
        tasks = [asyncio.ensure_future(request(app, "POST", "/articles", b, chunked)) for b in bodies]
        while sum(b.read >= 3 * MIB for b in bodies) < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        waiting = [b.read for b in bodies]  # two at their pause, one held just past 1 MiB
        for b in bodies:
            b.go.set()
        return waiting, [status for status, _ in await asyncio.gather(*tasks)]

    waiting, statuses = asyncio.run(three())
    assert sorted(waiting)[0] <= LARGE + 64 * 1024 and sorted(waiting)[1:] == [3 * MIB, 3 * MIB], waiting
    assert statuses == [400, 400, 400]  # then read whole, and refused as the JSON they are not


def test_a_refused_body_is_let_go_at_once(built_index: Config) -> None:
    """FastAPI keeps a body it could not take in a reference cycle that only the full collection frees;
    the error handlers break it, so refused bodies do not pile up between collections."""
    import gc
    import tracemalloc

    app = create_app(ServerSettings(built_index, token=TOKEN, limits=DEFAULTS))
    bodies = {
        "not JSON": (b"x" * (4 * MIB), 400),
        "not an add": (json.dumps({"pad": "x" * (4 * MIB)}).encode(), 422),
    }
    for what, (data, status) in bodies.items():

        async def send_all(data: bytes = data) -> int:
            chunks = iter([data[i : i + MIB] for i in range(0, len(data), MIB)] + [b""])

            async def receive() -> dict[str, Any]:
                piece = next(chunks)
                return {"type": "http.request", "body": piece, "more_body": bool(piece)}

            headers = {"Content-Type": "application/json", "Content-Length": str(len(data)), **auth()}
            return (await request(app, "POST", "/articles", receive, headers))[0]  # type: ignore[arg-type]

        gc.collect()
        gc.disable()
        tracemalloc.start()
        try:
            assert asyncio.run(send_all()) == status
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(4):
                assert asyncio.run(send_all()) == status
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
            gc.enable()
        assert grown < 2 * MIB, (what, grown)


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` on uvicorn on 127.0.0.1 in a thread, its model loaded; its URL."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    with uvicorn_thread(config, wait_s=60) as (port, _):
        assert app.state.batcher.done.wait(120), "the server did not start"
        yield f"http://127.0.0.1:{port}"


def test_a_tokenless_16_mib_write_is_answered_401_while_the_client_is_still_sending(
    built_index: Config,
) -> None:
    """Through uvicorn: the headers and 64 KiB of a 16 MiB body, and the 401 comes without the rest."""
    with serving(create_app(ServerSettings(built_index, token=TOKEN, limits=DEFAULTS))) as url:
        port = int(url.rsplit(":", 1)[1])
        # /articles: the token is missing; /query (a read): past a query's limit, by its Content-Length.
        for path, status in (("/articles", "401"), ("/query", "413")):
            head = (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {SIXTEEN_MIB}\r\n\r\n"
            )
            with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
                conn.sendall(head.encode() + b'{"articles": [' + b" " * (64 * 1024))
                reply = conn.recv(4096).decode("latin-1")  # a timeout here: the server waits for the rest
            assert reply.split(" ", 2)[1] == status, (path, reply)


# -- 4. no framing -----------------------------------------------------------------------------------------
def test_every_response_forbids_framing(guarded: TestClient, facts: list[Fact]) -> None:
    replies = {
        "page": guarded.get("/"),
        "linked question": guarded.get("/", params={"question": MASKED}),
        "script": guarded.get("/static/app.js"),
        "style": guarded.get("/static/style.css"),
        "favicon": guarded.get("/favicon.ico"),
        "docs": guarded.get("/docs"),
        "openapi": guarded.get("/openapi.json"),
        "health": guarded.get("/health"),
        "stats": guarded.get("/stats"),
        "answer": guarded.post("/query", json=born(facts[0])),
        "422": guarded.post("/query", json={"question": "no mask"}),
        "401": guarded.post("/articles", json={"articles": []}),
        "404": guarded.get("/nowhere"),
        "421": guarded.get("/", headers={"Host": "attacker.example"}),
        "403": guarded.get("/", headers={"Origin": "http://attacker.example"}),
    }
    for what, reply in replies.items():
        assert reply.headers["x-frame-options"] == "DENY", what
        assert "frame-ancestors 'none'" in reply.headers["content-security-policy"], what
        assert reply.headers["x-content-type-options"] == "nosniff", what
    page = replies["page"].headers["content-security-policy"]
    assert "script-src 'self';" in page and "unsafe" not in page and "connect-src 'self'" in page
    assert replies["answer"].headers["content-security-policy"].startswith("default-src 'none'")
    # The docs' inline script (it starts Swagger UI) is allowed by its hash, and nothing else inline.
    import base64
    import hashlib
    import re

    docs = replies["docs"]
    (inline,) = re.findall(r"<script>(.*?)</script>", docs.text, flags=re.DOTALL)
    digest = base64.b64encode(hashlib.sha256(inline.encode()).digest()).decode()
    assert f"script-src 'self' 'sha256-{digest}';" in docs.headers["content-security-policy"]


# -- 5. one Origin, one Host ---------------------------------------------------------------------------------
def test_two_origin_headers_are_refused_whichever_comes_last(guarded: TestClient) -> None:
    local, evil = "http://localhost", "http://attacker.example"
    for first, last in ((evil, local), (local, evil), (local, local)):
        headers = [("Origin", first), ("Origin", last), ("Content-Type", "application/json")]
        reply = guarded.post("/query", json={"question": MASKED}, headers=headers)
        assert "more than one Origin header" in assert_one_line(reply, 403), (first, last)
    two_hosts = [("Host", "localhost"), ("Host", "attacker.example")]
    assert "more than one Host" in assert_one_line(guarded.get("/stats", headers=two_hosts), 400)


# -- 6. evidence spans in code points, and the page that highlights them -----------------------------------
EMOJI_ARTICLE = {
    "id": "950",
    "title": "Glorbix",
    "text": "🎉🎉 Glorbix was born in Yentil. Glorbix wrote 🎶 songs.",
}


def utf16_index(text: str, index: int) -> int:
    """Where code point ``index`` of ``text`` is in UTF-16 units (JavaScript's string index)."""
    return len(text[:index].encode("utf-16-le")) // 2


def test_evidence_spans_count_code_points(index_copy: Config) -> None:
    config = index_copy.replace(temperature=SHARP)
    with TestClient(create_app(ServerSettings(config, limits=DEFAULTS)), base_url=LOCAL) as client:
        start(client)
        assert client.post("/articles", json={"articles": [EMOJI_ARTICLE]}).status_code == 200
        body = {"question": "Glorbix was born in [MASK].", "subject": "Glorbix"}
        answer = client.post("/query", json=body).json()["answers"][0]
    assert answer["bert_knn"][0]["word"] == "yentil"
    (s,) = [s for e in answer["evidence"] if e["word"] == "yentil" for s in e["sentences"]]
    assert s["sentence"].startswith("🎉🎉") and s["sentence"][s["start"] : s["end"]] == "Yentil"
    # In UTF-16 the word starts two units later: a page slicing the string as is marks "n Yent".
    assert utf16_index(s["sentence"], s["start"]) == s["start"] + 2
    assert draw_in_node(s) == ["Yentil"]


SENTENCE = "🎉🎉 Glorbix was born in Yentil."
SPAN = {"sentence": SENTENCE, "start": SENTENCE.index("Yentil"), "end": SENTENCE.index("Yentil") + 6}

# The page's script under node, with just enough of a DOM to draw the evidence: what <mark> holds.
NODE_DOM = """
const vm = require("vm"), fs = require("fs");
class El {
  constructor(tag) { this.tag = tag; this.kids = []; this.style = {}; this.dataset = {}; }
  append(...xs) { for (const x of xs) this.kids.push(typeof x === "string" ? { text: x } : x); }
  replaceChildren(...xs) { this.kids = []; this.append(...xs); }
  set textContent(t) { this.kids = [{ text: String(t) }]; }
  get textContent() { return this.kids.map((k) => (k.text !== undefined ? k.text : k.textContent)).join(""); }
  addEventListener() {}
  querySelector() { return new El("ol"); }
  querySelectorAll() { return []; }
  marks() {
    return this.kids.flatMap((k) => (k.tag === "mark" ? [k.textContent] : k.marks ? k.marks() : []));
  }
}
const ids = {};
globalThis.document = { getElementById: (id) => (ids[id] ||= new El("div")), createElement: (t) => new El(t),
  querySelectorAll: () => [] };
globalThis.window = globalThis;
globalThis.location = { search: "", pathname: "/" };
globalThis.history = { replaceState() {} };
globalThis.fetch = () => Promise.reject(new Error("no server here"));
const [script, given] = process.argv.slice(-2);
vm.runInThisContext(fs.readFileSync(script, "utf8"));
const span = JSON.parse(given);
drawEvidence({ evidence: [{ word: "yentil", sentences: [{ ...span, title: "T", distance: 1 }] }] });
console.log(JSON.stringify(ids["evidence"].marks()));
"""


def draw_in_node(span: dict[str, Any]) -> list[str]:
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        pytest.skip("node is not installed: the page's drawing is checked in Chromium only")
    keep = {k: span[k] for k in ("sentence", "start", "end")}
    run = subprocess.run(
        [node, "-e", NODE_DOM, "--", str(APP_JS), json.dumps(keep)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return list(json.loads(run.stdout.strip().splitlines()[-1]))


def test_the_page_marks_the_word_the_span_names_after_an_emoji() -> None:
    assert draw_in_node(SPAN) == ["Yentil"]
    plain = {"sentence": "Glorbix was born in Yentil.", "start": 20, "end": 26}
    assert draw_in_node(plain) == ["Yentil"]
    astral = "𝔊𝔩 é Yentil 🎉 x"  # letters past U+FFFF and a combining-free accent, before and after
    i = astral.index("Yentil")
    assert draw_in_node({"sentence": astral, "start": i, "end": i + 6}) == ["Yentil"]


# -- in Chromium: the page under its policy, framed, and with an emoji ---------------------------------
@pytest.mark.slow
def test_in_chromium_the_page_works_under_its_policy_and_will_not_be_framed(
    built_index: Config, facts: list[Fact]
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.test_server_process import headless_chromium

    config = built_index.replace(temperature=SHARP)
    app = create_app(ServerSettings(config, limits=DEFAULTS))
    with serving(app) as url, headless_chromium() as driver:
        fact = facts[4]
        person = fact.person.title()
        link = urllib.parse.urlencode({"question": f"{person} was born in [MASK].", "subject": person})
        driver.get(f"{url}/?{link}")
        WebDriverWait(driver, 60).until(seen.visibility_of_element_located((By.ID, "result")))
        top = driver.find_element(By.CSS_SELECTOR, '.ranking[data-model="bert_knn"] li .word')
        assert top.text == fact.city
        assert driver.find_element(By.ID, "index-info").text.startswith("20 articles")  # fetch() allowed
        mark = driver.find_elements(By.CSS_SELECTOR, "#evidence .sentence mark")[0]
        assert mark.text == fact.city.title()
        # The page's own drawing of a span after an emoji.
        driver.execute_script(
            "drawEvidence({evidence: [{word: 'yentil', sentences: [arguments[0]]}]})",
            {**SPAN, "title": "T", "distance": 1.0},
        )
        assert driver.find_element(By.CSS_SELECTOR, "#evidence .sentence mark").text == "Yentil"
        violations = [e for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]
        assert not violations, violations

        # The API docs draw their operations under their policy (the inline script allowed by its hash).
        driver.get(url + "/docs")
        WebDriverWait(driver, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock-summary"))
        violations = [e for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]
        assert not violations, violations

        # A page of another site frames a linked question: the browser draws nothing and nothing is asked.
        asked = app.state.batcher.stats.as_dict()["questions"]
        link = f"{url}/?question=Zorblat+was+born+in+[MASK].&subject=Zorblat"
        driver.get("data:text/html,<iframe id=f width=800 height=600 src='" + link + "'></iframe>")
        time.sleep(3)
        driver.switch_to.frame(driver.find_element(By.ID, "f"))
        assert not driver.find_elements(By.ID, "question")  # the page was not drawn in the frame
        driver.switch_to.default_content()
        assert app.state.batcher.stats.as_dict()["questions"] == asked
