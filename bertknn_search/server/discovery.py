"""A serving server's address in a small file, so that ``query`` can find it (``--server auto``).

``serve`` writes an announcement (URL, pid, host name, a random nonce, and "starting" or "ready") once
it listens, again once the model is loaded, and removes it when it stops: ``serving.json`` inside an
embedded index's folder, or, for an index on an engine (no folder here), ``serving-<key>.json`` in a
per-user runtime folder, the key made of the backend, the engine URL and the index prefix. ``query``
reads it (standard library only, before anything heavy loads).

A file is trusted only when all of these hold, since whoever can write into an index folder could
otherwise send a user's questions and token to a server of theirs:

- it is a regular file (not a link), belongs to this user, as does the process it names, on this
  machine, and only this user may write it (checked on the one open descriptor it is read from);
- its URL is ``http`` to a loopback address with a port;
- its pid is a ``bertknn-search serve`` process (its command line says so);
- the server at the URL proves, on the token-free ``GET /serving``, that it holds the file's nonce: it
  answers a random challenge with HMAC-SHA256(nonce, challenge), before anything else is sent.

A file that fails these is ignored with one line; one whose server is gone (its pid no longer a serve
process) is removed as well.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import socket
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FILE = "serving.json"
PROBE_TIMEOUT_S = 3.0  # a loaded server answers GET /serving from its event loop in milliseconds
Say = Callable[[str], None]


@dataclass(frozen=True)
class Serving:
    """A server that serves an index: where to ask it, and its process."""

    url: str
    pid: int
    nonce: str = field(default="", compare=False, repr=False)
    starting: bool = field(default=False, compare=False)  # announced while its model loads


def client_url(host: str, port: int) -> str:
    """The URL a program on this machine asks a server bound to ``host`` by (a wildcard: loopback)."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def new_nonce() -> str:
    return secrets.token_hex(16)


def proof(nonce: str, challenge: str) -> str:
    """What a server holding ``nonce`` answers to ``challenge`` (``GET /serving?challenge=``)."""
    return hmac.new(nonce.encode(), challenge.encode(), hashlib.sha256).hexdigest()


def runtime_folder() -> Path:
    """This user's folder for the announcements of servers over an engine: $XDG_RUNTIME_DIR/bertknn-search,
    or ~/.cache/bertknn-search/serving where there is no runtime folder."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "bertknn-search"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bertknn-search" / "serving"


def announcement(backend: str, index: Path, engine_url: str | None, prefix: str) -> Path | None:
    """Where the server of an index announces itself: ``serving.json`` in an embedded index's folder; for
    an engine, a file named by the engine URL and the index prefix in ``runtime_folder()``. None for an
    engine index without a URL (it cannot be served either)."""
    if backend == "embedded":
        return index / FILE
    if not engine_url:
        return None
    parts = urllib.parse.urlsplit(engine_url.strip().rstrip("/"))
    where = urllib.parse.urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path, "", ""))
    key = hashlib.sha256(f"{backend}\n{where}\n{prefix}".encode()).hexdigest()[:20]
    return runtime_folder() / f"serving-{key}.json"


def announcement_for(config: Any) -> Path | None:
    """``announcement`` for a ``Config`` (read by attribute: this module imports nothing of the package)."""
    url = {"opensearch": config.opensearch_url, "elasticsearch": config.elasticsearch_url}.get(config.backend)
    return announcement(config.backend, config.index, url, config.opensearch_prefix)


def announce(path: Path, url: str, nonce: str, starting: bool = False) -> Path | None:
    """Write the announcement at ``path`` for this process (replacing any), readable by this user only;
    None where its folder is no folder, or is read-only to this user (a server then serves, unannounced).
    The per-user runtime folder is made when missing. ``starting``: the server listens but its model is
    still loading (``query --server auto`` waits for it)."""
    if path.name != FILE:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.parent.is_dir():
        return None
    state = "starting" if starting else "ready"
    body = json.dumps(
        {"url": url, "pid": os.getpid(), "host": socket.gethostname(), "nonce": nonce, "state": state}
    )
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(OSError):
        temp.unlink()  # a leftover of this pid's, or a link someone put there: never written through
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(body + "\n")
        os.replace(temp, path)  # whole or absent: a reader never sees half a file
    except OSError:
        with contextlib.suppress(OSError):
            temp.unlink()
        return None
    return path


def withdraw(path: Path) -> None:
    """Remove the announcement if this process wrote it (another server may have announced itself since)."""
    opened = _open(_file(path))
    if isinstance(opened, _Opened) and opened.serving is not None and opened.serving.pid == os.getpid():
        with contextlib.suppress(OSError):
            _file(path).unlink()


def find(path: Path | None, say: Say | None = None) -> Serving | None:
    """The server announced at ``path`` (an announcement, or an embedded index's folder), if it passes
    every check of this module's docstring; else None, ``say`` told why in one line where a file was
    there but not trusted.

    The file is opened once, without following a link, and its owner, mode and kind are checked on that
    open descriptor before its text is read from it: checking one file by name and reading another (a
    link swapped for a file between the two) would send the question and the token to someone else's
    server."""
    if path is None:
        return None
    path = _file(path)
    tell = say or (lambda _line: None)
    opened = _open(path)
    if opened is None:
        return None  # no announcement: the usual case
    if isinstance(opened, str):
        tell(f"ignored {path}: {opened}")
        return None
    serving = opened.serving
    if serving is None:
        tell(f"ignored {path}: not an announcement this version writes")
        return None
    if opened.host != socket.gethostname():
        return None  # another machine's, on a shared disk: not for this one, and nothing to say
    if not _owned(opened.info):
        tell(
            f"ignored {path}: it belongs to another user (uid {opened.info.st_uid}); give that server's URL"
            " to --server"
        )
        return None
    why = _not_loopback_http(serving.url)
    if why is not None:
        tell(f"ignored {path}: its URL {serving.url[:200]!r} {why}")
        return None
    if not _is_serve(serving.pid):
        with contextlib.suppress(OSError):
            path.unlink()
        tell(f"removed {path}: its server (pid {serving.pid}) is no longer running")
        return None
    why = _unproven(serving)
    if why is not None:
        tell(f"ignored {path}: the server at {serving.url} {why}")
        return None
    return serving


def wait_ready(path: Path, timeout_s: float, poll_s: float = 0.5) -> Serving | None:
    """Wait up to ``timeout_s`` for the starting server announced at ``path`` to load its model: the
    server once its announcement says "ready"; the starting one still, when the time ran out; None when
    its announcement went (the server stopped, or failed to load). Each look checks the file anew."""
    deadline = time.monotonic() + timeout_s
    while True:
        serving = find(path)
        if serving is None or not serving.starting or time.monotonic() >= deadline:
            return serving
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def _file(path: Path) -> Path:
    return path / FILE if path.is_dir() else path


MAX_BYTES = 64 * 1024  # an announcement is under 300 bytes; more is not one


@dataclass(frozen=True)
class _Opened:
    """What one open of an announcement showed: its owner (from the descriptor) and its text."""

    info: os.stat_result
    serving: Serving | None
    host: str


def _owned(info: os.stat_result) -> bool:
    """Whether a file is this user's (one place, so that a test can stand in for a second user)."""
    return info.st_uid == os.getuid()


def _open(path: Path) -> _Opened | str | None:
    """Open ``path`` once, not following a link, and read it through that descriptor: None when there is
    no file; why not, when it is a link, not a regular file, or writable by group or others."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # a FIFO: no hang
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link (asking the path again could see a file)
            return "it is a link (an announcement is a file its server wrote there)"
        return f"cannot be read ({exc.strerror or exc})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "it is not a regular file"
        if info.st_mode & 0o022:
            return "group or others may write it (an announcement is its owner's only)"
        text = os.read(fd, MAX_BYTES + 1)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    finally:
        os.close(fd)
    try:
        data = json.loads(text.decode("utf-8")) if len(text) <= MAX_BYTES else None
    except (UnicodeDecodeError, ValueError, RecursionError):
        data = None
    host = str(data.get("host")) if isinstance(data, dict) else ""
    return _Opened(info, _serving(data), host)


def _serving(data: Any) -> Serving | None:
    if not isinstance(data, dict):
        return None
    url, pid, nonce = data.get("url"), data.get("pid"), data.get("nonce")
    if not isinstance(url, str) or not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if not isinstance(nonce, str) or len(nonce) < 16:
        return None
    return Serving(url, pid, nonce, starting=data.get("state") == "starting")


def _not_loopback_http(url: str) -> str | None:
    """Why ``url`` is not ``http://<loopback address>:<port>``; None when it is."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return "is not a URL"
    if parts.scheme != "http" or port is None or parts.path not in ("", "/") or parts.query:
        return "is not http://HOST:PORT"
    host = parts.hostname or ""
    if host == "localhost":
        return None
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        return "does not name a loopback address"
    return None if loopback else "does not name a loopback address"


def _is_serve(pid: int) -> bool:
    """Whether ``pid`` is a ``bertknn-search serve`` process of this user (its command line: the program
    by name or ``-m bertknn_search``, then ``serve``)."""
    words = _command_line(pid)
    for i, word in enumerate(words):
        if Path(word).name in ("bertknn-search", "bertknn_search"):  # the script, or -m bertknn_search
            return "serve" in words[i + 1 :]
    return False


def _command_line(pid: int) -> list[str]:
    """The arguments of this user's process ``pid`` ([] when there is none): /proc on Linux, else ps."""
    if Path("/proc/self/cmdline").exists():
        try:
            if os.stat(f"/proc/{pid}").st_uid != os.getuid():
                return []
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return []
        return [a.decode("utf-8", "replace") for a in argv if a]
    import subprocess

    try:
        out = subprocess.run(
            ["ps", "-o", "uid=,command=", "-p", str(pid)], capture_output=True, text=True, timeout=5
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return []
    return out[1:] if out and out[0] == str(os.getuid()) else []


def _unproven(serving: Serving) -> str | None:
    """Why the server at ``serving.url`` did not prove it holds the file's nonce; None when it did."""
    challenge = secrets.token_hex(16)
    target = f"{serving.url.rstrip('/')}/serving?challenge={challenge}"
    # No redirect is followed and no proxy used: the answer must come from the URL itself.
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(target), timeout=PROBE_TIMEOUT_S) as reply:
            answer = json.loads(reply.read(4096).decode("utf-8"))
    except urllib.error.HTTPError as exc:
        return f"answered {exc.code} to GET /serving (not the server that wrote it)"
    except (OSError, ValueError) as exc:
        return f"did not answer GET /serving ({getattr(exc, 'reason', exc)})"
    given = answer.get("proof") if isinstance(answer, dict) else None
    if not isinstance(given, str) or not hmac.compare_digest(given, proof(serving.nonce, challenge)):
        return "is not the server that wrote it (its nonce does not match)"
    return None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        return None  # the 3xx itself is the answer: an HTTPError, not a request to elsewhere
