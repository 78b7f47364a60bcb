"""One page's wikitext parsed in a child process under a bound of CPU time, the plain pass where it fails."""

from __future__ import annotations

import math
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time

from bertknn_search.ingest.wikitext import plain_text, wikitext_to_text

# -- One page's parse, bounded ------------------------------------------------------------------------
# mwparserfromhell's C tokenizer is bounded neither in time nor in stack. Its time grows with the square of
# a page for runs of constructs that never close ("{{a|b=", "{|", "[[a|", "<b>", "<table>", "<nowiki>"
# repeated: 29 KiB took 19 s, a 600 KB page more than 150 s), and a heading line recurses once per "=" run
# in it, on the C stack: a 400 KB page of "===x" kills the process (SIGSEGV), and every re-run with it. So
# ``page_text`` parses each page in a child process under a bound of CPU time that grows with the page;
# a page past its bound, or one that crashes the child, gets ``plain_text`` instead (and a new child).
PARSE_SECONDS = 3.0  # a page's bound: this, and PARSE_SECONDS_PER_MB per million characters
PARSE_SECONDS_PER_MB = 10.0  # real pages parse at 0.4 to 2.5 MB/s (enwiki sample; the slowest: 0.2 s)
_START_SECONDS = 60.0  # for a new child to import the parser and say it is ready
_REQUEST = struct.Struct("<Qd")  # the page's UTF-8 bytes, its bound in seconds; then the bytes
_REPLY = struct.Struct("<BQ")  # 0: prose (1: the parser's error message), its bytes; then the bytes
_READY = b"\x01"
_SERVE = "from bertknn_search.ingest.page_parse import _serve; _serve()"


def parse_bound(wikitext: str) -> float:
    """Seconds of CPU time one page's parse may take: ``PARSE_SECONDS`` and ``PARSE_SECONDS_PER_MB``."""
    return PARSE_SECONDS + PARSE_SECONDS_PER_MB * len(wikitext) / 1e6


def page_text(wikitext: str) -> tuple[str, str | None]:
    """``wikitext_to_text`` of one page, parsed in a child process under ``parse_bound``.

    Returns:
        The page's prose and None; or, when the parse ran past its bound or the parser crashed or
        failed on the page, ``plain_text`` of it and why (a phrase: "the wikitext parser crashed on it
        (SIGSEGV)"), for the caller to say. The child is replaced after a page it did not finish.
    """
    return _PARSER.text(wikitext)


class _ParserProcess:
    """The child process pages are parsed in (``_serve``), started on first use and after one dies.

    One per process, shared by its threads (one page at a time). Where no child can be started (not a
    POSIX system, or an interpreter that cannot run ``-c``), pages are parsed in this process, unbounded,
    as before, after one line that says so.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._owner = 0  # the pid that started ``_child``: a forked copy of this process starts its own
        self._here = not hasattr(select, "poll")  # parse in this process (poll() on pipes is POSIX only)

    def text(self, wikitext: str) -> tuple[str, str | None]:
        with self._lock:
            data = wikitext.encode("utf-8", "surrogatepass")
            bound = parse_bound(wikitext)
            for _ in range(2):  # a child that died between pages (killed from outside) is replaced once
                child = None if self._here else self._started()
                if child is None:
                    return wikitext_to_text(wikitext), None
                try:
                    _write_all(child, _REQUEST.pack(len(data), bound) + data)
                except OSError:
                    self._stop()
                    continue
                deadline = time.monotonic() + 3 * bound + 10  # CPU time is bounded in the child
                head = _read_exactly(child, _REPLY.size, deadline)
                status, size = _REPLY.unpack(head) if head is not None else (0, 0)
                body = _read_exactly(child, size, deadline) if head is not None else None
                if body is None:
                    return plain_text(wikitext), self._failed(bound, len(wikitext))
                out = body.decode("utf-8", "surrogatepass")
                if status:
                    return plain_text(wikitext), f"the wikitext parser failed on it ({out})"
                return out, None
            return plain_text(wikitext), "the wikitext parser could not be given it (its process died)"

    def _started(self) -> subprocess.Popen[bytes] | None:
        if self._child is not None and self._owner == os.getpid():
            return self._child
        self._child = None  # a forked copy's child is its parent's, left alone
        try:
            child = subprocess.Popen(
                [sys.executable, "-c", _SERVE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                bufsize=0,
                start_new_session=True,  # a Ctrl-C in a terminal is this process's to handle, not its
            )
        except OSError as exc:
            return self._unstarted(str(exc))
        if _read_exactly(child, len(_READY), time.monotonic() + _START_SECONDS) != _READY:
            child.kill()
            child.wait()
            return self._unstarted(f"{sys.executable} -c {_SERVE!r} exited with status {child.returncode}")
        self._child, self._owner = child, os.getpid()
        return child

    def _unstarted(self, why: str) -> None:
        self._here = True
        print(
            f"warning: cannot start a process to parse wikitext in ({why}); parsing in this one, with no"
            " bound of time",
            file=sys.stderr,
        )

    def _failed(self, bound: float, chars: int) -> str:
        """Why the child gave no reply (it is stopped now, and replaced on the next page)."""
        code = self._stop()
        if code is None or code == -signal.SIGXCPU:
            return f"the wikitext parser ran past its bound of {bound:.1f} s for {chars:,} characters"
        if code < 0:
            return f"the wikitext parser crashed on it ({signal.Signals(-code).name})"
        return f"the wikitext parser exited on it (status {code})"

    def _stop(self) -> int | None:
        """Stop the child; how it ended on its own (``returncode``), None if it had to be killed."""
        child, self._child = self._child, None
        if child is None:
            return 0
        try:
            code: int | None = child.wait(1)  # its output ended: it is ending (its reply ran late: killed)
        except subprocess.TimeoutExpired:
            code = None
            child.kill()
            child.wait()
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()
        return code


def _write_all(child: subprocess.Popen[bytes], data: bytes) -> None:
    assert child.stdin is not None
    view = memoryview(data)
    while view:
        view = view[os.write(child.stdin.fileno(), view) :]


def _read_exactly(child: subprocess.Popen[bytes], n: int, deadline: float) -> bytes | None:
    """``n`` bytes from the child by ``deadline``; None if it ends its output or the time runs out first."""
    assert child.stdout is not None
    fd = child.stdout.fileno()
    ready = select.poll()  # not select(): a process with many files open has descriptors past its 1024
    ready.register(fd, select.POLLIN)
    pieces, got = [], 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0 or not ready.poll(math.ceil(left * 1000)):
            return None
        piece = os.read(fd, min(n - got, 1 << 20))
        if not piece:
            return None
        pieces.append(piece)
        got += len(piece)
    return b"".join(pieces)


def _serve() -> None:
    """The child's loop: a page in, its prose out, until its input ends (``_ParserProcess``)."""
    reply = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed by accident goes where stderr goes, never into a reply
    try:
        import resource
    except ImportError:
        resource = None  # type: ignore[assignment]
    if resource is not None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash on a page leaves no core file
    pages = sys.stdin.buffer
    reply.write(_READY)
    reply.flush()
    while len(head := pages.read(_REQUEST.size)) == _REQUEST.size:
        size, seconds = _REQUEST.unpack(head)
        wikitext = pages.read(size).decode("utf-8", "surrogatepass")
        if resource is not None:  # past it the kernel stops this process (SIGXCPU)
            used = resource.getrusage(resource.RUSAGE_SELF)
            hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
            soft = math.ceil(used.ru_utime + used.ru_stime + seconds)
            resource.setrlimit(resource.RLIMIT_CPU, (soft if hard < 0 else min(soft, hard), hard))
        try:
            status, out = 0, wikitext_to_text(wikitext)
        except Exception as exc:  # a ParserError, a RecursionError of the tree path
            status, out = 1, " ".join(f"{type(exc).__name__}: {exc}".split())
        data = out.encode("utf-8", "surrogatepass")
        reply.write(_REPLY.pack(status, len(data)) + data)
        reply.flush()


_PARSER = _ParserProcess()
