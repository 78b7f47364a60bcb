"""``demo``: a tiny model and invented facts, ingested and asked, offline in seconds."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bertknn_search.cli.options import (
    no_progress_option,
)


@click.command()
@click.option(
    "--dir",
    "out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo"),
    show_default=True,
    help="Where the demo model, corpus and index go.",
)
@no_progress_option
def demo(out: Path, no_progress: bool) -> None:
    """Build a tiny model and a corpus of invented facts, ingest it and answer questions about it.

    Runs offline in seconds. BERT cannot know the invented facts; kNN over the ingested contexts can.

    Example: bertknn-search demo --dir ./demo
    """
    from bertknn_search.demo import run_demo
    from bertknn_search.output import render_answer, render_summary

    run = run_demo(out, progress=not no_progress)
    click.echo(render_summary(run.summary, "ingested"))
    for answer in run.answers:
        click.echo("\n" + render_answer(answer, 5))
    click.echo(
        f"\nTry: {_this_command()} query --index {run.config.index} --temperature 1"
        ' "Mirvane was born in [MASK]." --subject Mirvane'
    )


def _this_command() -> str:
    """How to run this program again: its bare name where the PATH finds it, else the path it ran by
    (``make demo`` runs .venv/bin/bertknn-search, which no PATH may hold)."""
    import shutil

    ran, found = sys.argv[0], shutil.which("bertknn-search")
    if Path(ran).name != "bertknn-search" or (found and Path(found).resolve() == Path(ran).resolve()):
        return "bertknn-search"
    return ran
