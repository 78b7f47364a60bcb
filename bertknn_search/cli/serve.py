"""``serve``: the HTTP API and page over one index (``server.run``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from bertknn_search import session
from bertknn_search.cli.options import (
    FiniteFloat,
    index_options,
    method_options,
    model_options,
)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0: every one).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="0: any free.")
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Writes (POST/DELETE /articles) need 'Authorization: Bearer <first line of this file>'. Only its"
    " owner may read it (chmod 600); a file not there yet is created, mode 0600, with a new random token.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="A name clients may give in Host besides localhost, 127.0.0.1, [::1] and --host; repeatable."
    " Other names are refused (421), so that web pages cannot reach the server by DNS rebinding.",
)
@click.option(
    "--open-writes",
    is_flag=True,
    help="Allow a --host other than loopback without --token-file: anyone who can reach it may write.",
)
@click.option(
    "--max-body-mb", type=FiniteFloat(min=0.001), default=16.0, show_default=True, help="Largest body."
)
@click.option(
    "--limits",
    metavar="NAME=VALUE,...",
    help="What one request without the token may ask (questions, articles, n-articles, budget, exact,"
    " query-body-mb, lifted-by-token), over the defaults; replaces BERTKNN_SERVE_LIMITS (docs/serving.md).",
)
@click.option(
    "--batch-window-ms",
    type=FiniteFloat(min=0.0, max=1000.0),
    default=5.0,
    show_default=True,
    help="How long a question waits for others to share its encoder pass (at most --batch-size).",
)
@method_options
@model_options(new_index=False)
@index_options
def serve(
    host: str,
    port: int,
    token_file: Path | None,
    allowed_hosts: tuple[str, ...],
    open_writes: bool,
    max_body_mb: float,
    batch_window_ms: float,
    limits: str | None,
    settings: Path | None,
    **flags: Any,
) -> None:
    """Serve an HTTP API and a web page over the index; the method options are the requests' defaults.

    The model is loaded once; questions arriving together are answered in one encoder pass. POST /query,
    POST /articles, DELETE /articles/ID, GET /stats, GET /health; the page is at /, the API docs at
    /docs. SIGTERM or Ctrl-C lets a running add finish first.

    Example: bertknn-search serve --index ./bertknn-index --port 8000
    """
    from bertknn_search.server.app import ServerSettings
    from bertknn_search.server.limits import RequestLimits
    from bertknn_search.server.run import serve as run_server
    from bertknn_search.server.token_file import serve_token

    token = None
    if token_file is not None:
        token, created = serve_token(token_file)
        if created:
            click.echo(f"wrote a new token to {token_file} (mode 0600): writes send its first line", err=True)
    per_request = RequestLimits.from_env() if limits is None else RequestLimits.parse(limits, "--limits")
    config = session.open_index(flags, settings=settings).config
    server = ServerSettings(
        config,
        token,
        int(max_body_mb * 1024 * 1024),
        window_s=batch_window_ms / 1000,
        allowed_hosts=allowed_hosts,
        limits=per_request,
    )
    run_server(server, host, port, open_writes)
