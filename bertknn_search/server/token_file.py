"""``serve --token-file``: a token only its owner can read, read from the file or written to a new one.

A token in a file that group or others can read is no secret on a shared machine (anyone there could
``cat`` it and write to the index), so ``serve`` refuses one, naming the ``chmod 600`` that fixes it.
The mode is checked on the descriptor it reads from, not by name, so a swap between the check and the
read cannot pass another file. A file that does not exist yet is created with a new random token, mode
0600 from the ``open`` itself: there is no moment at which it exists with a wider mode.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from bertknn_search.errors import ConfigError
from bertknn_search.server.wire import token_of

SHARED_BITS = 0o066  # group and others: read or write (execute bits alone expose nothing)


def serve_token(path: Path) -> tuple[str, bool]:
    """The token for ``serve --token-file path``, and whether this call created the file.

    Raises:
        ConfigError: group or others can read or write the file, it is not a regular file, or it cannot
            be read or created, or its first line is empty.
    """
    try:
        # O_NONBLOCK: a FIFO put in the file's place is refused below instead of hanging the open.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return _create(path), True
    except OSError as exc:
        raise ConfigError(f"cannot read --token-file {path}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as file:
        found = os.fstat(file.fileno())
        if not stat.S_ISREG(found.st_mode):
            raise ConfigError(f"--token-file {path} is not a regular file")
        if os.name == "posix" and found.st_mode & SHARED_BITS:
            raise ConfigError(
                f"--token-file {path} can be read or written by others (mode"
                f" {stat.S_IMODE(found.st_mode):04o}): run 'chmod 600 {path}' so that only you can"
            )
        try:
            text = file.read(64 * 1024).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read --token-file {path}: {exc}") from exc
    return token_of(text, path), False


def _create(path: Path) -> str:
    """A new random token in a new file at ``path``, created 0600 (O_EXCL: never one that appeared since)."""
    token = secrets.token_urlsafe(32)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot create --token-file {path}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(token + "\n")
    return token
