"""No HTTP client of the project follows a redirect with credentials (issue 42): ``query --server``'s is
tested in test_discovery.py; the engines' clients (opensearch-py, elasticsearch-py) send their basic
auth only to the URL they were given, never to a ``Location`` it names."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from bertknn_search.backends.engines import dialect_for
from bertknn_search.config import Config
from tests.test_discovery import Recorder


@pytest.fixture
def target() -> Iterator[Recorder]:
    server = Recorder()
    yield server
    server.close()


@pytest.mark.parametrize("name", ["opensearch", "elasticsearch"])
@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_an_engine_client_never_follows_a_redirect_with_its_credentials(
    name: str, status: int, target: Recorder
) -> None:
    redirecting = Recorder(status, location=target.url + "/")
    try:
        config = Config(
            backend=name, **{f"{name}_url": redirecting.url, f"{name}_user": "u", f"{name}_password": "pw"}
        )  # type: ignore[arg-type]
        client = dialect_for(name).client(config)
        with contextlib.suppress(
            Exception
        ):  # what it raises is the engine layer's; where it went is this test's
            client.info()
        assert redirecting.seen and redirecting.seen[0][2] is not None  # it did send them, to its own URL
    finally:
        redirecting.close()
    assert target.seen == []
