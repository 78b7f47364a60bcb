"""Engine URLs and connection mistakes, before and at the first request.

A URL is checked before a client is made: only http(s), a numeric port, a well-formed host; a comma list
names several nodes. Where nothing has ever answered at a URL a request is not retried: the mistake is
said in about a second with the fix (``engine start`` for a local URL, the other scheme, the other
``--backend``, what answered instead). No test here needs a real engine; those that do are in
``test_engine_errors.py``.
"""

from __future__ import annotations

import http.server
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bertknn_search.backends import open_backend
from bertknn_search.backends.engines import dialect_for
from bertknn_search.backends.engines.urls import node_urls, public_urls
from bertknn_search.config import Config
from bertknn_search.errors import BackendError, ConfigError
from tests.test_engine_faults import cli_command

pytestmark = pytest.mark.reliability


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://127.0.0.1:notaport", "could not be cast to integer"),
        ("http://[::1", "invalid ipv6 url"),
        ("http://127.0.0.1:99999", "out of range"),
        ("ftp://127.0.0.1:9200", "the scheme 'ftp'"),
        ("file:///etc/passwd", "the scheme 'file'"),
        ("127.0.0.1:9200", "no http:// or https://"),
        ("http://:9200", "no host"),
        ("http://bad host:9200", "'bad host' is not a host name"),
        ("http://127.0.0.1:9200,", "an empty entry"),
        ("http://127.0.0.1:0", "port 0"),
    ],
)
def test_a_malformed_url_is_one_line(url: str, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        node_urls(url, "OPENSEARCH_URL / --opensearch-url")
    line = str(refused.value)
    assert "\n" not in line and said in line.lower(), line
    assert line.startswith("OPENSEARCH_URL / --opensearch-url: "), line


def test_credentials_never_show() -> None:
    with pytest.raises(ConfigError) as refused:
        node_urls("http://admin:s3cret@host:notaport", "X")
    assert "s3cret" not in str(refused.value) and "admin" not in str(refused.value)
    assert public_urls("https://admin:s3cret@a:9200/,http://b:9201") == "https://a:9200,http://b:9201"


def test_a_comma_list_is_the_clients_hosts() -> None:
    nodes = node_urls(" http://10.0.0.1:9200 , https://[::1]:9201/prefix ,http://es-node_1", "X")
    assert [n.shown for n in nodes] == [
        "http://10.0.0.1:9200",
        "https://[::1]:9201/prefix",
        "http://es-node_1",
    ]
    for name in ("opensearch", "elasticsearch"):
        config = Config(backend=name, **{f"{name}_url": "http://127.0.0.1:9200,http://127.0.0.1:9201"})
        client = dialect_for(name).client(config)
        try:
            hosts = client_hosts(client)
        finally:
            client.close()
        assert hosts == [("127.0.0.1", 9200), ("127.0.0.1", 9201)], hosts


def client_hosts(client: Any) -> list[tuple[str, int]]:
    """(host, port) of every node a client spreads its requests over."""
    transport = client.transport
    pool = getattr(transport, "node_pool", None)
    if pool is not None:  # elastic_transport
        return sorted((n.config.host, n.config.port) for n in pool.all())
    found = [c.host.split("//")[-1].rsplit(":", 1) for c in transport.connection_pool.connections]
    return sorted((host, int(port)) for host, port in found)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("name", ["opensearch", "elasticsearch"])
def test_nothing_listening_is_said_at_once_with_engine_start(name: str) -> None:
    """No retries for a URL where nothing ever answered: one line in about a second, naming the
    command that starts a local node on that port (5 attempts took 12.8 s before)."""
    port = free_port()
    config = Config(backend=name, **{f"{name}_url": f"http://127.0.0.1:{port}"})
    started = time.monotonic()
    with pytest.raises(BackendError) as refused:
        open_backend(config)
    took = time.monotonic() - started
    line = str(refused.value)
    assert "\n" not in line and f"'bertknn-search engine start {name} --port {port}'" in line, line
    assert "after" not in line.split("(")[0], line  # one attempt, not several
    assert took < 3.0, f"{took:.1f} s"


class _Page(http.server.BaseHTTPRequestHandler):
    """Answers every GET with what ``serve`` answers at ``/``: its page."""

    page = (
        Path(__file__).resolve().parents[1] / "bertknn_search" / "server" / "static" / "index.html"
    ).read_bytes()

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/" else 404)
        self.send_header("content-type", "text/html; charset=utf-8")
        self.send_header("server", "uvicorn")
        self.end_headers()
        self.wfile.write(self.page if self.path == "/" else b'{"detail":"Not Found"}')

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def page_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("name", ["opensearch", "elasticsearch"])
def test_a_url_that_is_no_engine_names_what_answered(name: str, page_server: str) -> None:
    """The ``serve`` URL given as an engine's: said as such (it was "build an index" before)."""
    config = Config(backend=name, **{f"{name}_url": page_server})
    with pytest.raises((BackendError, ConfigError)) as refused:
        open_backend(config)
    line = str(refused.value)
    assert "\n" not in line and "a bertknn-search server ('bertknn-search serve')" in line, line
    assert "ingest" not in line, line


@pytest.mark.parametrize("scheme", ["https"])
def test_https_on_a_plain_http_node_says_use_http(scheme: str, page_server: str) -> None:
    url = page_server.replace("http://", f"{scheme}://")
    config = Config(backend="opensearch", opensearch_url=url)
    with pytest.raises(BackendError) as refused:
        open_backend(config)
    line = str(refused.value)
    assert f"the node answers plain http, not https: use {page_server}" in line, line
    assert "OPENSEARCH_CA" not in line, line


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[str]:
    """A TLS server with a self-signed certificate (made by openssl): an https node's stand-in."""
    import shutil
    import ssl

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no certificate for the https stand-in")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("name", ["opensearch", "elasticsearch"])
def test_http_on_an_https_node_says_use_https(name: str, tls_server: str) -> None:
    config = Config(backend=name, **{f"{name}_url": tls_server})
    with pytest.raises(BackendError) as refused:
        open_backend(config)
    line = str(refused.value)
    secure = tls_server.replace("http://", "https://")
    assert f"the node speaks https: use {secure}" in line, line


def test_the_elasticsearch_url_example_is_its_own_port() -> None:
    with pytest.raises(ConfigError) as refused:
        open_backend(Config(backend="elasticsearch"))
    assert "e.g. http://localhost:9201" in str(refused.value)
    assert "engine start elasticsearch --port 9201" in str(refused.value)


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:notaport", "http://[::1", "ftp://127.0.0.1:9200", "http://a:9200,,http://b:9200"],
)
def test_the_cli_says_a_bad_url_in_one_line(url: str) -> None:
    run = subprocess.run(
        [*cli_command(), "stats", "--backend", "opensearch"],
        capture_output=True, text=True, timeout=120, env={"OPENSEARCH_URL": url, "PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    assert len(lines) == 1 and lines[0].startswith("Error: OPENSEARCH_URL"), run.stderr
