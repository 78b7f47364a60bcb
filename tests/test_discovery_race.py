"""Discovery reads the one file it checked (a link swapped for a file in between sends nothing), and
``--server auto`` waits for a server that announced itself as starting instead of saying there is none.

The servers are the stand-ins of ``test_discovery`` (a script named ``bertknn-search`` run with
``serve``); the real ``serve``'s "starting" announcement is checked with a model load that fails on cue.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bertknn_search.server import discovery
from tests.test_discovery import NONCE, QUESTION, StandIn, cli, token_file, write

query_cli = importlib.import_module("bertknn_search.cli.query")  # the package's name is the command's

# Swaps ``path`` between a link to the victim's own file and the attacker's file, each by an atomic
# rename, until ``stop`` exists (or 60 s, should the test die).
SWAPPER = textwrap.dedent(
    """
    import os, sys, time
    path, victim, forged, stop = sys.argv[1:5]
    end = time.monotonic() + 60
    link, copy = path + ".link", path + ".copy"
    while not os.path.exists(stop) and time.monotonic() < end:
        for temp in (link, copy):
            try:
                os.unlink(temp)
            except FileNotFoundError:
                pass
        os.symlink(victim, link)
        os.replace(link, path)
        os.link(forged, copy)
        os.replace(copy, path)
    """
)


@pytest.fixture
def attacker(tmp_path: Path) -> Iterator[StandIn]:
    server = StandIn(tmp_path / "attacker", nonce="a" * 32)
    yield server
    server.close()


def test_a_link_swapped_for_a_file_during_discovery_never_sends_a_thing(
    attacker: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One user stands in for two: the victim's file is the one inode "this user" owns; the attacker's
    # announcement (her own serve, her nonce, her loopback URL) is anything else.
    victim = tmp_path / "victims-own-file"
    victim.write_text("not an announcement\n")
    victim_inode = victim.stat().st_ino
    monkeypatch.setattr(discovery, "_owned", lambda info: info.st_ino == victim_inode)
    index = tmp_path / "index"
    index.mkdir()
    forged = write(tmp_path / "forged.json", attacker.url, attacker.proc.pid, nonce="a" * 32)
    path, stop = index / discovery.FILE, tmp_path / "stop"
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(path), str(victim), str(forged), str(stop)]
    )
    said: list[str] = []
    found, tries, end = [], 0, time.monotonic() + 15
    try:
        while tries < 20_000 and time.monotonic() < end:
            serving = discovery.find(index, said.append)
            if serving is not None:
                found.append(serving)
            tries += 1
    finally:
        stop.touch()
        swapper.wait(timeout=30)
    assert tries >= 2_000, f"only {tries} tries in 15 s"
    assert found == [] and attacker.seen() == []  # no proof asked of her server, so no question, no token
    # Both sides of the swap were met, each refused for what it is.
    assert any(
        line.endswith("it is a link (an announcement is a file its server wrote there)") for line in said
    )
    assert any("it belongs to another user" in line for line in said)


def test_a_link_fifo_or_group_writable_file_is_refused_in_one_line(stand_in: StandIn, tmp_path: Path) -> None:
    real = write(tmp_path / "real.json", stand_in.url, stand_in.proc.pid)
    index = tmp_path / "index"
    index.mkdir()
    path = index / discovery.FILE
    path.symlink_to(real)
    said: list[str] = []
    assert discovery.find(index, said.append) is None
    assert said == [f"ignored {path}: it is a link (an announcement is a file its server wrote there)"]
    path.unlink()
    os.mkfifo(path)  # opening a FIFO must not hang discovery
    said.clear()
    assert discovery.find(index, said.append) is None
    assert said == [f"ignored {path}: it is not a regular file"]
    path.unlink()
    write(path, stand_in.url, stand_in.proc.pid).chmod(0o666)
    said.clear()
    assert discovery.find(index, said.append) is None
    assert said == [f"ignored {path}: group or others may write it (an announcement is its owner's only)"]
    assert stand_in.seen() == []


def test_announce_never_writes_through_a_link_at_its_temporary_name(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    (tmp_path / f".{discovery.FILE}.{os.getpid()}").symlink_to(target)
    assert discovery.announce(tmp_path / discovery.FILE, "http://127.0.0.1:8123", NONCE) is not None
    assert target.read_text() == "keep me\n"
    assert not (tmp_path / discovery.FILE).is_symlink()


# -- a server that is starting -------------------------------------------------------------------------
def starting(path: Path, server: StandIn) -> Path:
    body = json.loads(write(path, server.url, server.proc.pid).read_text())
    path.write_text(json.dumps({**body, "state": "starting"}))
    return path


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[StandIn]:
    server = StandIn(tmp_path)
    yield server
    server.close()


def test_server_auto_waits_for_a_starting_server_and_asks_it_once_ready(
    stand_in: StandIn, tmp_path: Path
) -> None:
    path = starting(tmp_path / discovery.FILE, stand_in)
    threading.Timer(1.5, lambda: write(path, stand_in.url, stand_in.proc.pid)).start()  # loaded
    result = cli(
        "query", "--server", "auto", "--index", tmp_path, "--token-file", token_file(tmp_path), QUESTION
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == (
        f"a server is starting at {stand_in.url} (loading the model); waiting up to"
        f" {query_cli.STARTING_WAIT_S:.0f} s"
    )
    assert "start one" not in result.output
    assert stand_in.seen()[-1] == ["/query", "Bearer s3cret"]


def test_server_auto_gives_up_on_a_server_still_starting_in_one_line(
    stand_in: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(query_cli, "STARTING_WAIT_S", 1.0)
    starting(tmp_path / discovery.FILE, stand_in)
    result = cli("query", "--server", "auto", "--index", tmp_path, QUESTION)
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == (
        f"Error: the server at {stand_in.url} is still loading its model after 1 s; retry in a minute"
        f" ('curl {stand_in.url}/health' says when it is ready)"
    )
    assert "start one" not in result.output and "Traceback" not in result.output
    assert [p for p, _ in stand_in.seen() if p != "/serving"] == []


def test_plain_query_says_a_server_is_starting(stand_in: StandIn, tmp_path: Path) -> None:
    starting(tmp_path / discovery.FILE, stand_in)
    result = cli("query", "--index", tmp_path, QUESTION)
    assert result.stderr.splitlines()[0] == (
        f"a server is starting at {stand_in.url} (loading the model): --server auto waits for it and"
        " answers there"
    )


# The real serve, its model load held until a file appears, then failing: it must announce itself as
# starting while it loads, and withdraw the announcement when the load fails.
HELD_SERVE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from bertknn_search.config import Config
    from bertknn_search.server import run
    from bertknn_search.server.app import ServerSettings

    index, gate = Path(sys.argv[2]), Path(sys.argv[3])
    real = run.create_app

    def held():
        while not gate.exists():
            time.sleep(0.05)
        raise RuntimeError("no model in this test")

    run.create_app = lambda settings: real(settings, held)
    run.serve(ServerSettings(Config(index=index)), "127.0.0.1", 0)
    """
)


@pytest.mark.slow
def test_serve_announces_itself_as_starting_while_its_model_loads(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    index, gate = tmp_path / "index", tmp_path / "gate"
    index.mkdir()
    script = tmp_path / "bin" / "bertknn-search"
    script.parent.mkdir()
    script.write_text(HELD_SERVE)
    proc = subprocess.Popen(
        [sys.executable, str(script), "serve", str(index), str(gate)], stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not (index / discovery.FILE).exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        serving = discovery.find(index)
        assert serving is not None and serving.starting and serving.pid == proc.pid
        gate.touch()
        assert discovery.wait_ready(index / discovery.FILE, 60) is None  # the load failed: withdrawn
        assert proc.wait(timeout=60) == 1
    finally:
        proc.kill()
        proc.wait()
