"""``bertknn-search serve`` as a process on 127.0.0.1: query --server, SIGTERM during an add, a browser."""

from __future__ import annotations

import http.client
import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bertknn_search.backends import open_backend
from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.demo import FILLER, Fact, person_text
from tests.conftest import long_article_index

pytestmark = pytest.mark.slow
pytest.importorskip("fastapi", reason="the server needs fastapi (pip install -e '.[test]')")
START_S = 180.0  # loading torch and the model on a busy 2-core machine


@dataclass
class Served:
    """A server process, its URL and every line it has written to stderr so far."""

    proc: subprocess.Popen[str]
    url: str = ""
    log: list[str] = field(default_factory=list)
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)

    def wait_for(self, text: str, timeout: float = START_S) -> str:
        """The first line (from now on) containing ``text``; fails with the log if the process ends."""
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                pytest.fail(f"no {text!r} from the server in {timeout:.0f} s:\n" + "".join(self.log))
            if line is None:
                pytest.fail(f"the server ended before {text!r}:\n" + "".join(self.log))
            if text in line:
                return line

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=120)


def serve(index: Path, *extra: str, limits: str = "") -> Served:
    """``serve`` on a free port; ``limits``: its BERTKNN_SERVE_LIMITS (the defaults when empty)."""
    cmd = [sys.executable, "-m", "bertknn_search", "serve", "--index", str(index), "--port", "0", *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "BERTKNN_SERVE_LIMITS": limits}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    served = Served(proc)

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            served.log.append(line)
            served.lines.put(line)
        served.lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    match = re.search(r"ready: (http://\S+)", served.wait_for("ready: "))
    assert match is not None
    served.url = match.group(1)
    return served


def post(url: str, body: dict[str, Any], timeout: float = 300.0) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def live(built_index: Config) -> Iterator[Served]:
    """A read-only server over the session's index, with the demo's l=1."""
    served = serve(built_index.index, "--temperature", "1")
    yield served
    served.stop()


def cli(*args: Any) -> Any:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


# -- the command and the client ------------------------------------------------------------------------
def test_serve_binds_loopback_by_default(live: Served) -> None:
    assert live.url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(live.url + "/health", timeout=30) as reply:
        assert json.loads(reply.read())["status"] == "ready"


def test_a_rebinding_request_is_refused_by_the_process(live: Served) -> None:
    """The issue's request, through uvicorn: a page on attacker.example once the name points at 127.0.0.1."""
    port = urllib.parse.urlsplit(live.url).port
    body = json.dumps({"question": "Zorblat was born in [MASK]."})
    replies = {}
    for host in (f"attacker.example:{port}", f"localhost:{port}"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            headers = {"Host": host, "Origin": f"http://{host}", "Content-Type": "application/json"}
            conn.request("POST", "/query", body, headers)
            reply = conn.getresponse()
            replies[host.split(":")[0]] = (reply.status, json.loads(reply.read()))
        finally:
            conn.close()
    assert replies["localhost"][0] == 200
    status, answer = replies["attacker.example"]
    assert status == 421 and "DNS rebinding" in answer["detail"]


def test_query_server_prints_what_query_prints(
    live: Served, built_index: Config, facts: list[Fact], tmp_path: Path
) -> None:
    questions = "".join(f"{f.person.title()} was born in [MASK].\t{f.person.title()}\n" for f in facts[:4])
    path = tmp_path / "questions.txt"
    path.write_text(questions, encoding="utf-8")
    for fmt in (["--json"], [], ["--evidence-for", f"{facts[0].job},xyzzq"]):
        here = cli("query", "--index", built_index.index, "--temperature", 1, "--file", path, *fmt)
        there = cli("query", "--server", live.url, "--file", path, *fmt)
        assert here.exit_code == 0 and there.exit_code == 0, there.output
        assert there.stdout == here.stdout  # stderr here says that the server serves this index
    assert f"evidence for '{facts[0].job}' (" in there.output and "evidence for 'xyzzq': none" in there.output
    lines = cli("query", "--server", live.url, "--file", path, "--json").output.splitlines()
    answers = [json.loads(line) for line in lines]
    assert [a["bert_knn"][0]["word"] for a in answers] == [f.city for f in facts[:4]]
    # Method options travel with the questions and override the server's defaults.
    one = cli("query", "--server", live.url, "-k", 1, "--top", 2, "--json", "Zorblat was born in [MASK].")
    answer = json.loads(one.output)
    assert answer["n_neighbors"] == 1 and len(answer["bert"]) == 2


def test_query_server_errors_are_one_line(live: Served) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{closed.getsockname()[1]}"
        down = cli("query", "--server", nobody, "Zorblat was born in [MASK].")
    bad = cli("query", "--server", live.url, "Zorblat was born in Quenton.")
    mixed = cli("query", "--server", live.url, "--index", "elsewhere", "Zorblat was born in [MASK].")
    for result, words in (
        (down, "cannot reach a server"),
        (bad, "Error: the question must contain exactly one [MASK]"),  # refused here, before any request
        (mixed, "drop --index"),
    ):
        assert result.exit_code == 1 and words in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1


def test_serve_fails_in_one_line(built_index: Config, tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    empty.chmod(0o600)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        in_use = cli("serve", "--index", built_index.index, "--port", port)
    for result, words in (
        (in_use, "cannot listen on 127.0.0.1"),
        (cli("serve", "--index", tmp_path / "none"), "no index at"),
        (cli("serve", "--index", built_index.index, "--token-file", empty), "is empty"),
    ):
        assert result.exit_code == 1 and words in result.output and "Traceback" not in result.output


# -- shutdown ------------------------------------------------------------------------------------------
@pytest.mark.reliability
def test_sigterm_during_an_add_finishes_the_add(index_copy: Config) -> None:
    rng = random.Random(0)
    articles = [
        {
            "id": f"s{i}",
            "title": f"Town {i}",
            "text": " ".join(" ".join(rng.choices(FILLER, k=12)).capitalize() + "." for _ in range(6)),
        }
        for i in range(300)
    ]
    served = serve(index_copy.index, limits="articles=300")  # more than one request may add by default
    reply: list[tuple[int, Any]] = []
    adder = threading.Thread(
        target=lambda: reply.append(post(served.url + "/articles", {"articles": articles}))
    )
    adder.start()
    served.wait_for("add of 300 articles started")
    served.proc.send_signal(signal.SIGTERM)
    adder.join(timeout=300)
    code = served.proc.wait(timeout=120)
    log = "".join(served.log)
    assert code in (0, -signal.SIGTERM), log
    assert reply and reply[0][0] == 200 and reply[0][1]["articles"] == 300, (reply, log)
    assert log.index("add of 300 articles finished") < log.index("Application shutdown complete")
    backend = open_backend(index_copy)
    try:
        assert len(backend.fingerprints([a["id"] for a in articles])) == 300
        assert backend.stats().articles == 20 + 300
    finally:
        backend.close()


# -- the page in a real browser ------------------------------------------------------------------------
def chromium() -> tuple[str, str]:
    pytest.importorskip("selenium", reason="the browser test needs selenium (pip install -e '.[test]')")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("Chromium or chromedriver not installed (apt-get install chromium chromium-driver)")
    return browser, driver


@contextmanager
def headless_chromium() -> Iterator[Any]:
    """A headless Chromium driven by selenium, quit on the way out."""
    browser, driver_path = chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,1500"):
        options.add_argument(flag)
    options.binary_location = browser
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def test_the_api_docs_list_the_operations_in_chromium(live: Served) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with headless_chromium() as driver:
        driver.get(live.url + "/docs")
        # Swagger UI draws an operation block per route once it has read /openapi.json; a version it cannot
        # read draws an error box instead, and no block ever comes.
        blocks = WebDriverWait(driver, 60).until(
            lambda d: (
                d.find_elements(By.CSS_SELECTOR, ".opblock-summary")
                or d.find_elements(By.CSS_SELECTOR, ".errors-wrapper")
            )
        )
        assert not driver.find_elements(By.CSS_SELECTOR, ".errors-wrapper"), driver.find_element(
            By.TAG_NAME, "body"
        ).text
        listed = {
            (
                b.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text,
                b.find_element(By.CSS_SELECTOR, ".opblock-summary-path").text,
            )
            for b in blocks
        }
        assert {
            ("POST", "/query"),
            ("POST", "/articles"),
            ("DELETE", "/articles/{article_id}"),
            ("GET", "/stats"),
            ("GET", "/health"),
        } <= listed, listed
        assert "Unable to render" not in driver.find_element(By.TAG_NAME, "body").text


def test_the_page_answers_a_question_in_chromium(live: Served, facts: list[Fact], tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import WebDriverWait

    fact = facts[1]
    person = fact.person.title()
    with headless_chromium() as driver:
        driver.get(live.url + "/")
        question = driver.find_element(By.ID, "question")
        assert "[MASK]" in driver.find_element(By.ID, "mask-hint").text
        # Without [MASK] the page says so and asks nothing.
        question.send_keys(f"{person} was born in Paris.")
        driver.find_element(By.ID, "ask").click()
        assert "exactly one [MASK]" in driver.find_element(By.ID, "status").text
        question.clear()
        question.send_keys(f"{person} was born in ")
        driver.find_element(By.ID, "insert-mask").click()
        question.send_keys(".")
        assert question.get_attribute("value") == f"{person} was born in [MASK]."
        # Pressed again, the button never makes a second [MASK]: on it, nothing changes; elsewhere it moves.
        driver.execute_script("arguments[0].setSelectionRange(20, 20)", question)
        driver.find_element(By.ID, "insert-mask").click()
        assert question.get_attribute("value") == f"{person} was born in [MASK]."
        driver.execute_script("arguments[0].setSelectionRange(0, 0)", question)
        driver.find_element(By.ID, "insert-mask").click()
        assert question.get_attribute("value") == f"[MASK]{person} was born in."
        question.clear()
        question.send_keys(f"{person} was born in [MASK].")
        # The help line says what an answer is on this index (single-wordpiece here; whole words elsewhere).
        WebDriverWait(driver, 30).until(lambda d: "wordpiece" in d.find_element(By.ID, "answer-kind").text)
        assert driver.find_element(By.ID, "answer-kind").text == (
            "The answer is one word of the model's vocabulary (a single wordpiece)."
        )
        whole = driver.execute_script("return answerKindOf(arguments[0])", "whole-word-no-stopwords")
        assert whole.startswith("a whole word")
        driver.find_element(By.ID, "subject").send_keys(person)
        driver.find_element(By.ID, "ask").click()
        WebDriverWait(driver, 60).until(seen.visibility_of_element_located((By.ID, "result")))
        top = driver.find_element(By.CSS_SELECTOR, '.ranking[data-model="bert_knn"] li .word')
        assert top.text == fact.city
        # Bars are scaled to their column's top answer: the first is full, the others show the differences.
        for model in ("bert_knn", "bert", "knn"):
            widths = driver.execute_script(
                "return [...arguments[0]].map((f) => parseFloat(f.style.width))",
                driver.find_elements(By.CSS_SELECTOR, f'.ranking[data-model="{model}"] .fill'),
            )
            assert widths[0] == 100.0 and widths == sorted(widths, reverse=True), (model, widths)
            assert len(set(widths)) > 3, (model, widths)
        # A word outside the top three's evidence (the person's job, ranked by kNN) shows its sentences.
        shown = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#evidence h4")]
        assert fact.job not in shown
        assert not driver.find_element(By.ID, "chosen-evidence").is_displayed()
        driver.find_element(
            By.CSS_SELECTOR, f'.ranking[data-model="knn"] button[data-word="{fact.job}"]'
        ).click()
        WebDriverWait(driver, 60).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#chosen-evidence .sentence mark")
        )
        chosen = driver.find_element(By.ID, "chosen-evidence")
        assert chosen.find_element(By.TAG_NAME, "h4").text.startswith(
            f"Sentences that voted for “{fact.job}” ("
        )
        assert {m.text for m in chosen.find_elements(By.CSS_SELECTOR, ".sentence mark")} == {fact.job}
        pressed = driver.find_elements(By.CSS_SELECTOR, 'button.word[aria-pressed="true"]')
        assert {b.text for b in pressed} == {fact.job}
        # A word of the BERT column that no neighbour holds says so; a top answer's comes from the answer.
        # The article searched holds every neighbour (k is more than its contexts): a word not in it has none.
        held = set(re.findall(r"\w+|[^\w\s]", person_text(fact).lower()))
        bert = driver.find_elements(By.CSS_SELECTOR, '.ranking[data-model="bert"] button.word')
        lone = next(b for b in bert if b.text not in held)
        word = lone.text
        lone.click()
        WebDriverWait(driver, 60).until(
            lambda d: "None: no neighbour" in d.find_element(By.ID, "chosen-evidence").text
        )
        assert driver.find_element(By.ID, "chosen-evidence").text.startswith(
            f"Sentences that voted for “{word}”"
        )
        driver.find_element(By.CSS_SELECTOR, '.ranking[data-model="bert_knn"] button.word').click()
        WebDriverWait(driver, 60).until(
            lambda d: d.find_element(By.CSS_SELECTOR, "#chosen-evidence h4").text.endswith(f"“{fact.city}”")
        )
        assert driver.find_element(By.ID, "articles").text.startswith(f"Articles searched: {person}")
        marks = driver.find_elements(By.CSS_SELECTOR, "#evidence .sentence mark")
        first = marks[0].find_element(By.XPATH, "..")
        assert marks[0].text == fact.city.title()
        assert first.text.startswith(f"{person} was born in {fact.city.title()}.")
        shot = Path(os.environ.get("BERTKNN_SCREENSHOT_DIR", tmp_path)) / "server-page.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        print(f"screenshot: {shot}")


def test_a_link_asks_its_question_and_asking_makes_a_link_in_chromium(
    live: Served, facts: list[Fact]
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import WebDriverWait

    fact = facts[2]
    person = fact.person.title()
    query = urllib.parse.urlencode({"question": f"{person} was born in [MASK].", "subject": person})
    with headless_chromium() as driver:
        driver.get(f"{live.url}/?{query}")
        WebDriverWait(driver, 60).until(seen.visibility_of_element_located((By.ID, "result")))
        assert (
            driver.find_element(By.ID, "question").get_attribute("value") == f"{person} was born in [MASK]."
        )
        assert driver.find_element(By.ID, "subject").get_attribute("value") == person
        top = driver.find_element(By.CSS_SELECTOR, '.ranking[data-model="bert_knn"] li .word')
        assert top.text == fact.city
        # Asking another question puts it in the address, so the page can be linked to as it stands.
        other = facts[3].person.title()
        for field, text in (("question", f"{other} was born in [MASK]."), ("subject", "")):
            box = driver.find_element(By.ID, field)
            box.clear()
            box.send_keys(text)
        driver.find_element(By.ID, "ask").click()
        WebDriverWait(driver, 60).until(lambda d: d.find_element(By.ID, "asked").text.startswith(other))
        asked = urllib.parse.parse_qs(urllib.parse.urlparse(driver.current_url).query)
        assert asked == {"question": [f"{other} was born in [MASK]."]}

        # What the page draws for cases this index does not have, through its own functions.
        no_head = {
            **{"question": "x [MASK].", "subject": None, "articles": [], "n_neighbors": 0, "evidence": []},
            **{"bert_knn": [], "bert": None, "knn": [], "coverage": {}},
        }
        driver.execute_script("draw(arguments[0])", no_head)
        assert (
            driver.find_element(By.ID, "articles").text
            == "Articles searched: none found; no answer without BERT"
        )
        driver.execute_script("draw(arguments[0])", {**no_head, "bert": []})
        assert driver.find_element(By.ID, "articles").text.endswith("none found; BERT-kNN falls back to BERT")
        assert not driver.find_element(By.ID, "split-words").is_displayed()
        ulm = {"word": "Ulm", "pieces": ["ul", "##m"], "article_id": "736", "title": "Albert Einstein"}
        driver.execute_script("draw(arguments[0])", {**no_head, "split_words": [ulm]})
        assert driver.find_element(By.ID, "split-words").text == (
            "Note: “Ulm” (ul ##m, in Albert Einstein) stands where the question has [MASK], but an answer is"
            " one wordpiece of the model's vocabulary, so it cannot be one."
        )
        # A whole-word index's answer of several wordpieces shows them on hover; one of a single does not.
        ranked = [
            {"word": "ulm", "token_id": -5, "prob": 0.5, "pieces": ["ul", "##m"]},
            {"word": "germany", "token_id": 7, "prob": 0.2, "pieces": []},
        ]
        driver.execute_script("draw(arguments[0])", {**no_head, "knn": ranked, "bert_knn": ranked})
        words = driver.find_elements(By.CSS_SELECTOR, '.ranking[data-model="knn"] li .word')
        assert [(w.text, w.get_attribute("title")) for w in words] == [("ulm", "ul ##m"), ("germany", "")]
        lazy = {"articles": 20, "encoded_articles": 3, "contexts": 700, "meta": {"contexts": "lazy"}}
        line = driver.execute_script(
            "return contextsLine(arguments[0])", {**lazy, "estimated_contexts": 4600}
        )
        assert line == "20 articles (3 encoded) · lazy index: 700 of ~4,600 contexts encoded" + (
            " (the total is an estimate)"
        )
        line = driver.execute_script(
            "return contextsLine(arguments[0])",
            {**lazy, "encoded_articles": 0, "contexts": 0, "estimated_contexts": None},
        )
        assert line.endswith(
            "lazy index: 0 contexts encoded (the total is estimated once an article is encoded)"
        )
        footer = driver.find_element(By.ID, "index-info").text
        assert footer.startswith("20 articles · ") and "contexts" in footer and "lazy" not in footer  # eager
        # Each answer's confidence is shown next to it, "low" muted with what it means; none: no badge.
        badge = driver.find_element(By.ID, "confidence")
        assert not badge.is_displayed()
        low = {"level": "low", "p": 0.03, "votes": 1, "neighbours": 20}
        driver.execute_script("draw(arguments[0])", {**no_head, "confidence": low})
        assert (
            badge.is_displayed() and badge.text == "low confidence" and "low" in badge.get_attribute("class")
        )
        title = badge.get_attribute("title")
        assert title.startswith("low: such answers were right rarely")
        assert "(p 0.03; 1 of 20 neighbours)" in title
        high = {"level": "high", "p": 0.5, "votes": 9, "neighbours": 20}
        driver.execute_script("draw(arguments[0])", {**no_head, "confidence": high})
        assert badge.text == "high confidence" and "low" not in badge.get_attribute("class")
        driver.execute_script("draw(arguments[0])", no_head)
        assert not badge.is_displayed()


def test_the_page_completes_a_partial_answer_with_live_counts_in_chromium(
    base_config: Config, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import WebDriverWait

    chromium()  # skip before building anything
    config = long_article_index(base_config, tmp_path / "lazy", paragraphs=6, seed=3)
    served = serve(config.index, "--temperature", "1", "--budget", "64")
    try:
        with headless_chromium() as driver:
            driver.get(served.url + "/")
            footer = driver.find_element(By.ID, "index-info")
            WebDriverWait(driver, 60).until(lambda d: "lazy index: 0 contexts" in footer.text)
            driver.find_element(By.ID, "question").send_keys("The river is near the [MASK].")
            driver.find_element(By.ID, "subject").send_keys("Long Town")
            driver.find_element(By.ID, "ask").click()
            WebDriverWait(driver, 120).until(seen.visibility_of_element_located((By.ID, "result")))
            coverage, first, lines = driver.find_element(By.ID, "coverage"), footer.text, set()
            during = set()  # the footer's texts while the answer was partial
            # The page asks again until the article is whole; the coverage line and the footer move meanwhile.
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                if coverage.is_displayed():
                    lines.add(coverage.text)
                    during.add(footer.text)
                elif lines and "contexts encoded" in footer.text and " of ~" in footer.text:
                    counts = re.search(r"([\d,]+) of ~([\d,]+) contexts", footer.text)
                    if counts and counts.group(1) == counts.group(2):
                        break
                time.sleep(0.2)
            counts = re.search(r"([\d,]+) of ~([\d,]+) contexts", footer.text)
            assert counts and counts.group(1) == counts.group(2), footer.text
            assert during - {first}, (first, during)  # counts that moved while the answer was partial
            assert lines and all("Partial answer" in line for line in lines), lines
            assert any("Encoding more" in line for line in lines), lines
            assert not coverage.is_displayed(), "the page stopped before the article was whole"
    finally:
        served.stop()


def test_sigterm_during_a_cold_encode_stops_within_seconds_and_keeps_whole_parts(
    base_config: Config, tmp_path: Path
) -> None:
    config = long_article_index(base_config, tmp_path / "lazy", paragraphs=600, seed=1)
    index = config.index
    served = serve(index, limits="exact=yes")  # a tokenless request may not ask exact by default
    reply: list[Any] = []

    def ask() -> None:
        try:
            body = {"question": "Long Town lies on the [MASK].", "subject": "Long Town", "exact": True}
            reply.append(post(served.url + "/query", body))
        except OSError as exc:  # the connection closed as the server stopped
            reply.append(exc)

    asker = threading.Thread(target=ask)
    asker.start()
    served.wait_for("encoding ", timeout=60)
    stopped = time.monotonic()
    served.proc.send_signal(signal.SIGTERM)
    code = served.proc.wait(timeout=60)
    took = time.monotonic() - stopped
    asker.join(timeout=30)
    log = "".join(served.log)
    assert code in (0, -signal.SIGTERM) and took < 5, (took, log)
    assert reply and (isinstance(reply[0], OSError) or reply[0][0] == 503), (reply, log)
    backend = open_backend(config)
    try:
        coverage = backend.coverage(["long"]).get("long")
        stats = backend.stats()
        # What was encoded before the stop is stored, in whole parts, and not the whole article.
        assert coverage is None or (coverage.encoded == stats.partial_contexts and not coverage.complete)
    finally:
        backend.close()
