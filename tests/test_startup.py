"""What a command imports before it answers, ``query --server``'s token, and the serving-file discovery.

Speed is measured by benchmarks/bench_startup.py; these tests check the behaviour that makes it: the
paths that need no model import no numpy, torch, transformers or pydantic (each in a fresh interpreter),
the token reaches the server, and a query finds a server that serves its index.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.server import discovery
from tests.loopback import LoopbackServer, QuietHandler

HEAVY = ("numpy", "torch", "transformers", "pydantic", "fastapi", "scipy", "pyarrow", "faiss")
# Runs the CLI in a fresh interpreter, as the program would, and says which heavy modules it imported.
PROBE = f"""
import json, sys
from bertknn_search.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
except BaseException as exc:
    print(type(exc).__name__, str(exc), file=sys.stderr)
print("HEAVY=" + json.dumps([m for m in {HEAVY!r} if m in sys.modules]))
"""
QUESTION = "Zorblat was born in [MASK]."


def imported(*args: str, env: dict[str, str] | None = None) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("HEAVY="))
    return list(json.loads(line.removeprefix("HEAVY=")))


class FakeServer(LoopbackServer):
    """A stand-in for ``serve`` on 127.0.0.1: records each request's path and Authorization header;
    /stats says ``limits`` and /query answers nothing (an empty list)."""

    def __init__(self, limits: dict[str, Any]) -> None:
        self.seen: list[tuple[str, str | None, int]] = []  # path, Authorization, questions
        seen, stats = self.seen, {"server": {"limits": limits}}

        class Handler(QuietHandler):
            def _reply(self, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                seen.append((self.path, self.headers.get("Authorization"), 0))
                self._reply(stats)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seen.append((self.path, self.headers.get("Authorization"), len(body["questions"])))
                self._reply({"answers": []})

        super().__init__(Handler)


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer({"questions": 2, "lifted-by-token": True})
    yield server
    server.close()


def cli(*args: Any, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


# -- what is imported ----------------------------------------------------------------------------------
def test_help_imports_nothing_heavy() -> None:
    assert imported("--help") == []


def test_a_refused_question_imports_nothing_heavy() -> None:
    assert imported("query", "--index", "/nonexistent/index", "no mask here") == []


def test_query_server_imports_no_numpy_torch_or_schemas(fake: FakeServer) -> None:
    assert imported("query", "--server", fake.url, QUESTION, QUESTION) == []
    assert [path for path, _, _ in fake.seen] == ["/stats", "/query"]


# -- the token -----------------------------------------------------------------------------------------
def test_query_server_sends_the_token_file(fake: FakeServer, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\nignored second line\n")
    result = cli("query", "--server", fake.url, "--token-file", token, QUESTION)
    assert result.exit_code == 0, result.output
    assert fake.seen == [("/query", "Bearer s3cret", 1)]


def test_the_token_file_may_come_from_the_environment(fake: FakeServer, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("from-env\n")
    result = cli("query", "--server", fake.url, QUESTION, env={"BERTKNN_TOKEN_FILE": str(token)})
    assert result.exit_code == 0, result.output
    assert fake.seen == [("/query", "Bearer from-env", 1)]


def test_without_a_token_nothing_is_sent_and_the_limits_split_the_questions(fake: FakeServer) -> None:
    result = cli("query", "--server", fake.url, QUESTION, QUESTION, QUESTION)
    assert result.exit_code == 0, result.output
    assert sorted(fake.seen) == [("/query", None, 1), ("/query", None, 2), ("/stats", None, 0)]


def test_a_token_that_lifts_the_limits_sends_the_questions_at_once(fake: FakeServer, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    result = cli("query", "--server", fake.url, "--token-file", token, QUESTION, QUESTION, QUESTION)
    assert result.exit_code == 0, result.output
    assert fake.seen == [("/stats", "Bearer s3cret", 0), ("/query", "Bearer s3cret", 3)]


def test_token_file_errors_are_one_line(fake: FakeServer, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    result = cli("query", "--server", fake.url, "--token-file", empty, QUESTION)
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: --token-file {empty} is empty; write the token on its first line"
    alone = cli("query", "--token-file", empty, "--index", tmp_path / "none", QUESTION)
    assert alone.exit_code == 2
    assert "--token-file goes with --server" in alone.output and "Traceback" not in alone.output
    assert fake.seen == []


# -- discovery (the trust rules of serving.json: tests/test_discovery.py) ------------------------------
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "127.0.0.1", "::1"])
def test_the_announced_url_is_one_this_machine_can_ask(host: str) -> None:
    expected = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "127.0.0.1": "127.0.0.1", "::1": "[::1]"}[host]
    assert discovery.client_url(host, 8000) == f"http://{expected}:8000"


def test_the_token_variable_does_not_stop_a_question_answered_here(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    result = cli("query", "--index", tmp_path / "none", QUESTION, env={"BERTKNN_TOKEN_FILE": str(token)})
    assert result.exit_code == 1
    assert "--token-file" not in result.output and "no index" in result.output.lower()


# -- a warm question on a BERT checkpoint (issue 41) -----------------------------------------------------
LIBRARIES = ("transformers", "torch", "tokenizers", "safetensors")
WARM = f"""
import json, sys
from bertknn_search.cli import main
main(sys.argv[1:], standalone_mode=False)
print("LOADED=" + json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set({LIBRARIES!r}))))
"""


def loaded_by_question(*args: Any) -> tuple[list[str], str]:
    out = subprocess.run(
        [sys.executable, "-c", WARM, *(str(a) for a in args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BERTKNN_RUNTIME": ""},
    )
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("LOADED="))
    return list(json.loads(line.removeprefix("LOADED="))), out.stdout


def test_a_warm_question_on_a_bert_checkpoint_imports_no_transformers_module(built_index: Any) -> None:
    loaded, answer = loaded_by_question("query", "--index", built_index.index, "--json", QUESTION)
    assert "transformers" not in loaded
    assert {"torch", "tokenizers", "safetensors"} <= set(loaded)  # it did run the model
    assert json.loads(answer.splitlines()[0])["question"] == QUESTION
    # The probe sees transformers where it is imported: the reference runtime, forced.
    forced, _ = loaded_by_question(
        "query", "--index", built_index.index, "--runtime", "transformers", "--json", QUESTION
    )
    assert "transformers" in forced
