"""``/health`` says ``degraded`` (503, with the reason) while the engine of an index cannot be reached,
instead of ``ready`` while every question fails after its retries (issue 42)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi", reason="the server needs fastapi (pip install -e '.[test]')")
from fastapi.testclient import TestClient

from bertknn_search.config import Config
from bertknn_search.server.app import ServerSettings, create_app, engine_problem


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def on_engine(backend: str, url: str) -> Config:
    return Config(backend=backend, **{f"{backend}_url": url})  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["opensearch", "elasticsearch"])
def test_an_engine_that_accepts_no_connection_is_a_reason(backend: str, listening: int) -> None:
    port = closed_port()
    said = engine_problem(on_engine(backend, f"http://127.0.0.1:{port}"))
    assert said == f"the {backend} engine at http://127.0.0.1:{port} cannot be reached (Connection refused)"
    assert engine_problem(on_engine(backend, f"http://127.0.0.1:{listening}")) is None
    # One node of a list that answers is enough.
    assert engine_problem(on_engine(backend, f"http://127.0.0.1:{port},http://127.0.0.1:{listening}")) is None
    assert engine_problem(Config()) is None  # the embedded store: nothing to reach


def test_health_is_degraded_while_the_engine_is_down(listening: int) -> None:
    config = on_engine("opensearch", f"http://127.0.0.1:{closed_port()}")
    app = create_app(ServerSettings(config), open_searcher=lambda: None)  # type: ignore[arg-type,return-value]
    app.state.batcher.status = lambda: ("ready", "the model is loaded")  # as once the model is loaded
    client = TestClient(app, base_url="http://127.0.0.1:8000")
    reply = client.get("/health")
    assert reply.status_code == 503
    assert reply.json()["status"] == "degraded"
    assert reply.json()["detail"] == (
        f"the model is loaded, but the opensearch engine at {config.opensearch_url} cannot be reached"
        " (Connection refused); questions fail until it is back"
    )
    up = create_app(ServerSettings(on_engine("opensearch", f"http://127.0.0.1:{listening}")), lambda: None)  # type: ignore[arg-type,return-value]
    up.state.batcher.status = lambda: ("ready", "the model is loaded")
    reply = TestClient(up, base_url="http://127.0.0.1:8000").get("/health")
    assert reply.status_code == 200 and reply.json()["status"] == "ready"
