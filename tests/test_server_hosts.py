"""Who may reach the server: the Host (and Origin) check against DNS rebinding, and the start-up rule that a
non-loopback --host needs --token-file or --open-writes."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs fastapi (pip install -e '.[test]')")
from click.testing import CliRunner
from fastapi import FastAPI
from fastapi.testclient import TestClient

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.errors import ConfigError
from bertknn_search.server.app import ServerSettings, create_app
from bertknn_search.server.hosts import HostCheck, allowed_names
from bertknn_search.server.run import exposed
from tests.test_server import assert_one_line, start, stored_ids

LOOPBACK = ["localhost", "LocalHost:8000", "localhost.", "127.0.0.1", "127.0.0.1:8000", "127.3.2.1"]
LOOPBACK += ["[::1]", "[::1]:8000", "[0:0:0:0:0:0:0:1]:8000"]
FOREIGN = ["attacker.example", "attacker.example:8000", "127.0.0.1.attacker.example", "testserver"]
FOREIGN += ["0.0.0.0:8000", "192.0.2.7", "[2001:db8::1]:8000", "localhost.attacker.example"]


def bare(*names: str) -> TestClient:
    """The check in front of an app that answers every path with 200."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST", "DELETE"])
    async def anything(path: str) -> dict[str, str]:
        return {"path": path}

    return TestClient(HostCheck(app, allowed_names(names)), base_url="http://localhost:8000")


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_names_are_answered_with_or_without_a_port(host: str) -> None:
    client = bare()
    assert client.get("/stats", headers={"Host": host}).status_code == 200
    assert client.post("/articles", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host", FOREIGN)
def test_a_foreign_host_is_refused_for_reads_and_writes(host: str) -> None:
    client = bare()
    for method, path in (("GET", "/stats"), ("POST", "/query"), ("POST", "/articles"), ("DELETE", "/a/1")):
        detail = assert_one_line(client.request(method, path, headers={"Host": host}), 421)
        assert "DNS rebinding" in detail and "--allowed-host" in detail


@pytest.mark.parametrize("host", ["a b", "[::1", "[::1]x", "::1", "host:8o", "a:1:2", ""])
def test_a_malformed_host_is_a_400(host: str) -> None:
    assert "Host header" in assert_one_line(bare().get("/", headers={"Host": host}), 400)


def test_allowed_hosts_and_their_normal_forms() -> None:
    client = bare("Bertknn.LAN", "[2001:DB8::1]", "192.0.2.7")
    for host in ("bertknn.lan", "BERTKNN.lan:8000", "[2001:db8:0::1]:80", "192.0.2.7:8000", "localhost"):
        assert client.get("/", headers={"Host": host}).status_code == 200, host
    assert_one_line(client.get("/", headers={"Host": "other.lan"}), 421)
    for bad in ("http://bertknn.lan", "bertknn.lan:8000", "a b", ""):
        with pytest.raises(ConfigError, match="--allowed-host"):
            allowed_names([bad])


def test_a_page_of_another_site_is_refused_by_its_origin() -> None:
    # A page may POST to http://localhost:8000 itself (a "simple" request: no preflight); Host is then
    # loopback, but the browser names the page's origin.
    client = bare("bertknn.lan")
    for origin in (
        "http://localhost:8000",
        "http://127.0.0.1:5173",
        "https://bertknn.lan",
        "http://[::1]:80",
    ):
        assert client.post("/articles", headers={"Origin": origin}).status_code == 200, origin
    for origin in ("https://attacker.example", "null", "file://", "http://[::1"):
        detail = assert_one_line(client.post("/articles", headers={"Origin": origin}), 403)
        assert "web pages" in detail


def test_a_request_without_host_passes() -> None:
    # HTTP/1.0 clients and some health checks send none; browsers always do.
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        sent.append({"app": True})

    async def collect(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "headers": [(b"accept", b"*/*")]}
    asyncio.run(HostCheck(app, frozenset())(scope, None, collect))
    assert sent == [{"app": True}]


# -- the server ----------------------------------------------------------------------------------------
def test_the_issues_rebinding_write_is_refused_and_local_writes_stay_open(index_copy: Config) -> None:
    """The issue's request: no token, Host attacker.example and a matching Origin; it was accepted."""
    body = {"articles": [{"id": "901", "title": "Plim", "text": "Plim was born in Sarnith."}]}
    rebound = {"Host": "attacker.example:8000", "Origin": "http://attacker.example:8000"}
    with TestClient(create_app(ServerSettings(index_copy)), base_url="http://127.0.0.1:8000") as client:
        start(client)
        assert_one_line(client.post("/articles", json=body, headers=rebound), 421)
        assert_one_line(client.delete("/articles/100", headers=rebound), 421)
        assert_one_line(client.post("/query", json={"question": "a [MASK]."}, headers=rebound), 421)
        assert "901" not in stored_ids(index_copy) and "100" in stored_ids(index_copy)
        # Without a token, a loopback server still takes writes from the machine's own programs.
        assert client.post("/articles", json=body).status_code == 200
        assert client.delete("/articles/100").status_code == 200
    assert "901" in stored_ids(index_copy) and "100" not in stored_ids(index_copy)


def test_the_bound_address_joins_the_allowed_names() -> None:
    settings = ServerSettings(Config(), allowed_hosts=("Bertknn.lan",))
    assert exposed(settings, "127.0.0.1", False).allowed_hosts == ("127.0.0.1", "bertknn.lan")
    assert exposed(settings, "::1", False).allowed_hosts == ("::1", "bertknn.lan")
    with_token = ServerSettings(Config(), token="t")
    assert exposed(with_token, "192.0.2.7", False).allowed_hosts == ("192.0.2.7",)
    assert exposed(with_token, "0.0.0.0", False).allowed_hosts == ()  # names no host
    assert exposed(with_token, "::", False).allowed_hosts == ()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "bertknn.lan"])
def test_a_public_host_without_a_token_needs_open_writes(host: str, caplog: pytest.LogCaptureFixture) -> None:
    settings = ServerSettings(Config())
    with pytest.raises(ConfigError, match=r"--token-file.*--open-writes"):
        exposed(settings, host, False)
    with caplog.at_level(logging.WARNING, logger="bertknn_search.server"):
        exposed(settings, host, True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "--open-writes" in warnings[0] and "\n" not in warnings[0]


def serve(*args: Any) -> Any:
    return CliRunner().invoke(main, ["serve", *map(str, args)], catch_exceptions=False)


def test_serve_refuses_a_public_host_without_a_token(
    built_index: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import uvicorn

    started: list[int] = []

    def run(self: Any, sockets: list[Any]) -> None:  # stands in for serving: the socket is bound
        started.append(sockets[0].getsockname()[1])
        sockets[0].close()

    monkeypatch.setattr(uvicorn.Server, "run", run)
    common = ["--index", built_index.index, "--port", 0, "--host", "0.0.0.0"]
    refused = serve(*common)
    assert refused.exit_code == 1 and not started
    lines = refused.output.strip().splitlines()
    assert len(lines) == 1 and "--token-file" in lines[0] and "--open-writes" in lines[0]
    bad = serve("--index", built_index.index, "--allowed-host", "http://bertknn.lan")
    assert bad.exit_code == 1 and "--allowed-host 'http://bertknn.lan'" in bad.output and not started

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)  # serve refuses a token file that others can read
    assert serve(*common, "--token-file", token).exit_code == 0 and len(started) == 1
    with caplog.at_level(logging.WARNING, logger="bertknn_search.server"):
        assert serve(*common, "--open-writes").exit_code == 0 and len(started) == 2
    assert any("--open-writes: anyone who can reach 0.0.0.0" in r.getMessage() for r in caplog.records)
