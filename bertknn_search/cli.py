"""The ``bertknn-search`` command line: each command parses, builds a Config, calls one function, renders."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from bertknn_search import session
from bertknn_search.cli_engine import engine_group
from bertknn_search.cli_eval import eval_group
from bertknn_search.cli_options import (
    FiniteFloat,
    cache_option,
    encoding_options,
    evidence_for_option,
    index_options,
    ingest_options,
    json_option,
    method_options,
    model_options,
    no_progress_option,
)
from bertknn_search.errors import BertKnnError, InputFormatError, Terminated
from bertknn_search.output import counted
from bertknn_search.textcheck import check_question

RESUME_HINT = "nothing half-written is kept: run the same command again to resume"


def interrupted_line(exc: KeyboardInterrupt) -> str:
    """What Ctrl-C or SIGTERM left: what was kept, and how to go on."""
    how = "terminated" if _terminated(exc) else "interrupted"
    kept = getattr(exc, "kept", None)
    if kept is None:
        return f"{how}; {RESUME_HINT}"
    what = f"kept {counted(kept, 'article')} already written" if kept else "nothing was written yet"
    return f"{how}; {what}; {RESUME_HINT}"


def _terminated(exc: KeyboardInterrupt) -> bool:
    """Whether a stop came from SIGTERM (``Terminated``, or an interrupt that a run re-raised marked so)."""
    return isinstance(exc, Terminated) or bool(getattr(exc, "terminated", False))


class Group(click.Group):
    """Turns library errors into one-line messages (exit 1), Ctrl-C and SIGTERM into what was kept and
    how to resume (exit 130 and 143)."""

    process = False  # whether main() runs as the program itself, not in a test's CliRunner (see _leave)

    def main(self, args: Any = None, *rest: Any, **extra: Any) -> Any:
        # The console script calls main() with no arguments; CliRunner always passes a list.
        self.process = args is None
        return super().main(args, *rest, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        previous = _terminate_as_interrupt()
        try:
            return super().invoke(ctx)
        except BertKnnError as exc:
            raise click.ClickException(str(exc)) from exc
        except KeyboardInterrupt as exc:
            click.echo(f"\n{interrupted_line(exc)}", err=True)
            sys.exit(143 if _terminated(exc) else 130)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


def _terminate_as_interrupt() -> Any:
    """SIGTERM raises ``Terminated`` in the main thread: a run stops as on Ctrl-C, its worker processes
    and files closed, instead of dying with semaphores left behind. Returns the handler it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminate(signum: int, frame: Any) -> None:
        raise Terminated

    return signal.signal(signal.SIGTERM, terminate)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bertknn-search")
def main() -> None:
    """Answer cloze questions with BERT-kNN: BERT interpolated with a kNN over Wikipedia contexts.

    Example: bertknn-search query "Albert Einstein received the Nobel Prize in [MASK]."
    """


# The eval commands live in their own module, which knows nothing of this one.
main.add_command(eval_group)
main.add_command(engine_group)


@main.group()
def ingest() -> None:
    """Build an index from a corpus.

    Example: bertknn-search ingest wiki enwiki-latest-pages-articles1.xml-p1p41242.bz2 --limit 1000
    """


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
    if said and not as_json:
        click.echo(said, err=True)
    config = resolved.config
    # JSON output is for scripts: no bar on stderr to mix into their logs (as for add).
    progress = not (no_progress or as_json)
    summary = run_ingest(source, config, limit=limit, fmt=fmt, progress=progress, workers=workers)
    _print_summary(summary, as_json, "ingested")


@main.command()
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

    config = session.open_index(flags).config
    # JSON output is for scripts: no bar on stderr to mix into their logs.
    summary = add_articles(source, config, limit=limit, fmt=fmt, progress=not (no_progress or as_json))
    _print_summary(summary, as_json, "added")


def _print_summary(summary: Any, as_json: bool, verb: str) -> None:
    from bertknn_search.output import render_summary, to_json

    click.echo(to_json(summary) if as_json else render_summary(summary, verb))


@main.command()
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
                    "--server auto: no server is serving this --index; start one with"
                    " 'bertknn-search serve', or name its URL"
                )
            server = serving.url
            flags = {k: v for k, v in flags.items() if k not in ("index", "backend")}  # they found it
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


def _serving(flags: dict[str, Any], settings: Path | None) -> Any:
    """The live server that announced itself for the embedded index of ``flags`` (cheap: a small file
    read, no import beyond the standard library), else None."""
    from bertknn_search.server import discovery

    try:
        config = session.resolve_config(flags, settings=settings).config
    except BertKnnError:
        return None  # the settings are wrong: the query itself says how, in one line
    return discovery.find(config.index) if config.backend == "embedded" else None


def _answer_here(
    asked: list[Any], flags: dict[str, Any], settings: Path | None, no_progress: bool, as_json: bool
) -> None:
    """Open the index, load the model, answer and print."""
    from bertknn_search.encode_bar import EncodeBar
    from bertknn_search.output import render_answer, to_json
    from bertknn_search.records import EncodeHooks
    from bertknn_search.query.search import Searcher

    config = session.open_index(flags, settings=settings).config
    searcher = Searcher.open(config)
    bar = EncodeBar(enabled=not no_progress)
    searcher.hooks = EncodeHooks(progress=bar)
    try:
        size = config.batch_for(searcher.encoder.placement.device.type)
        for lo in range(0, len(asked), size):
            for answer in searcher.answer_batch(asked[lo : lo + size]):
                click.echo(to_json(answer) if as_json else render_answer(answer, config.top) + "\n")
    finally:
        bar.close()
        searcher.close()


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


@main.command()
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
    from bertknn_search.records import Question
    from bertknn_search.query.search import Searcher
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


@main.command()
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

    listed = session.list_titles(session.resolve_config(flags).config, pattern, limit)
    if as_json:
        for title in listed:
            click.echo(to_json(title))
    else:
        click.echo(render_titles(listed, pattern))


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0: every one).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="0: any free.")
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Writes (POST/DELETE /articles) need 'Authorization: Bearer <first line of this file>'.",
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
    from bertknn_search.server.wire import read_token

    token = read_token(token_file) if token_file else None
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


@main.command()
@json_option
@index_options
def stats(as_json: bool, **flags: Any) -> None:
    """Show what the index holds: articles, contexts, model, layer, bytes on disk.

    Example: bertknn-search stats --index ./bertknn-index
    """
    from bertknn_search.output import render_stats, to_json

    result = session.index_stats(session.resolve_config(flags).config)
    click.echo(to_json(result) if as_json else render_stats(result))


@main.command()
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
