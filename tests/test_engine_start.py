"""``bertknn-search engine start``: a real node ready in one line, stopped cleanly, and one-line refusals."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertknn_search.nodes.launch import MARKER, Cluster, EngineError, engine, find_java, free_port
from tests.conftest import REQUIRE_ENGINES

CLI = [sys.executable, "-m", "bertknn_search"]


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
@pytest.mark.opensearch
@pytest.mark.parametrize("name", ["opensearch", "elasticsearch"])
def test_start_prints_one_ready_line_and_sigterm_stops_every_node(
    name: str, tmp_path: Path, engines: object
) -> None:
    engines.url(name)  # type: ignore[attr-defined]  # fetched and compiled once (or skipped/failed here)
    port = free_port()
    proc = subprocess.Popen(
        [*CLI, "engine", "start", name, "--port", str(port), "--data", str(tmp_path), "--heap", "512m"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # how long it takes is docs/engines.md's (no timed tests)
        title = engine(name).label
        assert line == f"ready: http://127.0.0.1:{port} ({title}, 1 node)\n", proc.stderr
        taken = run("engine", "start", name, "--port", str(port), "--data", str(tmp_path / "second"))
        assert taken.returncode == 1
        assert taken.stderr.strip().splitlines()[-1] == (
            f"Error: port {port} on 127.0.0.1 is taken (another engine or server?); stop it or pass --port"
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    left = subprocess.run(["pgrep", "-f", f"http.port={port}"], capture_output=True, text=True).stdout
    assert left == "", "a node outlived its engine start"


@pytest.mark.slow
@pytest.mark.opensearch
def test_sigterm_while_starting_leaves_no_node_behind(tmp_path: Path, engines: object) -> None:
    engines.url("elasticsearch")  # type: ignore[attr-defined]  # the jars are fetched and compiled
    port = free_port()
    proc = subprocess.Popen(
        [*CLI, "engine", "start", "elasticsearch", "--port", str(port), "--data", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not subprocess.run(["pgrep", "-f", f"http.port={port}"], capture_output=True).stdout:
            assert time.monotonic() < deadline and proc.poll() is None, "the node never started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # before it is ready
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and out == "" and "stopped before ready" in err
    left = subprocess.run(["pgrep", "-f", f"http.port={port}"], capture_output=True, text=True).stdout
    assert left == "", "a node outlived its engine start"


def test_without_maven_the_first_start_says_what_is_missing(tmp_path: Path) -> None:
    try:
        find_java(17)
    except EngineError:
        pytest.skip("no Java 17 here: the message about Java is what a user sees instead")
    bare = tmp_path / "bin"
    bare.mkdir()
    os.symlink(sys.executable, bare / "python")
    env = {**os.environ, "PATH": str(bare), "BERTKNN_ENGINE_CACHE": str(tmp_path / "cache")}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    r = run("engine", "start", "opensearch", "--port", str(port), "--data", str(tmp_path / "d"), env=env)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        "Error: Maven ('mvn') is needed once to fetch the engine's jars from Maven Central; install it"
        " (e.g. 'apt-get install maven') and run the command again"
    )
    assert "Traceback" not in r.stderr


def test_an_unknown_engine_is_refused_by_name() -> None:
    r = run("engine", "start", "solr")
    assert r.returncode == 2 and "'solr' is not one of 'opensearch', 'elasticsearch'" in r.stderr


def test_engines_are_required_in_ci() -> None:
    # .ci/run sets it, so that a test needing an engine fails there instead of skipping.
    if os.environ.get("CI"):
        assert REQUIRE_ENGINES


def test_docker_compose_and_the_poms_name_the_versions_ci_runs() -> None:
    root = Path(__file__).resolve().parents[1]
    compose = (root / "docker-compose.yml").read_text()
    for name, variable in (("opensearch", "OPENSEARCH_VERSION"), ("elasticsearch", "ELASTICSEARCH_VERSION")):
        version = engine(name).version
        assert f"${{{variable}:-{version}}}" in compose, name
        pom = (root / "nodes" / name / "pom.xml").read_text()
        assert f">{version}<" in pom, name


# -- the data folder, the reasons, the progress lines, the ports (no JVM needed) -----------------------
def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(folder.rglob("*"))
    }


def opensearch_folder(tmp_path: Path, marked: bool = True) -> Path:
    data = tmp_path / "os-data"
    (data / "node-0" / "data" / "nodes" / "0" / "_state").mkdir(parents=True)
    (data / "node-0" / "data" / "nodes" / "0" / "_state" / "state-1.st").write_bytes(b"cluster state")
    (data / "node-0" / "config").mkdir()
    if marked:
        (data / MARKER).write_text('{"engine": "opensearch", "version": "2.19.1"}\n')
    return data


@pytest.mark.parametrize("marked", [True, False])
def test_another_engines_folder_is_refused_and_left_untouched(tmp_path: Path, marked: bool) -> None:
    data = opensearch_folder(tmp_path, marked)
    before = snapshot(data)
    r = run("engine", "start", "elasticsearch", "--port", str(free_port()), "--data", str(data))
    assert r.returncode == 1, r.stderr
    said = "OpenSearch 2.19.1 cluster (its bertknn-engine.json)" if marked else "OpenSearch cluster"
    assert r.stderr.strip().splitlines()[-1] == (
        f"Error: --data {data} holds the data of an {said}, not Elasticsearch's; give another --data for"
        " Elasticsearch (that folder is left untouched)"
    )
    assert snapshot(data) == before


def test_a_folder_of_other_files_or_a_newer_version_is_refused(tmp_path: Path) -> None:
    spec = engine("opensearch")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(EngineError, match=r"holds other files \(notes.txt\); give an empty or new folder"):
        Cluster(spec, port=free_port(), data=tmp_path).start(say=lambda line: None)
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / MARKER).write_text('{"engine": "opensearch", "version": "2.99.0"}')
    with pytest.raises(EngineError, match=r"written by OpenSearch 2\.99\.0, newer than the 2\.19\.1"):
        Cluster(spec, port=free_port(), data=newer).start(say=lambda line: None)
    assert sorted(p.name for p in newer.iterdir()) == [MARKER]


def test_a_failed_nodes_reason_is_this_runs_not_an_older_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = Cluster(engine("opensearch"), port=free_port(), data=tmp_path)
    logs = tmp_path / "node-0" / "logs"
    logs.mkdir(parents=True)
    (logs / "console.log").write_text("error: an old failure, 20 minutes ago\nsome line\n" * 50)
    fails = [
        sys.executable,
        "-c",
        "import sys; print('starting'); print('error: BindException: this run'); sys.exit(1)",
    ]
    monkeypatch.setattr(cluster, "command", lambda i, java: fails)
    cluster._spawn(0, Path(sys.executable))
    with pytest.raises(EngineError) as caught:
        cluster.wait_ready(timeout=60)
    assert str(caught.value) == "OpenSearch node 0 exited (1): error: BindException: this run"


def test_a_taken_transport_port_is_named_as_such(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", port + 100))
        held.listen()
        r = run("engine", "start", "opensearch", "--port", str(port), "--data", str(tmp_path / "d"))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        f"Error: port {port + 100} on 127.0.0.1, the transport port of node 0 (--port + 100), is taken"
        " (another engine's transport?); stop it or pass another --port"
    )
    assert not (tmp_path / "d").exists()  # nothing written for a start that cannot run


FAKE_MVN = """#!/bin/sh
echo "$@" > "$MVN_ARGS"
echo "[INFO] Scanning for projects..."
echo "Downloaded from central: https://repo.example/a.jar (1.5 MB at 3.0 MB/s)"
echo "Downloaded from central: https://repo.example/b.pom (500 kB at 1.0 MB/s)"
for arg in "$@"; do case "$arg" in -Dengine.lib=*) mkdir -p "${arg#-Dengine.lib=}";; esac; done
exit 0
"""


def test_engine_start_says_each_step_with_seconds_and_keeps_maven_under_home(tmp_path: Path) -> None:
    try:
        java = find_java(17)
    except EngineError:
        pytest.skip("no Java 17 here")
    if not (java.parent / "javac").is_file():
        pytest.skip("no javac beside java here")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "mvn").write_text(FAKE_MVN)
    (bin_ / "mvn").chmod(0o755)
    home = tmp_path / "home"
    env = {
        **os.environ,
        "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(home),
        "BERTKNN_ENGINE_CACHE": str(tmp_path / "cache"),
        "MVN_ARGS": str(tmp_path / "mvn-args"),
    }
    port = free_port()
    r = run("engine", "start", "opensearch", "--port", str(port), "--data", str(tmp_path / "d"), env=env)
    lines = r.stderr.strip().splitlines()
    stamp = r"^\[ *\d+\.\d s\] "
    assert re.match(
        stamp + rf"starting OpenSearch 2\.19\.1 on http://127\.0\.0\.1:{port} \(1 node;", lines[0]
    )
    repository = home / ".m2" / "repository"
    assert re.match(stamp + r"fetching OpenSearch 2\.19\.1 jars with Maven .*about 59 MB", lines[1])
    assert lines[1].endswith(f"Maven keeps its own copy in {repository})")
    assert re.match(stamp + r"fetched 2 files, 2\.0 MB in \d+ s", lines[2])
    assert re.match(stamp + r"compiling the OpenSearch launcher$", lines[3])
    # The fake fetched no jars: the compile fails, in one line.
    assert r.returncode == 1 and lines[-1].startswith("Error: compiling the OpenSearch launcher failed:")
    assert f"-Dmaven.repo.local={repository}" in (tmp_path / "mvn-args").read_text().split()


@pytest.mark.slow
@pytest.mark.opensearch
def test_nodes_end_with_the_engine_start_that_started_them_even_by_kill_9(
    tmp_path: Path, engines: object
) -> None:
    engines.url("opensearch")  # type: ignore[attr-defined]  # the jars are fetched and compiled
    port = free_port()
    command = [
        *CLI,
        "engine",
        "start",
        "opensearch",
        "--port",
        str(port),
        "--data",
        str(tmp_path),
        "--heap",
        "512m",
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(f"ready: http://127.0.0.1:{port} ")
    finally:
        proc.kill()  # kill -9: no handler of engine start runs, the nodes are in sessions of their own
        proc.wait()
    deadline = time.monotonic() + 60
    while subprocess.run(["pgrep", "-f", f"http.port={port}"], capture_output=True).stdout:
        assert time.monotonic() < deadline, "a node outlived the engine start that started it"
        time.sleep(0.5)
    assert json.loads((tmp_path / MARKER).read_text()) == {"engine": "opensearch", "version": "2.19.1"}


def test_a_node_left_running_by_an_earlier_start_is_named_with_its_pid(tmp_path: Path) -> None:
    port = free_port()
    node = tmp_path / "node-0"
    node.mkdir()
    (tmp_path / MARKER).write_text('{"engine": "opensearch", "version": "2.19.1"}')
    # A stand-in for an orphaned node: its command line names the launcher and the port, as a node's does.
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)", "Launcher", f"http.port={port}"]
    orphan = subprocess.Popen(sleeper)
    try:
        (node / "node.pid").write_text(f"{orphan.pid}\n")
        with socket.socket() as held:
            held.bind(("127.0.0.1", port))
            held.listen()
            r = run("engine", "start", "opensearch", "--port", str(port), "--data", str(tmp_path))
    finally:
        orphan.kill()
        orphan.wait()
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        f"Error: port {port} on 127.0.0.1 is taken by a node of an earlier start on this --data, still"
        f" running (pid {orphan.pid}); stop it with 'kill {orphan.pid}', or pass --port"
    )


@pytest.mark.opensearch
@pytest.mark.parametrize("name", ["opensearch", "elasticsearch"])
def test_nodes_started_here_run_without_the_real_memory_breaker(name: str, engines: object) -> None:
    """Under the serial collector the real-memory check counted garbage as held: a 1 GB Elasticsearch node
    answered every request with 429 until a forced GC. Nodes started here sum their child breakers."""
    if os.environ.get(f"{name.upper()}_URL"):
        pytest.skip("a cluster of your own: its settings are yours")
    from urllib.request import urlopen

    url = engines.url(name)  # type: ignore[attr-defined]
    with urlopen(f"{url}/_nodes/settings", timeout=30) as response:
        nodes = json.load(response)["nodes"]
    assert nodes
    for node in nodes.values():
        assert node["settings"]["indices"]["breaker"]["total"]["use_real_memory"] == "false"


def test_ready_waits_until_every_node_answers_http_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted node counts in the others' health once it joins over transport, which can be before its
    own HTTP port is bound: a test that then asked it for health met a refused connection. Ready means
    every node answers."""
    from tests.loopback import LoopbackServer, QuietHandler

    class Health(QuietHandler):
        def do_GET(self) -> None:
            body = json.dumps({"number_of_nodes": 2, "status": "green"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class Running:
        returncode = None

        def poll(self) -> None:
            return None

    joined = LoopbackServer(Health)  # node 1: counts both nodes
    silent = f"http://127.0.0.1:{free_port()}"  # node 0: joined, its HTTP not bound yet
    urls = [silent, joined.url]
    cluster = Cluster(engine("opensearch"), port=free_port(), nodes=2, data=tmp_path)
    monkeypatch.setattr(cluster, "node_url", lambda i: urls[i])
    cluster.procs = [Running(), Running()]  # type: ignore[list-item]
    try:
        with pytest.raises(EngineError, match="did not become ready"):
            cluster.wait_ready(timeout=1.5)
        bound = LoopbackServer(Health)
        urls[0] = bound.url
        try:
            cluster.wait_ready(timeout=10)  # returns once node 0 answers too
        finally:
            bound.close()
    finally:
        joined.close()
