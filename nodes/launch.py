"""Real OpenSearch and Elasticsearch nodes from Maven Central jars, one JVM each, no Docker.

``prepare`` fetches an engine's jars with Maven into a cache once (``<cache>/lib``) and compiles its
launcher (``<cache>/classes``); ``Cluster`` starts N nodes of it on consecutive ports of 127.0.0.1,
waits until they form one cluster and stops them. ``bertknn-search engine start`` and the tests share
this module; nothing here imports the rest of the package.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

HERE = files("bertknn_search.nodes")
LOG4J = """status = error
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d{ISO8601}][%-5p][%c{1}] %m%n
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
"""


class EngineError(Exception):
    """An engine cannot be prepared or started; the message is one line that says what to do."""


class Stopped(Exception):
    """Told to stop while the nodes were starting."""


@dataclass(frozen=True)
class Engine:
    """One engine: where its pom and launcher are, and what its node settings are called."""

    name: str  # "opensearch": the folder under nodes/ and the CLI's word
    title: str  # "OpenSearch"
    version: str
    extras: str  # said in the ready line, e.g. "k-NN"
    java: int  # the lowest Java feature release it runs on
    initial_masters: str  # the setting that names the first cluster-manager nodes
    jar_mb: int  # about how much the first fetch downloads (said before it starts)
    settings: dict[str, str] = field(default_factory=dict)  # settings every node of it gets

    @property
    def label(self) -> str:
        return f"{self.title} {self.version}, {self.extras}"


ENGINES = {
    "opensearch": Engine(
        name="opensearch",
        title="OpenSearch",
        version="2.19.1",
        extras="k-NN",
        java=17,
        initial_masters="cluster.initial_cluster_manager_nodes",
        jar_mb=60,
    ),
    "elasticsearch": Engine(
        name="elasticsearch",
        title="Elasticsearch",
        version="8.19.21",
        extras="dense_vector",
        java=17,
        initial_masters="cluster.initial_master_nodes",
        jar_mb=45,
    ),
}


def engine(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise EngineError(f"unknown engine {name!r}; choose {' or '.join(ENGINES)}") from None


def cache_root() -> Path:
    """Where fetched jars and compiled launchers live: $BERTKNN_ENGINE_CACHE or ~/.cache/bertknn-search."""
    given = os.environ.get("BERTKNN_ENGINE_CACHE")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bertknn-search" / "engines"


def _sources(spec: Engine) -> dict[str, bytes]:
    folder = HERE.joinpath(spec.name)
    return {
        "pom.xml": folder.joinpath("pom.xml").read_bytes(),
        "Launcher.java": folder.joinpath("Launcher.java").read_bytes(),
        "maven-settings.xml": HERE.joinpath("maven-settings.xml").read_bytes(),
    }


def _stamp(sources: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for name in sorted(sources):
        digest.update(name.encode() + b"\0" + sources[name])
    return digest.hexdigest()[:16]


def find_java(minimum: int) -> Path:
    """A ``java`` of at least ``minimum``: $JAVA_HOME's, the one on PATH, or a newer JDK under /usr/lib/jvm.

    Raises:
        EngineError: none found.
    """
    candidates = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]) / "bin" / "java")
    on_path = shutil.which("java")
    if on_path:
        candidates.append(Path(on_path))
    candidates += sorted(Path("/usr/lib/jvm").glob("*/bin/java"))
    for java in candidates:
        if java.is_file() and (java_version(java) or 0) >= minimum:
            return java
    raise EngineError(
        f"the engines need Java {minimum} or newer and none was found; install a JDK (e.g. 'apt-get install"
        f" openjdk-{minimum}-jdk-headless') or set JAVA_HOME"
    )


def java_version(java: Path) -> int | None:
    """The feature release of ``java`` (17 for "17.0.15"), or None if it does not run."""
    try:
        out = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8" is Java 8


def prepare(spec: Engine, say: Callable[[str], None] = print, progress: bool = True) -> Path:
    """The cache folder holding ``lib/`` (the engine's jars) and ``classes/`` (its launcher), made once.

    Raises:
        EngineError: Java or Maven is missing, or Maven could not fetch the jars.
    """
    sources = _sources(spec)
    home = cache_root() / f"{spec.name}-{spec.version}"
    stamp = home / "ready"
    want = _stamp(sources)
    if stamp.is_file() and stamp.read_text().strip() == want:
        return home
    java = find_java(spec.java)
    javac = java.parent / "javac"
    if not javac.is_file():
        raise EngineError(f"{java} has no javac beside it; install a JDK, not only a JRE, or set JAVA_HOME")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise EngineError(
            "Maven ('mvn') is needed once to fetch the engine's jars from Maven Central;"
            " install it (e.g. 'apt-get install maven') and run the command again"
        )
    work = home.with_name(home.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    (work / "src").mkdir(parents=True)
    for name, data in sources.items():
        (work / "src" / name).write_bytes(data)
    say(
        f"fetching {spec.title} {spec.version} jars with Maven into {home} (about {spec.jar_mb} MB, once;"
        " Maven keeps its own copy in ~/.m2)"
    )
    _maven(mvn, work, spec, progress)
    classes = work / "classes"
    env = dict(os.environ, JAVA_HOME=str(java.parent.parent))
    compiled = subprocess.run(
        [str(javac), "-nowarn", "-cp", str(work / "lib" / "*"), "-d", str(classes),
         str(work / "src" / "Launcher.java")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    if compiled.returncode != 0:
        raise EngineError(f"compiling the {spec.title} launcher failed: {_last_line(compiled.stderr)}")
    (classes / "log4j2.properties").write_text(LOG4J)
    (work / "ready").write_text(want)
    shutil.rmtree(home, ignore_errors=True)
    work.rename(home)
    return home


def _maven(mvn: str, work: Path, spec: Engine, progress: bool) -> None:
    command = [
        mvn, "-B", "-s", str(work / "src" / "maven-settings.xml"), "-f", str(work / "src" / "pom.xml"),
        "generate-resources", f"-Dengine.lib={work / 'lib'}",
        f"-Dproject.build.directory={work / 'target'}",
    ]  # fmt: skip
    bar = None
    if progress and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(desc="jars fetched", unit=" files", file=sys.stderr)
    lines: list[str] = []
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=work)
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        if bar is not None and line.startswith("Downloaded from"):
            bar.update(1)
    if bar is not None:
        bar.close()
    if proc.wait() != 0:
        errors = [ln for ln in lines if "ERROR" in ln] or lines or ["no output"]
        raise EngineError(
            f"Maven could not fetch the {spec.title} jars: {errors[0].strip()[:300]}"
            " (Maven Central must be reachable; run again to retry)"
        )


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[0][:300] if lines else "no output"


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
        """Fetch if needed, start every node and wait until all of them form one cluster.

        Args:
            stopping: polled while the nodes start; True gives up (``Stopped``), the caller stops them.

        Raises:
            EngineError: a port is taken, a node died, or the cluster did not form within ``timeout``.
            Stopped: ``stopping`` said so before the cluster was ready.
        """
        self.home = prepare(self.spec, say, progress)
        java = find_java(self.spec.java)
        taken = [
            p for i in range(self.nodes) for p in (self.port + i, self.port + 100 + i) if not port_free(p)
        ]
        if taken:
            raise EngineError(
                f"port {taken[0]} on 127.0.0.1 is taken (another engine or server?); stop it or pass --port"
            )
        for i in range(self.nodes):
            self._spawn(i, java)
        self.wait_ready(timeout, stopping=stopping)

    def _spawn(self, i: int, java: Path | None = None) -> None:
        assert self.home is not None
        java = java or find_java(self.spec.java)
        node_home = self.data / f"node-{i}"
        (node_home / "config").mkdir(parents=True, exist_ok=True)
        (node_home / "config" / "log4j2.properties").write_text(LOG4J)
        (node_home / "logs").mkdir(exist_ok=True)
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
            # These machines' disks run near the default 85% watermark; a test cluster must not go
            # read-only for that (the refusal itself is tested on purpose, with an index block).
            "cluster.routing.allocation.disk.threshold_enabled": "false",
            **self.spec.settings,
        }
        if self.nodes == 1:
            settings["discovery.type"] = "single-node"
        else:
            seeds = ",".join(f"127.0.0.1:{self.port + 100 + j}" for j in range(self.nodes))
            settings["discovery.seed_hosts"] = seeds
            settings[self.spec.initial_masters] = ",".join(names)
        settings.update(self.extra)
        command = [
            str(java), f"-Xms{self.heap}", f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-Xss1m",
            "-Djava.awt.headless=true", "-Dfile.encoding=UTF-8", "-Dlog4j2.disable.jmx=true",
            "-Dlog4j.shutdownHookEnabled=false", f"-Djava.io.tmpdir={node_home}",
            "-cp", f"{self.home / 'classes'}{os.pathsep}{self.home / 'lib' / '*'}",
            "Launcher", *(f"{k}={v}" for k, v in settings.items()),
        ]  # fmt: skip
        log = open(node_home / "logs" / "console.log", "ab")  # noqa: SIM115 (the child holds it)
        self.procs[i] = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()

    def wait_ready(
        self, timeout: float = 180, nodes: int | None = None, stopping: Callable[[], bool] = lambda: False
    ) -> None:
        """Wait until ``nodes`` (all) nodes answer and the cluster has them all and is not red."""
        want = self.nodes if nodes is None else nodes
        deadline = time.monotonic() + timeout
        while True:
            if stopping():
                raise Stopped
            for i, proc in enumerate(self.procs):
                if proc is not None and proc.poll() is not None:
                    raise EngineError(f"{self.spec.title} node {i} exited ({proc.returncode}): {self.why(i)}")
            health = self._health()
            if health and health.get("number_of_nodes", 0) >= want and health.get("status") != "red":
                return
            if time.monotonic() > deadline:
                raise EngineError(
                    f"{self.spec.title} did not become ready on {self.url} within {timeout:.0f} s;"
                    f" see {self.data}/node-*/logs/console.log"
                )
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

    def why(self, i: int) -> str:
        """The first ``error:`` line of node ``i``'s console log (the launcher prints one), else its last."""
        log = self.data / f"node-{i}" / "logs" / "console.log"
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            return "no log"
        errors = [ln for ln in lines if "error:" in ln]
        return (errors or lines or ["no output"])[0].strip()[:300]

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
