"""``titles`` and ``stats``: what an index holds."""

from __future__ import annotations

from typing import Any

import click

from bertknn_search import session
from bertknn_search.cli.options import (
    index_options,
    json_option,
)
from bertknn_search.errors import IndexNotFoundError


@click.command()
@click.argument("pattern", default="")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Titles at most.")
@json_option
@index_options
def titles(pattern: str, limit: int, as_json: bool, **flags: Any) -> None:
    """List the index's titles that hold PATTERN (any case; all without one), with how much of each
    article is encoded on a lazy index: the subjects a question can name.

    Example: bertknn-search titles einstein
    """
    from bertknn_search.output import render_titles, to_json

    resolved = session.resolve_config(flags)
    try:
        listed = session.list_titles(resolved.config, pattern, limit)
    except IndexNotFoundError as exc:
        raise session.engine_hint(exc, resolved) from exc
    if as_json:
        for title in listed:
            click.echo(to_json(title))
    else:
        click.echo(render_titles(listed, pattern))


@click.command()
@json_option
@index_options
def stats(as_json: bool, **flags: Any) -> None:
    """Show what the index holds: articles, contexts, model, layer, bytes on disk.

    Example: bertknn-search stats --index ./bertknn-index
    """
    from bertknn_search.output import render_stats, to_json

    resolved = session.resolve_config(flags)
    try:
        result = session.index_stats(resolved.config)
    except IndexNotFoundError as exc:
        raise session.engine_hint(exc, resolved) from exc
    click.echo(to_json(result) if as_json else render_stats(result))
