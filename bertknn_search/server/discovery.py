"""A serving server's address, in a small file beside its index, so that ``query`` can point to it.

``serve`` writes ``serving.json`` (URL, pid, host name) into an index folder once the model is loaded
and removes it when it stops; ``query`` reads it (standard library only, before anything heavy loads)
and says that ``--server`` answers without loading the model. A file left by a server that died is
ignored: its pid must be alive on this machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

FILE = "serving.json"


@dataclass(frozen=True)
class Serving:
    """A server that serves an index: where to ask it, and its process."""

    url: str
    pid: int


def client_url(host: str, port: int) -> str:
    """The URL a program on this machine asks a server bound to ``host`` by (a wildcard: loopback)."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def announce(index: Path, url: str) -> Path | None:
    """Write the file for this process (replacing any); None where the index is no folder or is
    read-only to this user (a server then serves, unannounced)."""
    if not index.is_dir():
        return None
    path = index / FILE
    body = json.dumps({"url": url, "pid": os.getpid(), "host": socket.gethostname()})
    temp = path.with_name(f".{FILE}.{os.getpid()}")
    try:
        temp.write_text(body + "\n", encoding="utf-8")
        os.replace(temp, path)  # whole or absent: a reader never sees half a file
    except OSError:
        with contextlib.suppress(OSError):
            temp.unlink()
        return None
    return path


def withdraw(index: Path) -> None:
    """Remove the file if this process wrote it (another server may have announced itself since)."""
    found = _read(index / FILE)
    if found is not None and found[0].pid == os.getpid():
        with contextlib.suppress(OSError):
            (index / FILE).unlink()


def find(index: Path) -> Serving | None:
    """The server that announced itself for ``index`` and still runs on this machine, else None."""
    found = _read(index / FILE)
    if found is None:
        return None
    serving, host = found
    if host != socket.gethostname() or not _alive(serving.pid):
        return None  # another machine's (a shared disk), or a server that died without removing it
    return serving


def _read(path: Path) -> tuple[Serving, str] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        url, pid, host = data["url"], data["pid"], data["host"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(url, str) or not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    return Serving(url, pid), str(host)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, as another user
    except OSError:
        return False
    return True
