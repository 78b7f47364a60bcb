"""The ``bertknn-search`` command line: each command parses, builds a Config, calls one function, renders.

One module per command group; this one only assembles them under ``main`` (the console script's entry).
"""

from __future__ import annotations

import click

from bertknn_search.cli.demo import demo
from bertknn_search.cli.engine import engine_group
from bertknn_search.cli.eval import eval_group
from bertknn_search.cli.group import Group
from bertknn_search.cli.ingest import add, ingest
from bertknn_search.cli.inspect import stats, titles
from bertknn_search.cli.model import model_group
from bertknn_search.cli.query import query, warm
from bertknn_search.cli.serve import serve


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bertknn-search")
def main() -> None:
    """Answer cloze questions with BERT-kNN: BERT interpolated with a kNN over Wikipedia contexts.

    Example: bertknn-search query "Albert Einstein received the Nobel Prize in [MASK]."
    """


for command in (ingest, add, query, warm, titles, serve, stats, demo, eval_group, engine_group, model_group):
    main.add_command(command)
