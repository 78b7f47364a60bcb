"""Faults on real engine clusters: a node lost while questions run and while an add writes, the whole
engine killed under an ingest, and an index that refuses writes.

Each test runs on OpenSearch and on Elasticsearch, started from Maven jars (``nodes/launch.py``): one
3-node cluster per engine for the module (3 JVMs; the contexts index with 3 shards and 1 replica), and a
single node of its own for the test that kills the whole engine. The client always talks to node 0; the
node losses are of node 1 or 2. An engine that cannot start skips these tests with the reason, or fails
them where ``BERTKNN_REQUIRE_ENGINES`` is set (as ``conftest.Engines`` does).

What the faults took (cluster starts, the slowest question during a node loss, restarts) is printed at
the end of the module.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pytest

from bertknn_search.backends import open_backend
from bertknn_search.backends.engines import bodies as engine_bodies
from bertknn_search.backends.engines.backend import EngineBackend
from bertknn_search.backends.engines.bodies import index_names
from bertknn_search.backends.engines.client import RetryPolicy
from bertknn_search.config import Config
from bertknn_search.demo import Fact
from bertknn_search.errors import BackendError
from bertknn_search.ingest.pipeline import add_articles, ingest
from bertknn_search.nodes.launch import Cluster, EngineError, engine, free_port
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question
from tests.conftest import REQUIRE_ENGINES
from tests.test_backends import assert_same, questions

pytestmark = [pytest.mark.slow, pytest.mark.engine_faults]

ENGINE_NAMES = ("opensearch", "elasticsearch")
READY_S = 180.0  # a node's start on a loaded 2-core machine
QUESTION_LIMIT_S = 30.0  # the longest a question may take while a node is lost (retries included)
LOSS_ROUNDS = 3  # rounds of questions asked after a node loss was seen by the cluster
CLIENT_NODE = 0  # every client here talks to node 0; only other nodes are killed
NEW_ARTICLES = [
    {
        "id": "fault-1",
        "title": "Zyxa Qorv",
        "text": "Zyxa Qorv was born in Oskavel. Zyxa Qorv worked as a sailor.",
    },
    {
        "id": "fault-2",
        "title": "Brenna Tulk",
        "text": "Brenna Tulk was born in Pradnor. Brenna Tulk was a doctor.",
    },
    {
        "id": "fault-3",
        "title": "Ostrel Vain",
        "text": "Ostrel Vain was born in Yentil. Ostrel Vain was a poet.",
    },
]
NEW_QUESTIONS = [Question(f"{a['title']} was born in [MASK].", a["title"]) for a in NEW_ARTICLES]


# -- reporting -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def report(request: pytest.FixtureRequest) -> Iterator[Callable[[str], None]]:
    """``report(line)``: a timing, printed with the others when the module ends."""
    lines: list[str] = []
    yield lines.append
    if not lines:
        return
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print("\nengine fault timings:", *(f"  {line}" for line in lines), sep="\n", flush=True)


# -- clusters --------------------------------------------------------------------------------------------
def unavailable(name: str, why: str) -> NoReturn:
    message = f"no {name} engine for this test: {why}"
    if REQUIRE_ENGINES:
        pytest.fail(message + " (BERTKNN_REQUIRE_ENGINES is set: engines are required here)")
    pytest.skip(message)


def start_cluster(name: str, nodes: int, data: Path) -> tuple[Cluster, float]:
    """A running cluster of ``nodes`` JVMs and the seconds its start took; skips or fails if it cannot."""
    try:
        cluster = Cluster(engine(name), port=free_port(nodes), nodes=nodes, data=data)
    except EngineError as exc:
        unavailable(name, str(exc))
    started = time.monotonic()
    try:
        cluster.start(timeout=READY_S, say=lambda line: None, progress=False)
    except EngineError as exc:
        cluster.stop()
        unavailable(name, str(exc))
    return cluster, time.monotonic() - started


def http(url: str, method: str, path: str, body: Any = None, timeout: float = 150) -> Any:
    """One request to a node, by urllib (not the client under test); the JSON it answered."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read() or b"{}") | {"http_status": exc.code}


def wait_green(cluster: Cluster, indices: str = "", timeout_s: int = 120) -> dict[str, Any]:
    health = http(
        cluster.node_url(CLIENT_NODE),
        "GET",
        f"/_cluster/health/{indices}?wait_for_status=green&wait_for_no_initializing_shards=true"
        "&wait_for_no_relocating_shards=true"
        f"&wait_for_nodes={cluster.nodes}&timeout={timeout_s}s",
    )
    assert health.get("status") == "green" and not health.get("timed_out"), health
    return health


def heal(cluster: Cluster) -> float:
    """Restart every node that is down, wait until all are in and green; the seconds that took."""
    started = time.monotonic()
    for i, proc in enumerate(cluster.procs):
        if proc is None or proc.poll() is not None:
            cluster.restart(i)
    cluster.wait_ready(READY_S)
    wait_green(cluster)
    return time.monotonic() - started


def nodes_state(cluster: Cluster) -> str:
    """Each node's process state and, for a dead one, the first error line of its log (for messages)."""
    out = []
    for i, proc in enumerate(cluster.procs):
        code = None if proc is None else proc.poll()
        out.append(
            f"node-{i} "
            + ("running" if proc is not None and code is None else f"exited {code}: {cluster.why(i)}")
        )
    return "; ".join(out)


def wait_usable(cluster: Cluster) -> None:
    """Start every node that is down (without waiting for it) and wait until a quorum answers, not red."""
    for i, proc in enumerate(cluster.procs):
        if proc is None or proc.poll() is not None:
            cluster.restart(i)
    health = http(
        cluster.node_url(CLIENT_NODE), "GET", "/_cluster/health?wait_for_status=yellow&timeout=120s"
    )
    assert health.get("status") in ("yellow", "green"), health


def wait_node_left(cluster: Cluster, indices: str, timeout_s: float = 60) -> dict[str, Any]:
    """The health of ``indices`` once the cluster counts one node fewer."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = http(cluster.node_url(CLIENT_NODE), "GET", f"/_cluster/health/{indices}", timeout=10)
        if health.get("number_of_nodes", cluster.nodes) < cluster.nodes:
            return health
        assert time.monotonic() < deadline, (
            f"the cluster did not notice the lost node in {timeout_s:.0f} s ({nodes_state(cluster)})"
        )
        time.sleep(0.2)


def primaries(cluster: Cluster, indices: str) -> dict[str, list[str]]:
    """node name -> the primary shards (``index/shard``) of ``indices`` it holds."""
    rows = http(
        cluster.node_url(CLIENT_NODE), "GET", f"/_cat/shards/{indices}?format=json&h=index,shard,prirep,node"
    )
    held: dict[str, list[str]] = {}
    for row in rows:
        if row["prirep"] == "p" and row.get("node"):
            held.setdefault(row["node"], []).append(f"{row['index']}/{row['shard']}")
    return held


def unassigned_primaries(cluster: Cluster, indices: str) -> list[str]:
    rows = http(
        cluster.node_url(CLIENT_NODE), "GET", f"/_cat/shards/{indices}?format=json&h=index,shard,prirep,state"
    )
    return [f"{r['index']}/{r['shard']}" for r in rows if r["prirep"] == "p" and r["state"] == "UNASSIGNED"]


def context_ids(url: str, index: str) -> list[str]:
    """The id of every doc in the contexts index, read on the server after a refresh (leftovers of a dead
    write included)."""
    http(url, "POST", f"/{index}/_refresh")
    body = {"size": 10_000, "track_total_hits": True, "_source": False, "query": {"match_all": {}}}
    response = http(url, "POST", f"/{index}/_search", body)
    ids = [hit["_id"] for hit in response["hits"]["hits"]]
    assert response["hits"]["total"]["value"] == len(ids) and response["_shards"]["failed"] == 0, response
    return ids


def bulk_settings(url: str, indices: str) -> dict[str, tuple[Any, Any]]:
    """index -> (number_of_replicas, refresh_interval) as the cluster holds them (None: the default)."""
    found = http(url, "GET", f"/{indices}/_settings?flat_settings=true")
    return {
        name: (s["settings"].get("index.number_of_replicas"), s["settings"].get("index.refresh_interval"))
        for name, s in found.items()
    }


def engine_cfg(base: Config, name: str, url: str, prefix: str | None = None) -> Config:
    prefix = prefix or f"bertknn-fault-{uuid.uuid4().hex[:10]}"
    return base.replace(backend=name, opensearch_prefix=prefix, **{f"{name}_url": url})


def counts(config: Config) -> tuple[int, int, int, int]:
    """Articles, sentences, contexts and encoded articles, as ``stats`` says them."""
    backend = open_backend(config)
    try:
        s = backend.stats()
        return s.articles, s.sentences, s.contexts, s.encoded_articles
    finally:
        backend.close()


def write_new_articles(path: Path) -> Path:
    path.write_text("".join(json.dumps(a) + "\n" for a in NEW_ARTICLES))
    return path


def assert_same_index(config: Config, reference: Config, qs: list[Question]) -> None:
    """``config`` (an engine index) holds what ``reference`` (embedded) holds: the same article and
    context counts, as many context docs on the server as contexts and no id twice, the same answers."""
    engine_side, embedded = Searcher.open(config), Searcher.open(reference)
    try:
        a, b = engine_side.backend.stats(), embedded.backend.stats()
        assert (a.articles, a.contexts, a.sentences) == (b.articles, b.contexts, b.sentences)
        backend = engine_side.backend
        assert isinstance(backend, EngineBackend)
        ids = context_ids(getattr(config, f"{config.backend}_url"), backend.names["contexts"])
        assert len(ids) == len(set(ids)) == b.contexts, "context docs on the server: leftovers or duplicates"
        for q, x, y in zip(qs, embedded.score_batch(qs), engine_side.score_batch(qs)):
            assert_same(x, y, q.text)
    finally:
        engine_side.close()
        embedded.close()


def cli_command() -> list[str]:
    script = Path(sys.executable).with_name("bertknn-search")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "bertknn_search"]


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPENSEARCH_", "ELASTICSEARCH_", "BERTKNN_"))
    }
    return subprocess.run(
        [*cli_command(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def where_flags(config: Config, url: str | None = None) -> list[str]:
    name = config.backend
    return [
        "--backend", name, f"--{name}-url", url or str(getattr(config, f"{name}_url")),
        "--index-prefix", config.opensearch_prefix,
    ]  # fmt: skip


def one_line_error(run: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command printed: nonzero exit, no traceback, nothing else on stderr."""
    said = f"exit {run.returncode}\nstdout: {run.stdout}\nstderr: {run.stderr}"
    assert run.returncode != 0, said
    assert "Traceback" not in run.stderr and "Traceback" not in run.stdout, said
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), said
    return lines[0]


class Relay:
    """A TCP relay in front of a node that calls ``on_bulk`` (a kill) once the node has answered the first
    ``_bulk`` request, before the client reads that answer: the documents are stored and the writer never
    learns it. Everything else, and everything after, is passed through unchanged."""

    def __init__(self, port: int, on_bulk: Callable[[], None]) -> None:
        self.upstream = ("127.0.0.1", port)
        self.on_bulk = on_bulk
        self.fired = threading.Event()
        self._lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()  # the node is down: the client sees the connection dropped
            return
        upstream.settimeout(None)
        bulk = threading.Event()

        def forward() -> None:  # client -> node; HTTP/1.1 without pipelining: one request at a time
            try:
                while data := client.recv(65536):
                    if not self.fired.is_set() and b"/_bulk" in data:
                        bulk.set()
                    upstream.sendall(data)
            except OSError:
                pass

        threading.Thread(target=forward, daemon=True).start()
        try:
            while data := upstream.recv(65536):
                if bulk.is_set():
                    with self._lock:
                        if not self.fired.is_set():
                            self.on_bulk()
                            self.fired.set()
                            break
                client.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self.server.close()


# -- the 3-node cluster and its index --------------------------------------------------------------------
@pytest.fixture(scope="module", params=ENGINE_NAMES)
def fault_engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def trio(
    fault_engine: str, tmp_path_factory: pytest.TempPathFactory, report: Callable[[str], None]
) -> Iterator[Cluster]:
    """Three nodes of the engine (3 JVMs, 512m heap each), shared by the module's tests on it."""
    cluster, seconds = start_cluster(fault_engine, 3, tmp_path_factory.mktemp(f"faults-trio-{fault_engine}"))
    report(f"{fault_engine}: 3-node cluster started in {seconds:.1f} s")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def trio_index(trio: Cluster, fault_engine: str, base_config: Config, corpus: Path) -> Config:
    """The corpus ingested (eager) on the 3-node cluster, contexts in 3 shards with 1 replica; green."""
    config = engine_cfg(base_config, fault_engine, trio.node_url(CLIENT_NODE))
    three_shard_index(config, corpus)
    names = index_names(config.opensearch_prefix)
    settings = http(config_url(config), "GET", f"/{names['contexts']}/_settings?flat_settings=true")
    held = settings[names["contexts"]]["settings"]
    assert (held["index.number_of_shards"], held["index.number_of_replicas"]) == ("3", "1"), held
    wait_green(trio, ",".join(names.values()))
    return config


def hold_blocks(url: str, hold: bool) -> None:
    """Keep the disk monitor from lifting a read_only_allow_delete block (``hold``), or let it again.

    The monitor lifts that block, at its next look, from every index whose nodes are below the high
    watermark; switching it off (``threshold_enabled: false``) did not stop Elasticsearch 8 doing so. With
    the low and high watermarks above any disk's size every node is over them: no index is released, no
    shard has anywhere to move, and writes go on (the flood stage, at 1 byte free, blocks none). The three
    go in bytes together: the engines refuse bytes beside percentages."""
    prefix = "cluster.routing.allocation.disk.watermark"
    at = {"low": "1pb", "high": "1pb", "flood_stage": "1b"}
    setting = {f"{prefix}.{name}": value if hold else None for name, value in at.items()}
    acked = http(url, "PUT", "/_cluster/settings", {"persistent": setting})
    assert acked.get("acknowledged"), acked


def config_url(config: Config) -> str:
    return str(getattr(config, f"{config.backend}_url"))


# -- 1. node loss ----------------------------------------------------------------------------------------
def test_questions_answer_through_a_node_loss(
    trio: Cluster,
    trio_index: Config,
    built_index: Config,
    facts: list[Fact],
    fault_engine: str,
    report: Callable[[str], None],
) -> None:
    """Questions asked in a loop while another thread kills node 2 (kill -9) all answer, each within
    30 s, as before.

    The kill lands at any moment, a search in flight on that node included (one between its phases
    there answered from two of the three shards before searches asked for every shard). The node is
    started again at the end without waiting: the next test that needs all three waits.
    """
    heal(trio)
    qs = questions(facts)
    indices = ",".join(index_names(trio_index.opensearch_prefix).values())
    searcher, embedded = Searcher.open(trio_index), Searcher.open(built_index)
    victim = 2
    killed_at: list[float] = []
    seen_at: list[float] = []
    watch_error: list[BaseException] = []

    def kill_and_watch() -> None:
        time.sleep(1.0)  # a few questions into the first round
        trio.kill(victim)
        killed_at.append(time.monotonic())
        try:
            wait_node_left(trio, indices)
        except BaseException as exc:  # said by the test's thread
            watch_error.append(exc)
            return
        seen_at.append(time.monotonic())

    try:
        before = searcher.score_batch(qs)
        for q, a, b in zip(qs, embedded.score_batch(qs), before):  # 3 shards answer as one store does
            assert_same(a, b, q.text)
        assert sum(len(b.neighbors) > 0 for b in before) >= 12  # the questions reach the kNN step
        killer = threading.Thread(target=kill_and_watch, daemon=True)
        slowest, asked, rounds_after = 0.0, 0, 0
        deadline = time.monotonic() + 180
        killer.start()
        while rounds_after < LOSS_ROUNDS:  # rounds that start after the cluster saw the node gone
            seen_before_round = bool(seen_at)
            for q, b in zip(qs, before):
                started = time.monotonic()
                try:
                    a = searcher.score_batch([q])[0]
                except BackendError as exc:
                    pytest.fail(
                        f"{q.text!r} did not answer during the node loss: {exc} ({nodes_state(trio)})"
                    )
                took = time.monotonic() - started
                assert took < QUESTION_LIMIT_S, f"{q.text!r} took {took:.1f} s during the node loss"
                assert_same(b, a, f"{q.text} (node {victim} killed)")
                if killed_at and started + took >= killed_at[0]:  # in flight at the kill, or after it
                    slowest, asked = max(slowest, took), asked + 1
            rounds_after += seen_before_round
            assert not watch_error, f"watching the node loss failed: {watch_error[0]!r}"
            assert time.monotonic() < deadline, f"node {victim} killed at {killed_at}, seen gone at {seen_at}"
        killer.join(60)
        health = http(trio.node_url(CLIENT_NODE), "GET", f"/_cluster/health/{indices}")
        assert health.get("status") in ("yellow", "green"), health  # every shard kept a copy
    finally:
        searcher.close()
        embedded.close()
        for i, proc in enumerate(trio.procs):
            if proc is None or proc.poll() is not None:
                trio.restart(i)
    report(
        f"{fault_engine}: node {victim} killed during questions: seen gone by the cluster after"
        f" {seen_at[0] - killed_at[0]:.1f} s; slowest of {asked} questions during the loss {slowest:.2f} s"
    )


# -- 3. an index that refuses writes ---------------------------------------------------------------------
@pytest.mark.parametrize("block", ["write", "read_only_allow_delete"])
def test_an_add_to_a_blocked_index_fails_in_one_line_and_loses_nothing(
    trio: Cluster,
    fault_engine: str,
    base_config: Config,
    corpus: Path,
    facts: list[Fact],
    tmp_path: Path,
    block: str,
) -> None:
    """An add to a contexts index under a block fails with one line saying the index refuses writes; the
    index keeps what it held (counts, settings, answers); with the block lifted the same add completes.

    An add, not the ``add`` command: the command turns the same BackendError into its one line and exit
    1 (the ingest test checks that on a real failure), and its start-up costs ~20 s a run here."""
    wait_usable(trio)
    config = engine_cfg(base_config, fault_engine, trio.node_url(CLIENT_NODE))
    ingest(corpus, config, progress=False)
    names = index_names(config.opensearch_prefix)
    indices = ",".join(names.values())
    url = config_url(config)
    qs = questions(facts)
    new = write_new_articles(tmp_path / "new.jsonl")
    searcher = Searcher.open(config)
    try:
        before, stats, settings = searcher.score_batch(qs), counts(config), bulk_settings(url, indices)
        try:
            # The block set by hand was lifted by the disk monitor before the add wrote (a CI failure).
            hold_blocks(url, hold=block == "read_only_allow_delete")
            acked = http(url, "PUT", f"/{names['contexts']}/_settings", {f"index.blocks.{block}": True})
            assert acked.get("acknowledged"), acked
            with pytest.raises(BackendError) as refused:
                add_articles(new, config, progress=False)
            line = str(refused.value)
            assert "\n" not in line and "refuses writes" in line, line
            assert counts(config) == stats  # nothing written, nothing lost
            assert bulk_settings(url, indices) == settings  # replicas and refresh put back
            for q, a, b in zip(qs, searcher.score_batch(qs), before):
                assert_same(b, a, f"{q.text} (after an add refused by a {block} block)")
            assert searcher.backend.find_titles(NEW_ARTICLES[0]["title"], 1) == []
        finally:
            http(url, "PUT", f"/{names['contexts']}/_settings", {f"index.blocks.{block}": None})
            hold_blocks(url, hold=False)
        summary = add_articles(new, config, progress=False)  # the block lifted: the same add completes
        assert summary.articles == len(NEW_ARTICLES)
        assert counts(config)[0] == stats[0] + len(NEW_ARTICLES)
        assert bulk_settings(url, indices) == settings
        scored = searcher.score_batch(NEW_QUESTIONS[:1])[0]
        assert searcher.encoder.vocab[int(np.argmax(scored.p_knn))] == "oskavel"
    finally:
        searcher.close()
        http(url, "DELETE", f"/{indices}")


# -- 1b. a node lost while an add writes -----------------------------------------------------------------
def test_an_add_survives_a_node_loss(
    trio: Cluster,
    trio_index: Config,
    index_copy: Config,
    facts: list[Fact],
    tmp_path: Path,
    fault_engine: str,
    monkeypatch: pytest.MonkeyPatch,
    report: Callable[[str], None],
) -> None:
    """A node (not the client's) killed while an add writes: the cluster keeps a copy of every shard,
    questions still answer, the add completes or fails in one line and its re-run (node still down)
    completes; after the node is back the index equals an uninterrupted add on an embedded index.

    (An add that dropped the replicas while it ran lost the only copies of the killed node's shards.)"""
    heal(trio)
    new = write_new_articles(tmp_path / "new.jsonl")
    assert add_articles(new, index_copy, progress=False).articles == len(NEW_ARTICLES)  # the reference
    names = index_names(trio_index.opensearch_prefix)
    indices = ",".join(names.values())
    held = primaries(trio, indices)
    # The node to lose: of those the client does not talk to, the one holding the most primaries.
    victim = max((1, 2), key=lambda i: len(held.get(f"node-{i}", [])))
    assert held.get(f"node-{victim}"), f"nodes 1 and 2 hold no primary of {indices}: {held}"
    kb = [q for q in questions(facts) if q.subject]
    searcher = Searcher.open(trio_index)
    before = searcher.score_batch(kb)

    writing, killed = threading.Event(), threading.Event()
    bulk = EngineBackend._bulk

    def watched_bulk(self: EngineBackend, what: str, actions: Any) -> None:
        if what == "write contexts" and not writing.is_set():
            # The add is in bulk mode and about to send its contexts: the node dies now, and they go to
            # shards whose primary it may have held.
            writing.set()
            killed.wait(60)
        bulk(self, what, actions)

    monkeypatch.setattr(EngineBackend, "_bulk", watched_bulk)
    outcome: dict[str, Any] = {}

    def add() -> None:
        started = time.monotonic()
        try:
            outcome["summary"] = add_articles(new, trio_index, progress=False)
        except BaseException as exc:  # judged below, in the test's thread
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - started

    adder = threading.Thread(target=add, daemon=True)
    timings = {"seen": float("nan"), "slowest": 0.0, "healed": float("nan")}
    adder.start()
    try:
        assert writing.wait(120), f"the add never started writing: {outcome}"
        trio.kill(victim)
        killed.set()
        killed_at = time.monotonic()
        health = wait_node_left(trio, indices)
        timings["seen"] = time.monotonic() - killed_at
        lost = unassigned_primaries(trio, indices)
        assert health["status"] != "red" and not lost, (
            f"node {victim} killed during an add: {indices} {health['status']}, primaries without a copy:"
            f" {lost}; (replicas, refresh) during the add: {bulk_settings(config_url(trio_index), indices)}"
        )
        for q, b in zip(kb, before):
            started = time.monotonic()
            a = searcher.score_batch([q])[0]
            took = time.monotonic() - started
            timings["slowest"] = max(timings["slowest"], took)
            assert took < QUESTION_LIMIT_S, f"{q.text!r} took {took:.1f} s during the node loss"
            assert_same(b, a, f"{q.text} (node {victim} killed during an add)")
        adder.join(300)
        assert not adder.is_alive(), "the add hung after the node loss"
        if "error" in outcome:
            error = outcome["error"]
            assert isinstance(error, BackendError) and "\n" not in str(error), repr(error)
            monkeypatch.undo()
            rerun = add_articles(new, trio_index, progress=False)  # the node is still down
            assert rerun.articles + rerun.already_stored == len(NEW_ARTICLES)
        else:
            assert outcome["summary"].articles == len(NEW_ARTICLES)
    finally:
        killed.set()
        monkeypatch.undo()
        searcher.close()
        timings["healed"] = heal(trio)
        adder.join(300)
        error = outcome.get("error")
        report(
            f"{fault_engine}: node {victim} killed during an add: seen gone after {timings['seen']:.1f} s;"
            f" the add {'failed' if error else 'completed'} in {outcome.get('seconds', float('nan')):.1f} s"
            f"{f' ({error})' if error else ''}; slowest question {timings['slowest']:.2f} s;"
            f" restart to green {timings['healed']:.1f} s"
        )
    assert_same_index(trio_index, index_copy, [*questions(facts), *NEW_QUESTIONS])


def three_shard_index(config: Config, corpus: Path) -> None:
    """``corpus`` ingested into ``config``'s engine with the contexts in 3 shards of 1 replica."""
    shipped = engine_bodies.load_mapping

    def three_shards(name: str) -> dict[str, Any]:
        body = shipped(name)
        if name.endswith("-contexts"):
            body["settings"]["index"].update(number_of_shards=3, number_of_replicas=1)
        return body

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine_bodies, "load_mapping", three_shards)
        ingest(corpus, config, progress=False)


def test_node_0_lost_during_an_add_given_every_node_url(
    trio: Cluster,
    base_config: Config,
    corpus: Path,
    index_copy: Config,
    facts: list[Fact],
    tmp_path: Path,
    fault_engine: str,
    monkeypatch: pytest.MonkeyPatch,
    report: Callable[[str], None],
    request: pytest.FixtureRequest,
) -> None:
    """The client given every node's URL (a comma list): node 0, the one a single-URL client talks to,
    killed (kill -9) as an add starts writing. The add completes with the two nodes left, questions answer
    as before, and once the node is back the index equals an uninterrupted add on an embedded index.
    (With one URL such an add stopped after 18 s of retries while two nodes held a copy of every shard,
    and a comma list was a traceback.)"""
    if fault_engine == "opensearch":
        # Not a fault of the client (it moves on to nodes 1 and 2): in 2 of 3 runs, nodes 1 and 2 logged
        # "failed to apply mappings: [index.version.created] is not present in the index settings" for
        # the contexts index as node 0, the cluster manager, died, and failed its shards, so no primary
        # was active for 5 minutes; the third run completed. Elasticsearch completed the add (10.8 s).
        # Since every add stopped updating the contexts mapping (its bulk-load record lives in the
        # articles index) and the contexts index is graph-less with index.knn true, 12 of 13 runs passed
        # (run with --runxfail); the failing run's cause was not kept. Still marked until it is.
        request.applymarker(
            pytest.mark.xfail(reason="OpenSearch may still fail this add as its manager dies (1 run of 13)")
        )
    heal(trio)
    new = write_new_articles(tmp_path / "new.jsonl")
    assert add_articles(new, index_copy, progress=False).articles == len(NEW_ARTICLES)  # the reference
    single = engine_cfg(base_config, fault_engine, trio.node_url(0))
    three_shard_index(single, corpus)
    wait_green(trio, ",".join(index_names(single.opensearch_prefix).values()))
    every = ",".join(trio.node_url(i) for i in range(trio.nodes))
    config = single.replace(**{f"{fault_engine}_url": every})
    kb = [q for q in questions(facts) if q.subject]
    searcher = Searcher.open(config)
    before = searcher.score_batch(kb)
    bulk = EngineBackend._bulk
    killed: list[float] = []

    def watched_bulk(self: EngineBackend, what: str, actions: Any) -> None:
        if what == "write contexts" and not killed:
            trio.kill(0)  # the node every client talked to
            killed.append(time.monotonic())
        bulk(self, what, actions)

    monkeypatch.setattr(EngineBackend, "_bulk", watched_bulk)
    took, slowest, healed = float("nan"), 0.0, float("nan")
    try:
        started = time.monotonic()
        try:
            summary = add_articles(new, config, progress=False)
        except BackendError as exc:
            pytest.fail(f"the add stopped with node 0 lost: {exc} ({nodes_state(trio)})")
        took = time.monotonic() - started
        assert killed, "the add never wrote"
        assert summary.articles == len(NEW_ARTICLES)
        monkeypatch.undo()
        for q, b in zip(kb, before):
            asked = time.monotonic()
            a = searcher.score_batch([q])[0]
            slowest = max(slowest, time.monotonic() - asked)
            assert_same(b, a, f"{q.text} (node 0 killed)")
        scored = searcher.score_batch(NEW_QUESTIONS[:1])[0]
        assert searcher.encoder.vocab[int(np.argmax(scored.p_knn))] == "oskavel"
    finally:
        monkeypatch.undo()
        searcher.close()
        healed = heal(trio)
        report(
            f"{fault_engine}: node 0 killed as an add given every node's URL wrote: the add completed in"
            f" {took:.1f} s; slowest question after {slowest:.2f} s; restart to green {healed:.1f} s"
        )
    try:
        assert_same_index(single, index_copy, [*questions(facts), *NEW_QUESTIONS])
    finally:
        http(trio.node_url(0), "DELETE", "/" + ",".join(index_names(single.opensearch_prefix).values()))


def test_a_question_never_answers_from_part_of_the_contexts(
    trio: Cluster, trio_index: Config, facts: list[Fact], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a shard of the contexts index gone (no replica, and its node killed), a question fails in
    one line or answers as before: never from the contexts that are left (a 200 from two of the three
    shards, which the engines give unless asked not to).

    Retries are cut short here (the shard does not come back). The node is started again at the end
    without waiting (the next test on this cluster waits)."""
    monkeypatch.setattr(
        EngineBackend, "retry", RetryPolicy(attempts=2, initial_backoff=0.05, max_backoff=0.1)
    )
    heal(trio)
    names = index_names(trio_index.opensearch_prefix)
    contexts, url = names["contexts"], trio.node_url(CLIENT_NODE)
    qs = questions(facts)
    searcher = Searcher.open(trio_index)
    victim = None
    try:
        before = searcher.score_batch(qs)
        http(url, "PUT", f"/{contexts}/_settings", {"index": {"number_of_replicas": 0}})
        # The node to lose holds a contexts primary and not the articles one (so that the IR step works).
        victim = next(i for i in (2, 1) if not primaries(trio, names["articles"]).get(f"node-{i}"))
        held = primaries(trio, contexts)
        if not held.get(f"node-{victim}"):
            source, shards = next((node, shards) for node, shards in held.items() if shards)
            move = {"index": contexts, "shard": int(shards[0].split("/")[1]), "from_node": source}
            http(
                url,
                "POST",
                "/_cluster/reroute",
                {"commands": [{"move": move | {"to_node": f"node-{victim}"}}]},
            )
        wait_green(trio, contexts)
        assert primaries(trio, contexts).get(f"node-{victim}"), primaries(trio, contexts)
        trio.kill(victim)
        wait_node_left(trio, contexts)
        assert unassigned_primaries(trio, contexts), "the contexts index kept every shard"
        refused = 0
        for q, b in zip(qs, before):
            try:
                a = searcher.score_batch([q])[0]
            except BackendError as exc:  # refusing to answer is right; answering from part is not
                assert "\n" not in str(exc), str(exc)
                refused += 1
                continue
            assert_same(b, a, f"{q.text} (a shard of {contexts} lost, the question answered anyway)")
        assert refused, "no question needed the lost shard"
    finally:
        searcher.close()
        if victim is not None:
            trio.restart(victim)
        http(url, "PUT", f"/{contexts}/_settings", {"index": {"number_of_replicas": 1}})


# -- 2. the whole engine killed mid-ingest ---------------------------------------------------------------
def test_an_ingest_killed_with_the_engine_resumes_to_the_same_index(
    fault_engine: str,
    base_config: Config,
    corpus: Path,
    built_index: Config,
    facts: list[Fact],
    tmp_path_factory: pytest.TempPathFactory,
    report: Callable[[str], None],
) -> None:
    """``ingest wiki`` (a subprocess) against a single node that is killed (kill -9) once it has stored
    the first bulk of contexts: one line and a nonzero exit; after the node restarts on its data the same
    ingest completes, and the index equals the embedded one of the same corpus."""
    solo, started = start_cluster(fault_engine, 1, tmp_path_factory.mktemp(f"faults-solo-{fault_engine}"))
    relay = Relay(solo.port, on_bulk=lambda: solo.kill(0))
    try:
        config = engine_cfg(base_config, fault_engine, solo.url)
        command = [
            "ingest", "wiki", str(corpus), *where_flags(config, relay.url), "--model", base_config.model,
            "--device", "cpu", "--max-length", "64", "--contexts", "eager", "--precision", "fp32",
            "--batch-size", "32", "--no-progress",
            "--workers", "0",  # no reader process: half the command's start-up on a 2-core machine
        ]  # fmt: skip
        t0 = time.monotonic()
        killed = run_cli(*command)
        failed_in = time.monotonic() - t0
        assert relay.fired.is_set(), (
            f"the ingest ended before its first bulk: {killed.stdout} {killed.stderr}"
        )
        line = one_line_error(killed)
        assert "write contexts" in line, line
        t0 = time.monotonic()
        solo.restart(0)
        solo.wait_ready(READY_S)
        restarted_in = time.monotonic() - t0
        # The same ingest again (in this process: the command's own code, without its start-up).
        summary = ingest(corpus, config, progress=False)
        articles = len(corpus.read_text().splitlines())
        assert summary.articles + summary.already_stored == articles
        names = index_names(config.opensearch_prefix)
        settings = bulk_settings(solo.url, ",".join(names.values()))
        assert all(r != "0" and i != "-1" for r, i in settings.values()), settings  # bulk settings undone
        assert_same_index(config, built_index, questions(facts))
    finally:
        relay.close()
        solo.stop()
    report(
        f"{fault_engine}: single node started in {started:.1f} s; the ingest command killed mid-write"
        f" failed after {failed_in:.1f} s; the node restarted in {restarted_in:.1f} s"
    )
