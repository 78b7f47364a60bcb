"""Running the app on uvicorn: bind (127.0.0.1 unless told otherwise), say when ready, stop gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import socket
import sys
import threading

from bertknn_search.config import Config
from bertknn_search.errors import BertKnnError, ConfigError
from bertknn_search.server import discovery
from bertknn_search.server.app import ServerSettings, create_app
from bertknn_search.server.connections import Guard, connection_cap
from bertknn_search.server.hosts import allowed_names, is_loopback, is_wildcard, normalise

log = logging.getLogger("bertknn_search.server")


def listen(host: str, port: int) -> socket.socket:
    """A bound socket (port 0 picks a free one), so the address is known before uvicorn starts.

    Raises:
        ConfigError: the address cannot be bound (in use, not this machine's).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        why = exc.strerror or exc
        raise ConfigError(f"cannot listen on {host}:{port}: {why}; try another --port or --host") from exc
    return sock


def exposed(settings: ServerSettings, host: str, open_writes: bool) -> ServerSettings:
    """``settings`` for a server bound to ``host``: that address joins the allowed Host names (unless it
    is 0.0.0.0 or ::, which name no host), once it is known that its writes are not open by mistake.

    Loopback without a token stays open to the machine's own programs (``--token-file`` closes it to them
    too); the Host check keeps web pages out. Another address without a token lets the network write,
    which must be asked for.

    Raises:
        ConfigError: ``host`` is not loopback, with neither a token nor ``open_writes``.
    """
    names = allowed_names(settings.allowed_hosts)  # a bad --allowed-host fails before the bind
    bound = normalise(host)
    if bound is None:
        raise ConfigError(f"--host {host!r} is not a host name or address")
    if settings.token is None and not is_loopback(bound):
        if not open_writes:
            raise ConfigError(
                f"--host {host} would let other machines add and delete articles: give --token-file"
                " (writes then need its token), or --open-writes to let anyone who can reach it write"
            )
        log.warning(
            "--open-writes: anyone who can reach %s may add and delete articles (no --token-file)", host
        )
    if is_wildcard(host):
        log.info("requests from other machines must name this one by an --allowed-host (Host header)")
    else:
        names |= {bound}
    return dataclasses.replace(settings, allowed_hosts=tuple(sorted(names)))


def serve(settings: ServerSettings, host: str, port: int, open_writes: bool = False) -> None:
    """Serve until SIGINT or SIGTERM; a write in progress then finishes before the process ends.

    Raises:
        ConfigError: the address cannot be bound, or may not be without a token (see ``exposed``).
        BertKnnError: the model failed to load (the server stops at once).
    """
    import uvicorn

    _log_to_stderr()
    settings = exposed(settings, host, open_writes)
    sock = listen(host, port)
    bound = sock.getsockname()[1]
    url = f"http://{f'[{host}]' if ':' in host else host}:{bound}"
    app = create_app(settings)
    batcher = app.state.batcher
    guard = Guard(connection_cap())

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            asyncio.get_running_loop().set_exception_handler(guard.exception_handler)
            await super().startup(sockets)

        def handle_exit(self, sig: int, frame: object) -> None:
            # uvicorn waits for running requests; a cold encode stops at its next step instead of
            # holding the shutdown for minutes (its question gets a 503, what it encoded is kept).
            batcher.interrupt()
            super().handle_exit(sig, frame)  # type: ignore[arg-type]

    # No access log: a line per question would cost the batch path and bury what matters.
    # Our h11 protocol, whatever else is installed: it times out slow clients and keeps the cap.
    http = guard.protocol()
    server = Server(uvicorn.Config(app, log_level="info", access_log=False, lifespan="on", http=http))

    config = settings.config
    place = discovery.announcement_for(config)

    def announce() -> None:
        # "starting" once uvicorn answers (GET /serving proves the nonce while the model loads), so that
        # 'query --server auto' waits for this server instead of saying there is none; "ready" once loaded.
        while not (server.started or batcher.done.wait(0.05) or server.should_exit):
            pass
        if place is not None and server.started and not batcher.done.is_set():
            discovery.announce(place, discovery.client_url(host, bound), settings.nonce, starting=True)
        batcher.done.wait()
        if batcher.error is not None:
            server.should_exit = True
        else:
            if place is not None:
                discovery.announce(place, discovery.client_url(host, bound), settings.nonce)
            log.info("ready: %s (page at /, API docs at /docs)", url)

    log.info("loading the model for %s; listening on %s", index_name(config), url)
    log.info("per-request limits without the token: %s", settings.limits.describe())
    log.info(
        "connections: at most %d open; each sends a request's head within %g s, all of it within %g s",
        guard.cap,
        guard.head_s,
        guard.request_s,
    )
    threading.Thread(target=announce, name="announce", daemon=True).start()
    # uvicorn re-raises the Ctrl-C it handled once the shutdown is done: nothing is left to interrupt.
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=[sock])
    finally:
        if place is not None:
            discovery.withdraw(place)
    # The interpreter's last garbage collection walks every object the model and the libraries made:
    # seconds on a loaded CPU, once all is closed. Frozen objects are left to the process's exit.
    gc.freeze()
    if batcher.error is not None:
        error = batcher.error
        if isinstance(error, BertKnnError):
            raise error
        raise BertKnnError(f"the model failed to load: {error}") from error


def index_name(config: Config) -> str:
    """The index as the operator names it: a folder, or the prefix of an index pair on an engine."""
    if config.backend == "embedded":
        return str(config.index)
    url = config.opensearch_url if config.backend == "opensearch" else config.elasticsearch_url
    return f"index prefix {config.opensearch_prefix!r} on {config.backend} at {url}"


def _log_to_stderr() -> None:
    logger = logging.getLogger("bertknn_search")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        # A time on each line: the encoding lines say how fast, and when, the server encoded what.
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
