"""An engine's jars and launcher, made once: Maven fetches the jars from Maven Central into
``<cache>/<engine>-<version>/lib`` and ``javac`` compiles the launcher into ``classes``.

The jars and the launcher have stamps of their own (the pom, the launcher's source): a new launcher is
compiled again in seconds, without fetching anything. Maven runs through ``bertknn_search.maven`` (as for
``model get``); nothing else of the package is imported here.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

from bertknn_search import maven
from bertknn_search.maven import maven_repository

HERE = files("bertknn_search.nodes")
LOG4J = """status = error
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d{ISO8601}][%-5p][%c{1}] %m%n
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
"""
Say = Callable[[str], None]


class EngineError(Exception):
    """An engine cannot be prepared or started; the message is one line that says what to do."""


# The nodes run with the serial collector (small heaps, 2 cores); the parent circuit breaker's real-memory
# check assumes G1's early collections, so under serial GC it counts garbage as held and answered every
# request with 429 once a 1 GB Elasticsearch heap filled with it, until a forced GC (seen in a
# 20,000-article lazy ingest). Without the check the breaker sums what its child breakers account for.
NODE_SETTINGS = {"indices.breaker.total.use_real_memory": "false"}


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
        jar_mb=59,  # measured: the lib folder of a first fetch
        settings=NODE_SETTINGS,
    ),
    "elasticsearch": Engine(
        name="elasticsearch",
        title="Elasticsearch",
        version="8.19.21",
        extras="dense_vector",
        java=17,
        initial_masters="cluster.initial_master_nodes",
        jar_mb=41,
        settings=NODE_SETTINGS,
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


def _jar_sources(spec: Engine) -> dict[str, bytes]:
    folder = HERE.joinpath(spec.name)
    return {
        "pom.xml": folder.joinpath("pom.xml").read_bytes(),
        "maven-settings.xml": maven.settings(),
    }


def _launcher_source(spec: Engine) -> bytes:
    return HERE.joinpath(spec.name).joinpath("Launcher.java").read_bytes()


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


def prepare(spec: Engine, say: Say = print, progress: bool = True) -> Path:
    """The cache folder holding ``lib/`` (the engine's jars) and ``classes/`` (its launcher), made once:
    the jars when the pom changed, the launcher when its source did.

    Args:
        say: gets a line for each step that takes time (fetching, with sizes; compiling).
        progress: a progress bar while the jars are fetched, on a terminal (else a line every 10 s).

    Raises:
        EngineError: Java or Maven is missing, or Maven could not fetch the jars.
    """
    home = cache_root() / f"{spec.name}-{spec.version}"
    jars = _stamp(_jar_sources(spec))
    launcher = _stamp({"Launcher.java": _launcher_source(spec)})
    if _read(home / "lib.ready") == jars and _read(home / "classes.ready") == launcher:
        return home
    home.parent.mkdir(parents=True, exist_ok=True)
    # One preparer at a time (a test session and an 'engine start' beside it): the others wait, then
    # find the work done.
    with open(home.parent / f".{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _prepare(spec, home, jars, launcher, say, progress)


def _prepare(spec: Engine, home: Path, jars: str, launcher: str, say: Say, progress: bool) -> Path:
    if (home / "ready").is_file() and (home / "lib").is_dir() and not (home / "lib.ready").exists():
        # A cache of the version before the jars and the launcher had stamps of their own: the folder is
        # named by the engine's version, whose pom is the same, so its jars are kept.
        (home / "lib.ready").write_text(jars)
    if _read(home / "lib.ready") == jars and _read(home / "classes.ready") == launcher:
        return home
    java = find_java(spec.java)
    javac = java.parent / "javac"
    if not javac.is_file():
        raise EngineError(f"{java} has no javac beside it; install a JDK, not only a JRE, or set JAVA_HOME")
    if _read(home / "lib.ready") != jars:
        _fetch(spec, home, jars, say, progress)
    say(f"compiling the {spec.title} launcher")
    work = home / "classes.partial"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    source = work / "Launcher.java"
    source.write_bytes(_launcher_source(spec))
    env = dict(os.environ, JAVA_HOME=str(java.parent.parent))
    compiled = subprocess.run(
        [str(javac), "-nowarn", "-cp", str(home / "lib" / "*"), "-d", str(work), str(source)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    if compiled.returncode != 0:
        raise EngineError(f"compiling the {spec.title} launcher failed: {_first_line(compiled.stderr)}")
    source.unlink()
    (work / "log4j2.properties").write_text(LOG4J)
    shutil.rmtree(home / "classes", ignore_errors=True)
    work.rename(home / "classes")
    (home / "classes.ready").write_text(launcher)
    return home


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _fetch(spec: Engine, home: Path, stamp: str, say: Say, progress: bool) -> None:
    """The jars into ``home/lib`` (replacing any), fetched by Maven into a scratch folder first."""
    what = f"the {spec.title} jars"
    try:
        maven.find_mvn("the engine's jars")
    except maven.MavenError as exc:
        raise EngineError(str(exc)) from None
    work = home.with_name(home.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    (work / "src").mkdir(parents=True)
    (work / "src" / "pom.xml").write_bytes(_jar_sources(spec)["pom.xml"])
    say(
        f"fetching {spec.title} {spec.version} jars with Maven into {home} (about {spec.jar_mb} MB, once;"
        f" Maven keeps its own copy in {maven_repository()})"
    )
    args = [
        "-f", str(work / "src" / "pom.xml"), "generate-resources", f"-Dengine.lib={work / 'lib'}",
        f"-Dproject.build.directory={work / 'target'}",
    ]  # fmt: skip
    try:
        maven.run(args, work / "src", what, say, progress)
    except maven.MavenError as exc:
        raise EngineError(str(exc)) from None
    home.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(home / "lib", ignore_errors=True)
    (work / "lib").rename(home / "lib")
    (home / "classes.ready").unlink(missing_ok=True)  # compiled against the jars that were there
    (home / "lib.ready").write_text(stamp)
    shutil.rmtree(work, ignore_errors=True)


def _first_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[0][:300] if lines else "no output"
