"""``query`` and ``warm``: answer cloze questions here or through a running server, and encode ahead."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from bertknn_search import session
from bertknn_search.cli.options import (
    FiniteFloat,
    cache_option,
    evidence_for_option,
    index_options,
    json_option,
    method_options,
    model_options,
    no_progress_option,
)
from bertknn_search.errors import BertKnnError, InputFormatError
from bertknn_search.textcheck import check_question


@click.command()
@click.argument("questions", nargs=-1)
@click.option(
    "--file",
    "qfile",
    type=click.File("r", encoding="utf-8"),
    help="Questions, one per line ('-' for stdin); a tab may separate a subject.",
)
@click.option("--subject", help="The fact's subject: its own article is searched when a title matches.")
@click.option(
    "--popularity",
    type=FiniteFloat(min=0.0),
    help="The subject's popularity (page views) for --gate popularity [default: its article's, if any].",
)
@click.option("--relation", help="The fact's relation (P19): picks its --gate threshold [default: '*'].")
@click.option(
    "--server",
    metavar="URL|auto",
    help="Ask a running 'bertknn-search serve' (no model loaded here); auto: the one serving --index.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="BERTKNN_TOKEN_FILE",
    help="With --server: send the token on this file's first line (the server's --token-file), which"
    " lifts its per-request limits where they say lifted-by-token [env: BERTKNN_TOKEN_FILE].",
)
@evidence_for_option
@no_progress_option
@method_options
@cache_option
@json_option
@model_options(new_index=False)
@index_options
def query(
    questions: tuple[str, ...],
    qfile: Any,
    subject: str | None,
    popularity: float | None,
    relation: str | None,
    server: str | None,
    token_file: Path | None,
    evidence_for: tuple[str, ...],
    no_progress: bool,
    settings: Path | None,
    as_json: bool,
    **flags: Any,
) -> None:
    """Answer cloze questions: BERT-kNN, BERT and kNN rankings, the articles used and the evidence.

    Example: bertknn-search query "Einstein received the Nobel Prize in [MASK]." --subject "Albert Einstein"

    Example: bertknn-search query "Einstein was born in [MASK]." --evidence-for ulm,germany
    """
    from bertknn_search.records import Question

    asked = [Question(q, subject, popularity, relation) for q in questions] + list(_read_questions(qfile))
    if not asked:
        raise click.UsageError("give a question, or --file with one question per line")
    asked = [dataclasses.replace(q, evidence_for=evidence_for) for q in asked]
    for q in asked:  # before anything heavy is imported or loaded: a malformed question costs nothing
        check_question(q.text)
    if server == "auto" or server is None:
        serving = _serving(flags, settings)
        if server == "auto":
            if serving is None:
                raise click.UsageError(
                    f"--server auto: no server is serving this {_where_flag(flags, settings)}; start one"
                    " with 'bertknn-search serve', or name its URL"
                )
            if serving.starting:
                serving = _wait_for(serving, flags, settings)
            server = serving.url
            flags = {k: v for k, v in flags.items() if k not in LOCATING}  # they found it
        elif serving is not None and serving.starting:
            click.echo(
                f"a server is starting at {serving.url} (loading the model): --server auto waits for it"
                " and answers there",
                err=True,
            )
        elif serving is not None:
            click.echo(
                f"a server is serving this index at {serving.url}: --server {serving.url} (or --server"
                " auto) answers there without loading the model here",
                err=True,
            )
    given = click.get_current_context().get_parameter_source("token_file")
    if token_file is not None and not server and given is ParameterSource.COMMANDLINE:
        # BERTKNN_TOKEN_FILE set for the servers one asks does not stop questions answered here.
        raise click.UsageError("--token-file goes with --server (a server's token); drop it here")
    if server:
        from bertknn_search.server import client
        from bertknn_search.server.wire import read_token

        token = read_token(token_file) if token_file is not None else None
        overrides = client.method_overrides(flags, settings)
        for line in client.lines(server, asked, overrides, as_json, token):
            click.echo(line)
        return
    _answer_here(asked, flags, settings, no_progress, as_json)
    _leave(click.get_current_context())


# The flags that say where the index is: a server found by them answers from its own.
LOCATING = (
    "index",
    "backend",
    "opensearch_url",
    "opensearch_ca",
    "opensearch_verify",
    "opensearch_prefix",
    "elasticsearch_url",
    "elasticsearch_ca",
)


def _serving(flags: dict[str, Any], settings: Path | None) -> Any:
    """The live server that announced itself for the index of ``flags``, embedded or on an engine (cheap:
    a small file read and, when there is one, a request to its loopback URL; standard library only),
    else None. An announcement that is not trusted is said in one line (see ``discovery``)."""
    from bertknn_search.server import discovery

    try:
        config = session.resolve_config(flags, settings=settings).config
    except BertKnnError:
        return None  # the settings are wrong: the query itself says how, in one line
    return discovery.find(discovery.announcement_for(config), lambda line: click.echo(line, err=True))


# How long ``--server auto`` waits for a server that is loading its model (56 s was seen for an embedded
# index on a loaded CPU; a GPU machine's first load of a large model takes longer).
STARTING_WAIT_S = 180.0


def _wait_for(serving: Any, flags: dict[str, Any], settings: Path | None) -> Any:
    """The starting server ``serving`` once it is ready, said in one line while waiting.

    Raises:
        BertKnnError: it is still loading after ``STARTING_WAIT_S``, or it stopped while loading.
    """
    from bertknn_search.server import discovery

    click.echo(
        f"a server is starting at {serving.url} (loading the model); waiting up to {STARTING_WAIT_S:.0f} s",
        err=True,
    )
    config = session.resolve_config(flags, settings=settings).config
    place = discovery.announcement_for(config)
    ready = discovery.wait_ready(place, STARTING_WAIT_S) if place is not None else None
    if ready is None:
        raise BertKnnError(
            f"the server at {serving.url} stopped while loading its model (its log says why); start it"
            " again with 'bertknn-search serve', or leave out --server to answer here"
        )
    if ready.starting:
        raise BertKnnError(
            f"the server at {serving.url} is still loading its model after {STARTING_WAIT_S:.0f} s;"
            f" retry in a minute ('curl {serving.url}/health' says when it is ready)"
        )
    return ready


def _where_flag(flags: dict[str, Any], settings: Path | None) -> str:
    try:
        backend = session.resolve_config(flags, settings=settings).config.backend
    except BertKnnError:
        return "--index"
    return "--index" if backend == "embedded" else f"--index-prefix on {backend}"


def _answer_here(
    asked: list[Any], flags: dict[str, Any], settings: Path | None, no_progress: bool, as_json: bool
) -> None:
    """Open the index, load the model, answer and print."""
    from bertknn_search.cli.encode_bar import EncodeBar
    from bertknn_search.output import render_answer, render_batch_coverage, to_json
    from bertknn_search.query.search import Searcher
    from bertknn_search.records import Coverage, EncodeHooks

    config = session.open_index(flags, settings=settings).config
    searcher = Searcher.open(config)
    bar = EncodeBar(enabled=not no_progress)
    searcher.hooks = EncodeHooks(progress=bar)
    coverages: list[dict[str, Coverage]] = []
    try:
        size = config.batch_for(searcher.encoder.placement.device.type)
        for lo in range(0, len(asked), size):
            for answer in searcher.answer_batch(asked[lo : lo + size]):
                click.echo(to_json(answer) if as_json else render_answer(answer, config.top) + "\n")
                coverages.append(answer.coverage)
    finally:
        bar.close()
        searcher.close()
    # Each answer says whether it is partial; over a file, how many were (and how starved) is one line
    # (JSON answers carry "partial" and "coverage" for a program to count; its stdout stays JSON lines).
    summary = render_batch_coverage(coverages) if len(coverages) > 1 and not as_json else ""
    if summary:
        click.echo(summary, err=True)


def _leave(ctx: click.Context) -> None:
    """End a finished read-only command now, skipping the interpreter's teardown (about a second once
    torch and transformers are loaded: their modules, threads and atexit hooks), when this is the
    program itself (not a test's CliRunner). The index is closed and the output flushed first, so
    nothing is lost; a write that fails (a closed pipe) ends as it would have."""
    if not getattr(ctx.find_root().command, "process", False):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return  # let the normal exit report it
    os._exit(0)


@click.command()
@click.option(
    "--file",
    "qfile",
    type=click.File("r", encoding="utf-8"),
    help="Questions as for 'query --file' ('-' for stdin): their IR step's articles are encoded.",
)
@click.option(
    "--titles",
    multiple=True,
    metavar="TITLE|FILE",
    help="An article title to encode (repeatable), or a file of titles one per line: a path, @path, or '-'"
    " for stdin.",
)
@cache_option
@no_progress_option
@json_option
@model_options(new_index=False)
@index_options
def warm(qfile: Any, titles: Any, no_progress: bool, as_json: bool, **flags: Any) -> None:
    """Encode ahead of time the contexts that questions or titles will need (a lazy index).

    A lazy index encodes an article the first time a query needs it; warming does that for a whole
    question file in large batches, so the questions then run warm. 'eval warm' does it for a dataset.

    Example: bertknn-search warm --file questions.txt --device cuda

    Example: bertknn-search warm --titles "Albert Einstein" --titles "Aa River" (or --titles titles.txt)
    """
    from bertknn_search.output import render_warm, to_json
    from bertknn_search.query.search import Searcher
    from bertknn_search.records import Question
    from bertknn_search.warm import needed_articles
    from bertknn_search.warm import warm as run_warm

    asked = list(_read_questions(qfile))
    names = [name for given in titles for name in _titles(given)]
    if not asked and not names:
        raise click.UsageError("give --file with questions or --titles with article titles")
    config = session.open_index(flags).config
    searcher = Searcher.open(config)
    try:
        asked += [Question("[MASK]", name) for name in names]  # a subject alone: its own article(s)
        summary = run_warm(searcher, needed_articles(searcher, asked), progress=not (no_progress or as_json))
    finally:
        searcher.close()
    click.echo(to_json(summary) if as_json else render_warm(summary))


def _titles(given: str) -> list[str]:
    """``--titles`` as one title, or the lines of a file ('-', @path, or a path that exists).

    A user types a title where the option's name says titles; a file of them is what a script has.
    """
    if given == "-":
        return _lines(click.get_text_stream("stdin"), "stdin")
    path = Path(given[1:] if given.startswith("@") else given)
    if given.startswith("@") or path.is_file():
        try:
            with path.open(encoding="utf-8") as stream:
                return _lines(stream, str(path))
        except OSError as exc:
            raise click.BadParameter(
                f"cannot read {path}: {exc.strerror or exc}", param_hint="--titles"
            ) from exc
    return [given.strip()] if given.strip() else []


def _lines(stream: Any, name: str) -> list[str]:
    try:
        return [line.strip() for line in stream.read().splitlines() if line.strip()]
    except UnicodeDecodeError as exc:
        raise InputFormatError(f"{name} is not UTF-8 ({exc.reason})") from exc


def _read_questions(stream: Any) -> Iterator[Any]:
    from bertknn_search.records import Question

    if stream is None:
        return
    try:
        for line in stream:
            if not line.strip():
                continue
            text, _, subject = line.rstrip("\n").partition("\t")
            yield Question(text.strip(), subject.strip() or None)
    except UnicodeDecodeError as exc:
        # No line number: text is decoded in blocks, so the count would point before the bad line.
        raise InputFormatError(
            f"{getattr(stream, 'name', 'input')} is not UTF-8 ({exc.reason}); save the questions as UTF-8"
        ) from exc
