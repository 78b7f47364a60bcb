"""Warm questions through ``bertknn-search serve`` (``bench_engines.py --modes serve``), as a user asks them.

One ``serve`` process per backend (the embedded index folder, the OpenSearch and the Elasticsearch index
of the same corpus and model), each started with the command a user types and asked over HTTP by one
client with a keep-alive connection, one question a ``POST /query``. Every server is asked every question
once to warm (the engines' sentence cache fills then), then ``rounds`` rounds, the servers taking turns
question by question (the first of each turn rotating), so that the load of a shared machine falls on
all alike. The time is the client's: from the request sent to the answer read.

Requests are counted at the engine's side of the server: a second ``serve`` per engine is pointed at a
``CountingProxy`` in front of the node, asked every question once to warm and once counted. The timed
servers talk to the nodes directly, so the proxy's own cost is in no timing.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
from common import load_average, percentiles, start_serve
from engines_meter import by_kind, kinds_of

from bertknn_search.config import Config
from bertknn_search.records import Question

# `bertknn-search serve` with the IR search and the encoder pass one after the other, as before they ran
# side by side (``Searcher.score_batch``): ``--serve-before`` times it beside the servers as they are.
SEQUENTIAL = """
import sys
from concurrent.futures import Future
from bertknn_search.query.search import Searcher

class InTurn:
    def submit(self, fn, *args):
        done = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as exc:
            done.set_exception(exc)
        return done

Searcher._ir_pool = lambda self: InTurn()
from bertknn_search.cli import main
sys.argv = ["bertknn-search", *sys.argv[1:]]
main()
"""
READY_S = 600.0  # a server loading MiniLM on 2 busy cores takes seconds; a failed start says so at once
TOP = 10
IDLE_S = 2.0  # longer than the server waits before its idle work (batcher.IDLE_AFTER_S)


# -- a server ----------------------------------------------------------------------------------------
def serve_flags(config: Config) -> list[str]:
    """The ``serve`` options of ``config``'s index, as a user gives them."""
    flags = ["--device", config.device]
    if config.backend == "embedded":
        return [*flags, "--index", str(config.index)]
    url = config.opensearch_url if config.backend == "opensearch" else config.elasticsearch_url
    prefix = ["--index-prefix", config.opensearch_prefix]
    return [*flags, "--backend", config.backend, f"--{config.backend}-url", str(url), *prefix]


class ServeProcess:
    """``python -m bertknn_search serve`` on 127.0.0.1 (``port``; 0: a free one), ready once its model is
    loaded, asked over one keep-alive connection."""

    def __init__(self, name: str, flags: Sequence[str], port: int, prelude: str | None = None) -> None:
        self.name = name
        args = ["serve", *flags, "--port", str(port)]
        cmd = [sys.executable, "-m", "bertknn_search", *args]
        if prelude is not None:  # the same command with a patch applied first (a same-run comparison)
            cmd = [sys.executable, "-c", prelude, *args]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.proc, self.url, self.log = start_serve(cmd, env, READY_S)
        if not self.url:
            self.stop()
            raise SystemExit(f"serve for {name} did not start:\n" + "".join(self.log[-20:]))
        parts = urllib.parse.urlsplit(self.url)
        self.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=600)

    def ask(self, question: Question) -> tuple[float, dict[str, Any]]:
        """Seconds from the request sent to the answer read, and the answer."""
        body = json.dumps({"questions": [{"question": question.text, "subject": question.subject}]})
        started = time.perf_counter()
        self.conn.request("POST", "/query", body, {"Content-Type": "application/json"})
        reply = self.conn.getresponse()
        data = reply.read()
        seconds = time.perf_counter() - started
        if reply.status != 200:
            raise SystemExit(f"serve for {self.name} answered {reply.status}: {data[:300]!r}")
        return seconds, json.loads(data)["answers"][0]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- counting the requests at the node ---------------------------------------------------------------
class CountingProxy:
    """An HTTP proxy in front of one engine node that counts the requests passing through, by kind."""

    def __init__(self, upstream: str, port: int) -> None:
        target = urllib.parse.urlsplit(upstream)
        self.sent: list[str] = []
        lock = threading.Lock()
        sent = self.sent

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the engine clients expect of a node

            def forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with lock:
                    sent.append(f"{self.command} {self.path.split('?')[0]}")
                if not hasattr(self.server, "local"):
                    self.server.local = threading.local()  # type: ignore[attr-defined]
                local = self.server.local  # type: ignore[attr-defined]
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                for attempt in (0, 1):  # a kept connection the node closed meanwhile: once more, anew
                    conn = getattr(local, "conn", None)
                    if conn is None:
                        conn = local.conn = http.client.HTTPConnection(
                            target.hostname, target.port, timeout=600
                        )
                    try:
                        conn.request(self.command, self.path, body, headers)
                        reply = conn.getresponse()
                        data = reply.read()
                        break
                    except (OSError, http.client.HTTPException):
                        conn.close()
                        local.conn = None
                        if attempt:
                            raise
                self.send_response(reply.status)
                dropped = ("transfer-encoding", "connection") + (
                    () if self.command == "HEAD" else ("content-length",)
                )
                for key, value in reply.getheaders():
                    if key.lower() not in dropped:
                        self.send_header(key, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = forward

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the runs ----------------------------------------------------------------------------------------
def top_words(answer: dict[str, Any]) -> list[str]:
    return [p["word"] for p in answer["bert_knn"][:TOP]]


def serve_latency(
    configs: dict[str, Config],
    questions: list[Question],
    rounds: int,
    port: int | None,
    before: bool = False,
    kinds: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Warm questions through one ``serve`` per backend, the servers in turn; then engine requests counted
        through a second server per engine behind a ``CountingProxy``. Ports from ``port`` on (servers, then
        counted servers, then proxies), else free ones. ``before``: each engine's server is also timed with
        its IR search and encoder pass in turn (``SEQUENTIAL``), named "<engine>, IR in turn". ``kinds``: each
    question's kind, for times and requests per kind (``engines_meter.by_kind``)."""
    kind = kinds_of(questions, kinds)
    asked: list[str] = []
    ports = iter(range(port, port + 10)) if port else None

    def next_port() -> int:
        return next(ports) if ports is not None else 0

    servers: dict[str, ServeProcess] = {}
    out: dict[str, Any] = {"load_before": load_average()}
    try:
        plan = [(name, config, None) for name, config in configs.items()]
        if before:
            plan += [(f"{n}, IR in turn", c, SEQUENTIAL) for n, c in configs.items() if n != "embedded"]
        for name, config, prelude in plan:
            started = time.perf_counter()
            servers[name] = ServeProcess(name, serve_flags(config), next_port(), prelude)
            out.setdefault("ready_s", {})[name] = round(time.perf_counter() - started, 2)
        names = list(servers)
        tops: dict[str, list[list[str]]] = {name: [] for name in names}
        for q in questions:  # warm: every server every question once
            for name in names:
                tops[name].append(top_words(servers[name].ask(q)[1]))
        times: dict[str, dict[str, list[float]]] = {
            n: {"total": [], "subject": [], "free": []} for n in names
        }
        turn = 0
        for _ in range(rounds):
            for q, k in zip(questions, kind):
                asked.append(k)
                order = names[turn % len(names) :] + names[: turn % len(names)]
                turn += 1
                for name in order:
                    seconds, _answer = servers[name].ask(q)
                    t = times[name]
                    t["total"].append(seconds)
                    t["subject" if q.subject else "free"].append(seconds)
        out["load_after_timing"] = load_average()
    finally:
        for server in servers.values():
            server.stop()
    latency: dict[str, Any] = {}
    for name in names:
        t = times[name]
        latency[name] = {
            **percentiles(t["total"]),
            "subject": percentiles(t["subject"]),
            "free": percentiles(t["free"]),
            "answers": len(t["total"]),
            "question_kinds": by_kind(asked, t["total"], []),
        }
    base = "embedded" if "embedded" in latency else None
    if base:
        for name in names:
            if name == base:
                continue
            row = latency[name]
            row["p50_vs_embedded"] = row["p50_ms"] / latency[base]["p50_ms"]
            row["p95_vs_embedded"] = row["p95_ms"] / latency[base]["p95_ms"]
            pairs = list(zip(tops[name], tops[base]))
            row["top_answer_agrees_with_embedded"] = float(np.mean([a[:1] == b[:1] for a, b in pairs]))
            row["top10_agrees_with_embedded"] = float(np.mean([a == b for a, b in pairs]))
            for k, by in row["question_kinds"].items():
                by["p50_vs_embedded"] = by["p50_ms"] / latency[base]["question_kinds"][k]["p50_ms"]
    out["latency"] = latency
    engines = {n: c for n, c in configs.items() if n != "embedded"}
    out["requests"] = count_requests(engines, questions, tops, next_port, kind)
    out["load_after"] = load_average()
    return out


def count_requests(
    configs: dict[str, Config],
    questions: list[Question],
    tops: dict[str, list[list[str]]],
    next_port: Any,
    question_kinds: Sequence[str],
) -> dict[str, Any]:
    """Per engine: the requests a warm question sends to the node, counted by a proxy in front of it, and
    whether the counted server's answers are the timed one's."""
    out: dict[str, Any] = {}
    ports = {name: next_port() for name in configs}
    for name, config in configs.items():
        url_key = "opensearch_url" if name == "opensearch" else "elasticsearch_url"
        proxy = CountingProxy(str(getattr(config, url_key)), next_port() or free_port())
        server = None
        try:
            server = ServeProcess(
                f"{name} (counted)", serve_flags(config.replace(**{url_key: proxy.url})), ports[name]
            )
            for q in questions:
                server.ask(q)
            counts: list[int] = []
            kinds: Counter[str] = Counter()
            same = []
            start = len(proxy.sent)
            for i, q in enumerate(questions):
                before = len(proxy.sent)
                _, answer = server.ask(q)
                sent = proxy.sent[before:]
                counts.append(len(sent))
                kinds.update(sent)
                same.append(top_words(answer) == tops[name][i])
            time.sleep(IDLE_S)  # the server's idle work starts after a second without questions
            total = len(proxy.sent) - start  # background requests between and after questions too
        finally:
            if server is not None:
                server.stop()
            proxy.close()
        out[name] = {
            "per_question_mean": float(np.mean(counts)),
            "per_question_max": int(max(counts)),
            "total": total,  # over the counted pass and IDLE_S after it
            "questions": len(questions),
            "kinds": dict(kinds.most_common()),
            "answers_equal_timed_server": float(np.mean(same)),
            "question_kinds": {
                kind: {"per_question_mean": float(np.mean(n)), "per_question_max": int(max(n))}
                for kind in dict.fromkeys(question_kinds)
                if (n := [c for c, k in zip(counts, question_kinds) if k == kind])
            },
        }
    return out


def serve_lines(serve: dict[str, Any]) -> list[str]:
    """The serve mode's table for the report."""
    lines = [
        "",
        f"warm questions through serve (load {serve['load_before'][0]} -> {serve['load_after'][0]}): ms | p50"
        " | p95 | p50 subject | p50 free | p50 vs embedded | requests/q (max) | top answer = embedded's"
        " | top 10 = embedded's",
    ]
    for name, v in serve["latency"].items():
        req = serve["requests"].get(name)
        lines.append(
            f"  {name:<13} {v['p50_ms']:7.1f} {v['p95_ms']:7.1f} {v['subject']['p50_ms']:7.1f}"
            f" {v['free']['p50_ms']:7.1f} {v.get('p50_vs_embedded', 1.0):6.2f}x"
            + (f" {req['per_question_mean']:5.1f} ({req['per_question_max']})" if req else "     -    ")
            + f" {v.get('top_answer_agrees_with_embedded', 1.0):6.0%}"
            f" {v.get('top10_agrees_with_embedded', 1.0):6.0%}"
        )
    for name, req in serve["requests"].items():
        lines.append(f"  {name} requests by kind over {req['questions']} warm questions: {req['kinds']}")
    lines += kind_lines(serve["latency"], serve["requests"])
    return lines


def kind_lines(latency: dict[str, Any], requests: dict[str, Any]) -> list[str]:
    """Per question kind and backend: p50 ms, its ratio to embedded's and the engine requests (mean, most)."""
    lines = ["  by question kind: p50 ms (vs embedded) [requests a question, most]"]
    for name, v in latency.items():
        cells = []
        for kind, row in v.get("question_kinds", {}).items():
            req = requests.get(name, {}).get("question_kinds", {}).get(kind) or row
            count = req.get("per_question_mean", req.get("requests_per_question"))
            most = req.get("per_question_max", req.get("requests_max"))
            said = f" [{count:.2f}, {most}]" if count is not None else ""
            cells.append(f"{kind} {row['p50_ms']:.1f} ({row.get('p50_vs_embedded', 1.0):.2f}x){said}")
        lines.append(f"    {name:<13} " + "; ".join(cells))
    return lines
