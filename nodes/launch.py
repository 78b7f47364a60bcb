"""Real OpenSearch and Elasticsearch nodes from Maven Central jars, one JVM each, no Docker.

``jars.prepare`` fetches an engine's jars once and compiles its launcher; ``Cluster`` starts N nodes of it
on consecutive ports of 127.0.0.1, waits until they form one cluster and stops them. Each node watches
the process that started it and stops when it ends (kill -9 of ``engine start`` leaves no JVM behind).
A data folder carries a marker naming its engine and version, checked before anything is written there.
``bertknn-search engine start`` and the tests share this module; nothing here imports the rest of the
package.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from bertknn_search.nodes.jars import (
    ENGINES,
    LOG4J,
    Engine,
    EngineError,
    cache_root,
    engine,
    find_java,
    java_version,
    prepare,
)

__all__ = [
    "ENGINES", "MARKER", "Cluster", "Engine", "EngineError", "Stopped", "cache_root", "check_data",
    "default_data", "engine", "find_java", "free_port", "java_version", "port_free", "prepare",
]  # fmt: skip
MARKER = "bertknn-engine.json"  # in a data folder: {"engine": ..., "version": ...}
WAITING_EVERY_S = 10.0  # how often a start that waits for its cluster says how far it is


class Stopped(Exception):
    """Told to stop while the nodes were starting."""


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(nodes: int = 1) -> int:
    """A port P such that P..P+nodes-1 and their transport ports (P+100...) are free."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base + 100 + nodes < 65535 and all(
            port_free(p) for i in range(nodes) for p in (base + i, base + 100 + i)
        ):
            return base
    raise EngineError("no free ports found on 127.0.0.1")


def default_data() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "bertknn-search"


def check_data(spec: Engine, data: Path) -> None:
    """Refuse a data folder that is not ``spec``'s, before anything is written into it.

    A folder this module made carries ``MARKER``; one made before markers is told by its layout (an
    Elasticsearch node installs ``modules/transport-netty4``; OpenSearch keeps ``data/nodes``); any other
    folder with files in it is nobody's engine data here and is left alone too.

    Raises:
        EngineError: another engine's folder, a newer version's, or a folder of other files.
    """
    if not data.exists():
        return
    if not data.is_dir():
        raise EngineError(f"--data {data} is a file, not a folder; give a folder for the nodes' data")
    marker = data / MARKER
    if marker.exists():
        try:
            found = json.loads(marker.read_text(encoding="utf-8"))
            name, version = str(found["engine"]), str(found["version"])
        except (OSError, ValueError, KeyError, TypeError):
            raise EngineError(
                f"{marker} is damaged; give another --data (that folder is left untouched)"
            ) from None
        if name != spec.name:
            title = ENGINES[name].title if name in ENGINES else name
            raise EngineError(
                f"--data {data} holds the data of {_a(title)} {version} cluster (its {MARKER}), not"
                f" {spec.title}'s; give another --data for {spec.title} (that folder is left untouched)"
            )
        if _version(version) > _version(spec.version):
            raise EngineError(
                f"--data {data} was written by {spec.title} {version}, newer than the {spec.version} this"
                " version starts, which cannot read it; give another --data (that folder is left untouched)"
            )
        return
    entries = sorted(p.name for p in data.iterdir())
    if not entries:
        return
    guessed = _guess(data)
    if guessed is not None and guessed != spec.name:
        raise EngineError(
            f"--data {data} holds the data of {_a(ENGINES[guessed].title)} cluster, not {spec.title}'s;"
            f" give another --data for {spec.title} (that folder is left untouched)"
        )
    if guessed is None and any(not name.startswith("node-") for name in entries):
        raise EngineError(
            f"--data {data} holds other files ({', '.join(entries[:3])}{', ...' * (len(entries) > 3)});"
            " give an empty or new folder for the nodes' data (that folder is left untouched)"
        )


def _guess(data: Path) -> str | None:
    """The engine whose nodes wrote ``data`` before folders had a marker; None when it cannot be told."""
    if any(data.glob("node-*/modules/transport-netty4")):
        return "elasticsearch"
    if any(data.glob("node-*/data/nodes")):
        return "opensearch"
    return None


def _a(title: str) -> str:
    return f"{'an' if title[:1].lower() in 'aeiou' else 'a'} {title}"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else 0 for part in text.split("."))


WATERMARK_FLOOR = 32 * 1024**2  # the flood stage on a small disk: free bytes a node never writes into
WATERMARK_CEILING = 2 * 1024**3  # and on a big one


def disk_watermarks(data: Path) -> dict[str, str]:
    """The engines' disk watermarks for nodes keeping their data in ``data``, as free bytes.

    The flood stage (every index on the node read-only until space is back, then lifted by the node
    itself) is 5 % of the disk, at least 32 MiB and at most 2 GiB; the high watermark (no new shards)
    1.5 times that and the low one twice it. A 300 MB folder stops writes with 32 MiB left, a 250 GB disk
    with 2 GiB: room for the merges and translog in flight, which a disk filled to 100 % fails.
    """
    where = data
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        total = shutil.disk_usage(where).total
    except OSError:
        total = 0
    flood = min(max(total // 20, WATERMARK_FLOOR), WATERMARK_CEILING)
    prefix = "cluster.routing.allocation.disk"
    return {
        f"{prefix}.threshold_enabled": "true",
        f"{prefix}.watermark.low": f"{flood * 2}b",
        f"{prefix}.watermark.high": f"{flood * 3 // 2}b",
        f"{prefix}.watermark.flood_stage": f"{flood}b",
        "cluster.info.update.interval": "10s",
    }


class Cluster:
    """N nodes of one engine, one JVM each, on ports ``port..port+N-1`` (transport ``port+100...``)."""

    def __init__(
        self,
        spec: Engine,
        port: int = 9200,
        nodes: int = 1,
        data: Path | None = None,
        heap: str = "512m",
        settings: dict[str, str] | None = None,
    ) -> None:
        if nodes < 1:
            raise EngineError("--nodes must be at least 1")
        self.spec = spec
        self.port = port
        self.nodes = nodes
        self.data = data or default_data() / f"{spec.name}-{port}"
        self.heap = heap
        self.extra = settings or {}
        self.home: Path | None = None
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * nodes
        # Where this run's part of each node's console.log begins (the log is appended to).
        self.log_starts = [0] * nodes

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def node_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.port + i}"

    def start(
        self,
        timeout: float = 180,
        say: Callable[[str], None] = print,
        progress: bool = True,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        """Check the data folder, fetch if needed, start every node and wait until they form one cluster.

        Args:
            say: gets a line for each step, with the seconds since the start.
            stopping: polled while the nodes start; True gives up (``Stopped``), the caller stops them.

        Raises:
            EngineError: the data folder is another's, a port is taken, a node died, or the cluster did
                not form within ``timeout``.
            Stopped: ``stopping`` said so before the cluster was ready.
        """
        began = time.monotonic()

        def tell(line: str) -> None:
            say(f"[{time.monotonic() - began:5.1f} s] {line}")

        plural = "s" * (self.nodes > 1)
        tell(
            f"starting {self.spec.title} {self.spec.version} on {self.url} ({self.nodes} node{plural};"
            f" data in {self.data})"
        )
        check_data(self.spec, self.data)  # before anything is written there
        self._check_ports()  # before a fetch of minutes
        self.home = prepare(self.spec, tell, progress)
        java = find_java(self.spec.java)
        self._check_ports()
        self.data.mkdir(parents=True, exist_ok=True)
        marker = {"engine": self.spec.name, "version": self.spec.version}
        (self.data / MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")
        for i in range(self.nodes):
            tell(
                f"starting node {i + 1} of {self.nodes} (HTTP port {self.port + i},"
                f" transport {self.port + 100 + i})"
            )
            self._spawn(i, java)
        tell(
            f"waiting for the cluster to be ready ({self.nodes} node{plural} joined, health green or yellow)"
        )
        self.wait_ready(timeout, stopping=stopping, say=tell)
        tell(f"ready in {time.monotonic() - began:.1f} s")

    def _check_ports(self) -> None:
        """Raises EngineError naming the first port of the nodes that is taken, HTTP or transport."""
        for i in range(self.nodes):
            if not port_free(self.port + i):
                left = self._left_behind(self.port + i)
                if left is not None:
                    raise EngineError(
                        f"port {self.port + i} on 127.0.0.1 is taken by a node of an earlier start on this"
                        f" --data, still running (pid {left}); stop it with 'kill {left}', or pass --port"
                    )
                raise EngineError(
                    f"port {self.port + i} on 127.0.0.1 is taken (another engine or server?); stop it or"
                    " pass --port"
                )
            if not port_free(self.port + 100 + i):
                raise EngineError(
                    f"port {self.port + 100 + i} on 127.0.0.1, the transport port of node {i} (--port + 100),"
                    " is taken (another engine's transport?); stop it or pass another --port"
                )

    def _left_behind(self, port: int) -> int | None:
        """The pid of a node of this data folder that still serves ``port`` (from its ``node.pid``: a node
        whose launcher predates the parent watch outlives a kill -9 of its start), else None."""
        for pid_file in sorted(self.data.glob("node-*/node.pid")):
            try:
                pid = int(pid_file.read_text().strip())
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except (OSError, ValueError):
                continue
            if b"Launcher" in argv and f"http.port={port}".encode() in argv:
                return pid
        return None

    def command(self, i: int, java: Path) -> list[str]:
        """The command line of node ``i``: its JVM, the launcher and every node setting."""
        assert self.home is not None
        node_home = self.data / f"node-{i}"
        names = [f"node-{j}" for j in range(self.nodes)]
        settings = {
            "path.home": str(node_home),
            "path.data": str(node_home / "data"),
            "path.logs": str(node_home / "logs"),
            "cluster.name": f"bertknn-{self.spec.name}-{self.port}",
            "node.name": names[i],
            "network.host": "127.0.0.1",
            "http.port": str(self.port + i),
            "transport.port": str(self.port + 100 + i),
            # The disk watermarks stay on: without them a full disk fails writes with "No space left on
            # device" and leaves shards failed. They are given in free bytes sized to the data folder's
            # disk (``disk_watermarks``), not the default 85/90/95 %, which a big shared disk meets long
            # before it is full; the disk is looked at every 10 s (the least the engines take), so a
            # lifted flood stage is seen soon.
            **disk_watermarks(self.data),
            **self.spec.settings,
        }
        if self.nodes == 1:
            settings["discovery.type"] = "single-node"
        else:
            seeds = ",".join(f"127.0.0.1:{self.port + 100 + j}" for j in range(self.nodes))
            settings["discovery.seed_hosts"] = seeds
            settings[self.spec.initial_masters] = ",".join(names)
        settings.update(self.extra)
        return [
            str(java), f"-Xms{self.heap}", f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-Xss1m",
            "-Djava.awt.headless=true", "-Dfile.encoding=UTF-8", "-Dlog4j2.disable.jmx=true",
            "-Dlog4j.shutdownHookEnabled=false", f"-Djava.io.tmpdir={node_home}",
            # The launcher stops the node when this process ends, however it ends (kill -9 included):
            # the node runs in a session of its own, which no signal to this one reaches.
            f"-Dbertknn.parent={os.getpid()}",
            "-cp", f"{self.home / 'classes'}{os.pathsep}{self.home / 'lib' / '*'}",
            "Launcher", *(f"{k}={v}" for k, v in settings.items()),
        ]  # fmt: skip

    def _spawn(self, i: int, java: Path | None = None) -> None:
        java = java or find_java(self.spec.java)
        node_home = self.data / f"node-{i}"
        (node_home / "config").mkdir(parents=True, exist_ok=True)
        (node_home / "config" / "log4j2.properties").write_text(LOG4J)
        (node_home / "logs").mkdir(exist_ok=True)
        log = open(node_home / "logs" / "console.log", "ab")  # noqa: SIM115 (the child holds it)
        self.log_starts[i] = log.tell()
        proc = subprocess.Popen(
            self.command(i, java), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        self.procs[i] = proc
        log.close()
        (node_home / "node.pid").write_text(f"{proc.pid}\n")  # see ``_left_behind``

    def wait_ready(
        self,
        timeout: float = 180,
        nodes: int | None = None,
        stopping: Callable[[], bool] = lambda: False,
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        """Wait until ``nodes`` (all) nodes answer and the cluster has them all and is not red; ``say``
        gets a line every ``WAITING_EVERY_S`` on how far it is."""
        want = self.nodes if nodes is None else nodes
        deadline = time.monotonic() + timeout
        told = time.monotonic()
        while True:
            if stopping():
                raise Stopped
            for i, proc in enumerate(self.procs):
                if proc is not None and proc.poll() is not None:
                    raise EngineError(f"{self.spec.title} node {i} exited ({proc.returncode}): {self.why(i)}")
            health = self._health()
            if (
                health
                and int(str(health.get("number_of_nodes", 0))) >= want
                and health.get("status") != "red"
                and self._every_node_answers()
            ):
                return
            if time.monotonic() > deadline:
                raise EngineError(
                    f"{self.spec.title} did not become ready on {self.url} within {timeout:.0f} s;"
                    f" see {self.data}/node-*/logs/console.log"
                )
            if time.monotonic() - told >= WAITING_EVERY_S:
                told = time.monotonic()
                if health:
                    say(
                        f"still waiting: {health.get('number_of_nodes')} of {want} nodes joined,"
                        f" health {health.get('status')}"
                    )
                else:
                    say("still waiting: no node answers HTTP yet")
            time.sleep(0.5)

    def _health(self) -> dict[str, object] | None:
        for i, proc in enumerate(self.procs):
            if proc is None or proc.poll() is not None:
                continue
            try:
                with urllib.request.urlopen(f"{self.node_url(i)}/_cluster/health", timeout=5) as response:
                    return json.loads(response.read())
            except (OSError, urllib.error.URLError, ValueError):
                continue
        return None

    def _every_node_answers(self) -> bool:
        """Whether each running node answers HTTP itself: a restarted node counts in the others' health
        once it joins over transport, which can be before its own HTTP port is bound."""
        for i, proc in enumerate(self.procs):
            if proc is None or proc.poll() is not None:
                continue
            try:
                url = f"{self.node_url(i)}/_cluster/health?local=true"
                with urllib.request.urlopen(url, timeout=5) as response:
                    response.read()
            except (OSError, urllib.error.URLError, ValueError):
                return False
        return True

    def why(self, i: int) -> str:
        """The first ``error:`` line of this run's part of node ``i``'s console log (the launcher prints
        one), else its last line; what earlier runs appended above it is not this run's reason."""
        log = self.data / f"node-{i}" / "logs" / "console.log"
        try:
            with open(log, "rb") as f:
                f.seek(self.log_starts[i])
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return "no log"
        lines = [ln for ln in lines if ln.strip()]
        errors = [ln for ln in lines if "error:" in ln]
        return (errors[:1] or lines[-1:] or ["no output"])[0].strip()[:300]

    def kill(self, i: int) -> None:
        """kill -9 node ``i`` (a fault test's node loss)."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def restart(self, i: int) -> None:
        """Start node ``i`` again on its own data (after ``kill``)."""
        self.kill(i)
        self._spawn(i)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM every node (each closes itself cleanly), kill -9 those still running after ``timeout``."""
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for i, proc in enumerate(self.procs):
            if proc is None:
                continue
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(i)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
