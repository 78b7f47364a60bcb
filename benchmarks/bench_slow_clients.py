"""A warm question beside thousands of slow clients (issue 51.6), against the same question alone.

1. Builds an eager index of synthetic articles (random keys, as ``bench_serve.py``) for a random
   BERT-shaped model and starts ``bertknn-search serve`` on 127.0.0.1 with the file limit raised to the
   hard one (``ulimit -n``), as an operator expecting many clients would.
2. Alone: one question asked ``--repeats`` times on a fresh connection each (after a warm-up), median.
3. Beside ``--slow`` slow clients, from ``--attackers`` child processes (an asyncio loop each, so the
   file limit holds): each opens a connection, sends a request line and then a header line every
   ``--every-s`` seconds, never the blank line that ends the head; a connection the server closes is
   opened again at the client's next tick. Once all have connected, the same question is timed again,
   while the clients keep sending; the server's open descriptors are sampled (``/proc/PID/fd``).
4. Alone again, so that a drift of the shared machine's load falls on both sides; ratio = beside /
   the mean of the two alone medians.

Reported: the medians and the ratio, the slow clients' connects and closes, the server's most open
descriptors, and its stderr: lines about the cap, tracebacks, "Too many open files". Loopback only;
every phase is bounded (``--slow-seconds``, a question timeout).

    python benchmarks/bench_slow_clients.py --model-size tiny --slow 20000
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from bench_query import add_synthetic, make_questions
from common import (
    LAYER,
    CorpusGenerator,
    Progress,
    argument_parser,
    build_model,
    environment,
    run_benchmark,
    start_serve,
)

from bertknn_search.config import Config

# One attacker: ``n`` slow connections to host:port for ``seconds``; prints its counts as JSON.
ATTACKER = r"""
import asyncio, json, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
every, seconds, ramp_bound = float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
counts = {"connects": 0, "closed": 0, "failed": 0, "lines": 0, "ramp_s": 0.0}
state = {"stop": False, "opened": 0}

async def one(i):
    await asyncio.sleep(i * 0.0005)  # a ramp, not 10,000 SYNs at once
    first = True
    while not state["stop"]:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            counts["failed"] += 1
            await asyncio.sleep(every)
            continue
        counts["connects"] += 1
        if first:
            state["opened"] += 1
            first = False
        try:
            writer.write(b"GET / HTTP/1.1\r\n")
            while not state["stop"]:
                try:
                    data = await asyncio.wait_for(reader.read(1024), timeout=every)
                    if not data:
                        break
                except asyncio.TimeoutError:
                    pass
                writer.write(b"X-Slow: %d\r\n" % i)
                await writer.drain()
                counts["lines"] += 1
        except OSError:
            pass
        counts["closed"] += 1
        writer.close()
        await asyncio.sleep(every)  # the next tick: open it again

async def main():
    start = time.monotonic()
    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    while state["opened"] < n and time.monotonic() - start < ramp_bound:
        await asyncio.sleep(0.2)
    counts["ramp_s"] = time.monotonic() - start
    counts["opened"] = state["opened"]
    print("RAMPED", flush=True)
    await asyncio.sleep(seconds)
    state["stop"] = True
    await asyncio.wait(tasks, timeout=2 * every + 5)
    print(json.dumps(counts), flush=True)

asyncio.run(main())
"""


def raise_file_limit() -> int:
    """The soft file limit raised to the hard one (children inherit it); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def ask(url: str, question: dict[str, str], timeout: float) -> float:
    """Seconds for one question on a fresh connection (as a new client would); raises on a non-200."""
    parts = urllib.parse.urlsplit(url)
    start = time.perf_counter()
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("POST", "/query", json.dumps(question), {"Content-Type": "application/json"})
        reply = conn.getresponse()
        reply.read()
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}")
    finally:
        conn.close()
    return time.perf_counter() - start


def timed_questions(url: str, question: dict[str, str], repeats: int, timeout: float) -> dict[str, Any]:
    seconds = [ask(url, question, timeout) for _ in range(repeats)]
    return {"median_ms": statistics.median(seconds) * 1000, "max_ms": max(seconds) * 1000, "n": len(seconds)}


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU seconds so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def run(args: argparse.Namespace) -> dict[str, Any]:
    limit = raise_file_limit()
    model = build_model(args.model_size)
    tmp = Path(tempfile.mkdtemp(prefix="bench-slow-", dir=args.tmp))
    results: dict[str, Any] = {
        "environment": environment("cpu"),
        "model_size": args.model_size,
        "file_limit": limit,
        "slow_clients": args.slow,
    }
    progress = Progress(args.out, results)
    attackers: list[subprocess.Popen[str]] = []
    try:
        config = Config(model=str(model), layer=LAYER, index=tmp / "index", device="cpu", contexts="eager")
        articles = CorpusGenerator(seed=args.seed).articles(args.articles)
        add_synthetic(articles, config, args.seed)
        text, subject = make_questions(articles, 1, args.seed)[0]
        question = {"question": text, "subject": subject}
        cmd = [sys.executable, "-m", "bertknn_search", "serve", "--index", str(config.index), "--port", "0"]
        server, url, log = start_serve(cmd, {**os.environ, "HF_HUB_OFFLINE": "1"}, 900.0)
        try:
            if not url:
                raise RuntimeError("the server did not start:\n" + "".join(log))
            pid = server.pid
            for _ in range(3):
                ask(url, question, 120)  # warm: its article's contexts are stored (eager), shapes seen
            idle = cpu_seconds(pid), time.monotonic()
            time.sleep(5)
            results["server_cpu_idle"] = (cpu_seconds(pid) - idle[0]) / (time.monotonic() - idle[1])
            before = timed_questions(url, question, args.repeats, 60)
            progress.done("alone", f"median {before['median_ms']:.1f} ms", alone_before=before)
            port = urllib.parse.urlsplit(url).port
            each = args.slow // args.attackers
            for _ in range(args.attackers):
                # At nice 19: on a machine of few cores the clients' own loops would otherwise take the
                # server's CPU, which is not what is measured.
                cmd = [
                    "nice",
                    "-n",
                    "19",
                    sys.executable,
                    "-c",
                    ATTACKER,
                    "127.0.0.1",
                    str(port),
                    str(each),
                    str(args.every_s),
                ]
                cmd += [str(args.slow_seconds), str(args.ramp_bound_s)]
                attackers.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
            for proc in attackers:
                assert proc.stdout is not None
                proc.stdout.readline()  # RAMPED
            fds = [open_fds(pid)]
            busy = cpu_seconds(pid), time.monotonic()
            beside = []
            deadline = time.monotonic() + args.slow_seconds - 5
            while len(beside) < args.repeats and time.monotonic() < deadline:
                beside.append(ask(url, question, 60))
                fds.append(open_fds(pid))
                time.sleep(args.gap_s)  # while the slow clients keep sending
            during = {
                "median_ms": statistics.median(beside) * 1000,
                "max_ms": max(beside) * 1000,
                "n": len(beside),
                "server_fds_max": max(fds),
                "server_cpu": (cpu_seconds(pid) - busy[0]) / (time.monotonic() - busy[1]),
            }
            progress.done("beside slow clients", f"median {during['median_ms']:.1f} ms", beside=during)
            counts = []
            for proc in attackers:
                out, _ = proc.communicate(timeout=args.slow_seconds + args.ramp_bound_s + 120)
                counts.append(json.loads(out.strip().splitlines()[-1]))
            results["attackers"] = {k: round(sum(c[k] for c in counts), 1) for k in counts[0]}
            after = timed_questions(url, question, args.repeats, 60)
            alone = (before["median_ms"] + after["median_ms"]) / 2
            progress.done(
                "alone again",
                f"median {after['median_ms']:.1f} ms; ratio {during['median_ms'] / alone:.2f}",
                alone_after=after,
                ratio=during["median_ms"] / alone,
            )
        finally:
            server.terminate()
            results["server_exit"] = server.wait(timeout=120)
            text = "".join(log)
            results["server_log"] = {
                "bytes": len(text),
                "cap_lines": text.count("connections open, the cap"),
                "tracebacks": text.count("Traceback"),
                "too_many_open_files": text.count("Too many open files"),
                "cap_line": next((x.strip() for x in log if "the cap" in x), ""),
            }
    finally:
        for proc in attackers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    progress.finish()
    return results


def report(r: dict[str, Any]) -> str:
    env = r["environment"]
    lines = [
        f"{env['cpu']}, {env['cpu_count']} cores, load {env['load_average']}; file limit {r['file_limit']}",
        f"alone: {r['alone_before']['median_ms']:.1f} / {r['alone_after']['median_ms']:.1f} ms (median)",
        f"beside {r['slow_clients']:,} slow clients: {r['beside']['median_ms']:.1f} ms median,"
        f" {r['beside']['max_ms']:.1f} ms max; ratio {r['ratio']:.2f}",
        f"server: at most {r['beside']['server_fds_max']} descriptors open; CPU (cores busy) idle"
        f" {r['server_cpu_idle']:.3f}, beside the slow clients {r['beside']['server_cpu']:.3f}"
        f" (questions included); log {r['server_log']}",
        f"slow clients: {r['attackers']}",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.set_defaults(model_size="tiny")
    parser.add_argument("--articles", type=int, default=200)
    parser.add_argument("--slow", type=int, default=20000, help="slow clients in all")
    parser.add_argument("--attackers", type=int, default=4, help="processes they are spread over")
    parser.add_argument("--every-s", type=float, default=3.0, help="a header line this often")
    parser.add_argument("--slow-seconds", type=float, default=60.0, help="how long the slow clients run")
    parser.add_argument("--ramp-bound-s", type=float, default=300.0, help="at most this long to connect all")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--gap-s", type=float, default=0.5, help="between the questions beside them")
    parser.add_argument("--tmp", type=Path, default=None)
    run_benchmark(parser, run, report)


if __name__ == "__main__":
    main()
