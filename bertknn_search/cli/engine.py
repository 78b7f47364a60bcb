"""``bertknn-search engine start``: a real OpenSearch or Elasticsearch on 127.0.0.1, no Docker.

A thin layer over ``bertknn_search.nodes.launch``, which the tests use too.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import click

from bertknn_search.errors import ConfigError


@click.group("engine")
def engine_group() -> None:
    """Run a real search engine for the opensearch and elasticsearch backends.

    Example: bertknn-search engine start opensearch
    """


@engine_group.command("start")
@click.argument("name", type=click.Choice(["opensearch", "elasticsearch"]))
@click.option(
    "--port", type=click.IntRange(1, 65000), default=9200, show_default=True, help="HTTP port of node 0."
)
@click.option(
    "--nodes",
    type=click.IntRange(1, 9),
    default=1,
    show_default=True,
    help="Nodes, one JVM each, on consecutive ports (transport ports from --port + 100).",
)
@click.option(
    "--data",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the nodes keep their data [default ~/.local/share/bertknn-search/NAME-PORT].",
)
@click.option("--heap", default="1g", show_default=True, help="JVM heap of each node (-Xmx).")
@click.option(
    "--no-progress",
    is_flag=True,
    help="No progress bar while the jars are fetched (a line every 10 s instead).",
)
def start(name: str, port: int, nodes: int, data: Path | None, heap: str, no_progress: bool) -> None:
    """Start NAME on 127.0.0.1 and run until Ctrl-C or SIGTERM, which stop every node cleanly.

    The first start fetches the engine's jars from Maven Central (Java 17+ and Maven needed) into
    ~/.cache/bertknn-search/engines (or $BERTKNN_ENGINE_CACHE); later starts reuse them. Each step is said
    on stderr with its seconds; the nodes stop with this command, however it ends. The data folder is
    marked with its engine: another engine's folder is refused before anything is written there.

    Example: bertknn-search engine start elasticsearch --port 9201
    """
    from bertknn_search.nodes.launch import Cluster, EngineError, Stopped, engine

    spec = engine(name)
    cluster = Cluster(spec, port=port, nodes=nodes, data=data, heap=heap)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            cluster.start(
                say=lambda line: click.echo(line, err=True), progress=not no_progress, stopping=stop.is_set
            )
        except EngineError as exc:
            raise ConfigError(str(exc)) from exc
        except Stopped:  # Ctrl-C or SIGTERM while starting: the nodes stop below, none is left behind
            click.echo("stopped before ready", err=True)
            return
        env = "OPENSEARCH_URL" if name == "opensearch" else "ELASTICSEARCH_URL"
        click.echo(f"ready: {cluster.url} ({spec.label}, {nodes} node{'s' * (nodes > 1)})")
        click.echo(f"use it: export {env}={cluster.url}; bertknn-search ... --backend {name}", err=True)
        _watch(cluster, stop)
    finally:
        cluster.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    click.echo("stopped", err=True)


def _watch(cluster: Any, stop: threading.Event) -> None:
    """Wait for a stop signal; a node that dies on its own is said once, the others keep running."""
    told: set[int] = set()
    while not stop.wait(1.0):
        for i, proc in enumerate(cluster.procs):
            if i not in told and proc is not None and proc.poll() is not None:
                told.add(i)
                click.echo(f"node {i} exited ({proc.returncode}): {cluster.why(i)}", err=True)
        if len(told) == len(cluster.procs):
            raise ConfigError(f"every node of {cluster.url} has exited; see {cluster.data}/node-*/logs")
