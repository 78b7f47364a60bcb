"""``ingest wiki`` and ``add``: a corpus into a new or existing index (``ingest.pipeline``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from bertknn_search import session
from bertknn_search.cli.group import defer_interrupts
from bertknn_search.cli.options import (
    encoding_options,
    index_options,
    ingest_options,
    model_options,
)


@click.group()
def ingest() -> None:
    """Build an index from a corpus.

    Example: bertknn-search ingest wiki enwiki-latest-pages-articles1.xml-p1p41242.bz2 --limit 1000
    """
    defer_interrupts()


@ingest.command("wiki")
@ingest_options
@click.option(
    "--workers",
    type=click.IntRange(min=0, max=1024),
    help="Processes that read, strip and prepare text (0: none, a thread does it) [default: a third of"
    " the cores, at least 1].",
)
@model_options(new_index=True)
@encoding_options
@index_options
def ingest_wiki(
    source: Path,
    fmt: str | None,
    limit: int | None,
    workers: int | None,
    no_progress: bool,
    as_json: bool,
    **flags: Any,
) -> None:
    """Ingest a Wikipedia dump (XML .bz2, JSONL, parquet or WikiExtractor output) into an index.

    Interrupted or crashed runs resume: run the same command again. A new index takes --model, --layer,
    --mask-policy, --store-dtype and --max-length; an existing one keeps its own.

    Example: bertknn-search ingest wiki enwiki-latest-pages-articles1.xml-p1p41242.bz2 --limit 1000
    """
    from bertknn_search.ingest.pipeline import ingest as run_ingest

    resolved, said = session.policy_for_model(session.open_index(flags, must_exist=False))
    for line in (session.new_index_note(resolved), said):
        if line and not as_json:
            click.echo(line, err=True)
    config = resolved.config
    # JSON output is for scripts: no bar on stderr to mix into their logs (as for add).
    progress = not (no_progress or as_json)
    summary = run_ingest(source, config, limit=limit, fmt=fmt, progress=progress, workers=workers)
    _print_summary(summary, as_json, "ingested")


@click.command()
@ingest_options
@model_options(new_index=False)
@index_options
def add(
    source: Path, fmt: str | None, limit: int | None, no_progress: bool, as_json: bool, **flags: Any
) -> None:
    """Add or replace articles in an existing index while it serves; answerable when this returns.

    An article whose id is stored already is replaced by the new text.

    Example: bertknn-search add new-articles.jsonl
    """
    from bertknn_search.ingest.pipeline import add_articles

    defer_interrupts()
    config = session.open_index(flags).config
    # JSON output is for scripts: no bar on stderr to mix into their logs.
    summary = add_articles(source, config, limit=limit, fmt=fmt, progress=not (no_progress or as_json))
    _print_summary(summary, as_json, "added")


def _print_summary(summary: Any, as_json: bool, verb: str) -> None:
    from bertknn_search.output import render_summary, to_json

    click.echo(to_json(summary) if as_json else render_summary(summary, verb))
