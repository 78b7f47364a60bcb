"""``--server auto`` trusts an announcement only when it is this user's, names a loopback http URL, names
a live ``bertknn-search serve`` process and the server at the URL proves it holds the file's nonce; the
token never follows a redirect; an index on an engine is found by its URL and index prefix.

The servers here are stand-ins: a small script named ``bertknn-search`` run with ``serve`` (so that its
command line is a serve's), answering ``GET /serving`` as the real server does. The real server's own
``/serving`` is checked through the app.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.server import discovery
from tests.loopback import LoopbackServer, QuietHandler

QUESTION = "Zorblat was born in [MASK]."
NONCE = "0123456789abcdef0123456789abcdef"

# A stand-in for ``bertknn-search serve``: proves its nonce on GET /serving, answers /stats and /query,
# and appends every request (path, Authorization) to the file named by its second argument.
STAND_IN = textwrap.dedent(
    """
    import hashlib, hmac, json, sys, urllib.parse
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    nonce, record = sys.argv[2], sys.argv[3]

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _note(self):
            with open(record, "a") as out:
                out.write(json.dumps([self.path.split("?")[0], self.headers.get("Authorization")]) + "\\n")

        def do_GET(self):
            self._note()
            parts = urllib.parse.urlsplit(self.path)
            if parts.path == "/serving":
                challenge = urllib.parse.parse_qs(parts.query)["challenge"][0]
                proof = hmac.new(nonce.encode(), challenge.encode(), hashlib.sha256).hexdigest()
                self._reply({"proof": proof})
            else:
                self._reply({"server": {"limits": {}}})

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self._note()
            self._reply({"answers": []})

        def log_message(self, *args):
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(http.server_address[1], flush=True)
    http.serve_forever()
    """
)


class StandIn:
    """A running stand-in serve process: its URL, pid and the requests it got."""

    def __init__(self, folder: Path, nonce: str = NONCE) -> None:
        script = folder / "bin" / "bertknn-search"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(STAND_IN)
        self.record = folder / f"requests-{nonce[:6]}.jsonl"
        self.record.touch()
        self.proc = subprocess.Popen(
            [sys.executable, str(script), "serve", nonce, str(self.record)], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def seen(self) -> list[list[Any]]:
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[StandIn]:
    server = StandIn(tmp_path)
    yield server
    server.close()


class Recorder(LoopbackServer):
    """Any HTTP server on 127.0.0.1 that records what reaches it (a forged file's target)."""

    def __init__(self, status: int = 200, location: str | None = None) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        seen = self.seen

        class Handler(QuietHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                seen.append((self.command, self.path, self.headers.get("Authorization")))
                data = json.dumps({"server": {"limits": {}}, "answers": [], "proof": "x"}).encode()
                self.send_response(status)
                if location is not None:
                    self.send_header("Location", location)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

        super().__init__(Handler)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    yield server
    server.close()


def cli(*args: Any, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def write(path: Path, url: str, pid: int, nonce: str = NONCE, host: str | None = None) -> Path:
    body = {"url": url, "pid": pid, "host": host or socket.gethostname(), "nonce": nonce}
    path.write_text(json.dumps(body))
    return path


def token_file(tmp_path: Path) -> Path:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    return token


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# -- what is trusted -----------------------------------------------------------------------------------
def test_a_serve_process_that_proves_its_nonce_is_found_and_asked(stand_in: StandIn, tmp_path: Path) -> None:
    index = tmp_path / "index"
    index.mkdir()
    write(index / discovery.FILE, stand_in.url, stand_in.proc.pid)
    assert discovery.find(index) == discovery.Serving(stand_in.url, stand_in.proc.pid)
    result = cli(
        "query", "--server", "auto", "--index", index, "--token-file", token_file(tmp_path), QUESTION
    )
    assert result.exit_code == 0, result.output
    assert stand_in.seen()[-1] == ["/query", "Bearer s3cret"]
    # The proof came first, asked without the token.
    assert stand_in.seen()[0] == ["/serving", None]


def test_a_file_naming_a_process_that_is_no_serve_is_removed_and_nothing_is_sent(
    recorder: Recorder, tmp_path: Path
) -> None:
    # The forgery: pid 1 always exists; the URL is another server.
    for pid in (1, os.getpid(), dead_pid()):
        path = write(tmp_path / discovery.FILE, recorder.url, pid)
        result = cli(
            "query", "--server", "auto", "--index", tmp_path, "--token-file", token_file(tmp_path), QUESTION
        )
        assert result.exit_code == 2
        assert f"removed {path}: its server (pid {pid}) is no longer running" in result.stderr
        assert "no server is serving this --index" in result.output
        assert not path.exists()
    assert recorder.seen == []


@pytest.mark.parametrize(
    "url",
    [
        "http://192.0.2.7:8000",
        "https://127.0.0.1:8000",
        "file:///etc/passwd",
        "http://127.0.0.1",
        "http://example.com:8000",
        "http://127.0.0.1:8000/elsewhere",
        "http://127.0.0.1:notaport",
    ],
)
def test_a_file_naming_anything_but_a_loopback_http_url_is_ignored(
    url: str, stand_in: StandIn, tmp_path: Path
) -> None:
    path = write(tmp_path / discovery.FILE, url, stand_in.proc.pid)
    said: list[str] = []
    assert discovery.find(tmp_path, said.append) is None
    assert len(said) == 1 and said[0].startswith(f"ignored {path}: its URL")
    assert stand_in.seen() == []


def test_a_serve_that_does_not_hold_the_nonce_is_not_trusted(tmp_path: Path) -> None:
    # A serve process lives under the pid, but the file's nonce is not its own: a reused pid or port.
    other = StandIn(tmp_path, nonce="f" * 32)
    try:
        write(tmp_path / discovery.FILE, other.url, other.proc.pid, nonce=NONCE)
        result = cli(
            "query", "--server", "auto", "--index", tmp_path, "--token-file", token_file(tmp_path), QUESTION
        )
        assert result.exit_code == 2
        assert "is not the server that wrote it (its nonce does not match)" in result.stderr
        assert other.seen() == [["/serving", None]]  # asked for its proof only: no question, no token
    finally:
        other.close()


def test_a_file_of_another_machine_is_left_alone_in_silence(stand_in: StandIn, tmp_path: Path) -> None:
    path = write(tmp_path / discovery.FILE, stand_in.url, stand_in.proc.pid, host=socket.gethostname() + "-x")
    said: list[str] = []
    assert discovery.find(tmp_path, said.append) is None
    assert said == [] and path.exists()


def test_a_damaged_or_older_file_is_ignored_with_a_line(tmp_path: Path) -> None:
    path = tmp_path / discovery.FILE
    for damaged in ("{", "[]", json.dumps({"url": "http://127.0.0.1:1", "pid": 5, "host": "h"})):
        path.write_text(damaged)
        said: list[str] = []
        assert discovery.find(tmp_path, said.append) is None
        assert said == [f"ignored {path}: not an announcement this version writes"]


def test_plain_query_says_a_trusted_server_serves_its_index(stand_in: StandIn, tmp_path: Path) -> None:
    write(tmp_path / discovery.FILE, stand_in.url, stand_in.proc.pid)
    result = cli("query", "--index", tmp_path, QUESTION)
    assert result.stderr.splitlines()[0] == (
        f"a server is serving this index at {stand_in.url}: --server {stand_in.url} (or --server auto)"
        " answers there without loading the model here"
    )


def test_the_announcement_is_this_users_only_and_withdrawn_by_its_writer(tmp_path: Path) -> None:
    path = discovery.announce(tmp_path / discovery.FILE, "http://127.0.0.1:8123", NONCE)
    assert path == tmp_path / discovery.FILE
    assert path.stat().st_mode & 0o077 == 0
    assert json.loads(path.read_text())["nonce"] == NONCE
    discovery.withdraw(path)
    assert not path.exists()
    assert discovery.announce(tmp_path / "not-an-index" / discovery.FILE, "http://127.0.0.1:1", NONCE) is None


# -- on an engine --------------------------------------------------------------------------------------
def test_an_engine_index_is_announced_by_its_url_and_prefix(
    stand_in: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    engine = "http://127.0.0.1:9"  # nothing listens: the question must go to the server, not the engine
    place = discovery.announcement("opensearch", Path("unused"), engine + "/", "team")
    assert place is not None and place.parent == tmp_path / "bertknn-search"
    assert place == discovery.announcement("opensearch", Path("other"), engine, "team")
    assert place != discovery.announcement("opensearch", Path("unused"), engine, "other-prefix")
    assert place != discovery.announcement("elasticsearch", Path("unused"), engine, "team")
    assert discovery.announce(place, stand_in.url, NONCE) == place
    write(place, stand_in.url, stand_in.proc.pid)  # as the stand-in's own process would have
    where = ("--backend", "opensearch", "--opensearch-url", engine)
    missed = cli("query", "--server", "auto", *where, "--index-prefix", "other", QUESTION)
    assert missed.exit_code == 2
    assert "no server is serving this --index-prefix on opensearch" in missed.output
    result = cli("query", "--server", "auto", *where, "--index-prefix", "team", QUESTION)
    assert result.exit_code == 0, result.output
    assert stand_in.seen()[-1] == ["/query", None]


# -- the token and redirects ---------------------------------------------------------------------------
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_the_token_never_follows_a_redirect(status: int, recorder: Recorder, tmp_path: Path) -> None:
    redirecting = Recorder(status, location=recorder.url + "/query")
    try:
        for questions in ([QUESTION], [QUESTION, QUESTION]):  # one: POST /query; two: GET /stats first
            result = cli(
                "query", "--server", redirecting.url, "--token-file", token_file(tmp_path), *questions
            )
            assert result.exit_code == 1
            assert result.output.strip().splitlines() == [
                f"Error: server at {redirecting.url} answered {status} (a redirect to {recorder.url}/query);"
                " nothing was sent there: give --server the URL of the server itself"
            ]
    finally:
        redirecting.close()
    assert recorder.seen == []


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://127.0.0.1:21", "is not an http:// or https:// URL"),
        ("file:///etc/passwd", "is not an http:// or https:// URL"),
        ("http://127.0.0.1:notaport", "is not a URL"),
        ("http://[::1", "is not a URL"),
        ("http://:8000", "names no host and port"),
    ],
)
def test_a_server_url_that_is_no_http_url_is_one_line(url: str, why: str) -> None:
    result = cli("query", "--server", url, QUESTION)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and why in lines[0] and "Traceback" not in result.output


# -- the real server's side ----------------------------------------------------------------------------
def test_the_server_proves_its_nonce_without_a_token() -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertknn_search.config import Config
    from bertknn_search.server.app import ServerSettings, create_app

    settings = ServerSettings(Config(), token="t0ken-t0ken", nonce=NONCE)

    def never() -> Any:
        raise RuntimeError("no model in this test")

    client = TestClient(create_app(settings, never), base_url="http://127.0.0.1:8000")
    challenge = "c" * 32
    reply = client.get("/serving", params={"challenge": challenge})
    assert reply.status_code == 200
    assert reply.json()["proof"] == discovery.proof(NONCE, challenge)
    assert client.get("/serving", params={"challenge": "short"}).status_code == 422


# -- a real serve over a real engine -------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.opensearch
def test_query_server_auto_finds_a_serve_over_an_engine(
    cluster_config: Any, corpus: Path, facts: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bertknn_search.ingest.pipeline import ingest

    ingest(corpus, cluster_config, progress=False)
    backend = cluster_config.backend
    url = getattr(cluster_config, f"{backend}_url")
    where = [
        "--backend",
        backend,
        f"--{backend}-url",
        url,
        "--index-prefix",
        cluster_config.opensearch_prefix,
    ]
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "bertknn_search", "serve", *where, "--port", "0", "--temperature", "1"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        log = []
        for line in proc.stderr:
            log.append(line)
            if "ready: " in line:
                break
        else:
            pytest.fail("serve ended before it was ready:\n" + "".join(log))
        assert (
            f"loading the model for index prefix '{cluster_config.opensearch_prefix}' on {backend}" in log[0]
        )
        served = line.split("ready: ")[1].split()[0]
        f = facts[0]
        question = f"{f.person.title()} was born in [MASK]."
        result = cli("query", "--server", "auto", *where, "--subject", f.person.title(), "--json", question)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout.splitlines()[0])["bert_knn"][0]["word"] == f.city
        with urllib.request.urlopen(served + "/stats", timeout=60) as reply:
            assert json.loads(reply.read())["server"]["questions"] == 1  # answered there, not here
    finally:
        proc.terminate()
        proc.wait(120)
    assert list((tmp_path / "bertknn-search").glob("serving-*.json")) == []  # withdrawn when it stopped
