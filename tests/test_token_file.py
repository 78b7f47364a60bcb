"""``serve --token-file``: a file others can read is refused in one line naming ``chmod 600``; a file
``serve`` writes itself is created 0600, with no moment at a wider mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bertknn_search.cli import main
from bertknn_search.config import Config
from bertknn_search.errors import ConfigError
from bertknn_search.server.token_file import serve_token

pytestmark = pytest.mark.skipif(os.name != "posix", reason="file modes")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602])
def test_a_token_file_others_can_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(mode)
    with pytest.raises(ConfigError, match=rf"chmod 600 {token}") as refused:
        serve_token(token)
    assert f"mode {mode:04o}" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
def test_a_token_file_only_its_owner_reads_is_read(tmp_path: Path, mode: int) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\nsecond line\n")
    token.chmod(mode)
    assert serve_token(token) == ("s3cret", False)


def test_the_mode_checked_is_the_file_read_through_a_link(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.write_text("s3cret\n")
    shared.chmod(0o644)
    link = tmp_path / "token"
    link.symlink_to(shared)
    with pytest.raises(ConfigError, match="chmod 600"):
        serve_token(link)


def test_a_fifo_in_its_place_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "token"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ConfigError, match="not a regular file"):
        serve_token(fifo)


def test_a_missing_token_file_is_created_0600_from_the_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    opened: list[tuple[int, int]] = []
    real_open = os.open

    def spy(path: Any, flags: int, mode: int = 0o777, *rest: Any, **extra: Any) -> int:
        if Path(path) == token:
            opened.append((flags, mode))
        return real_open(path, flags, mode, *rest, **extra)

    monkeypatch.setattr(os, "open", spy)
    old = os.umask(0)  # the widest umask: the mode must come from the open, not from a umask
    try:
        secret, created = serve_token(token)
    finally:
        os.umask(old)
    assert created and len(secret) >= 32
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    create = [(flags, mode) for flags, mode in opened if flags & os.O_CREAT]
    assert create == [(create[0][0], 0o600)] and create[0][0] & os.O_EXCL
    assert token.read_text() == secret + "\n"
    assert serve_token(token) == (secret, False)  # read back by the next start


def test_serve_refuses_a_readable_token_file_in_one_line(
    built_index: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    started: list[int] = []

    def run(self: Any, sockets: list[Any]) -> None:  # stands in for serving
        started.append(1)
        sockets[0].close()

    monkeypatch.setattr(uvicorn.Server, "run", run)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o644)
    args = ["serve", "--index", str(built_index.index), "--port", "0", "--token-file", str(token)]
    refused = CliRunner().invoke(main, args)
    lines = refused.output.strip().splitlines()
    assert refused.exit_code == 1 and not started and "Traceback" not in refused.output
    assert len(lines) == 1 and f"chmod 600 {token}" in lines[0]
    token.chmod(0o600)
    assert CliRunner().invoke(main, args).exit_code == 0 and started == [1]
    fresh = tmp_path / "new-token"
    made = CliRunner().invoke(main, [*args[:-1], str(fresh)])
    assert made.exit_code == 0 and started == [1, 1]
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600 and "wrote a new token" in made.output
