"""The ``bertknn-search`` command line: each command parses, builds a Config, calls one function, renders."""

from __future__ import annotations

import functools
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from bertknn_search.config import BACKENDS, DISTANCES, MASK_POLICIES, STORE_DTYPES, Config
from bertknn_search.errors import BertKnnError, IndexMismatchError, IndexNotFoundError, InputFormatError

F = TypeVar("F", bound=Callable[..., Any])

RESUME_HINT = "interrupted; nothing half-written is kept: run the same command again to resume"


class Group(click.Group):
    """Turns library errors into one-line messages (exit 1) and Ctrl-C into a resume hint (exit 130)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BertKnnError as exc:
            raise click.ClickException(str(exc)) from exc
        except KeyboardInterrupt:
            click.echo(f"\n{RESUME_HINT}", err=True)
            sys.exit(130)


def index_options(f: F) -> F:
    """Where the index is: shared by every command that opens one."""
    options = [
        click.option(
            "--index",
            type=click.Path(path_type=Path),
            help="Embedded index directory [env BERTKNN_INDEX; default ./bertknn-index].",
        ),
        click.option(
            "--backend",
            type=click.Choice(BACKENDS),
            help="Storage backend [env BERTKNN_BACKEND; default embedded].",
        ),
        click.option(
            "--opensearch-url",
            help="OpenSearch URL [env OPENSEARCH_URL]; credentials from OPENSEARCH_USER/OPENSEARCH_PASSWORD.",
        ),
        click.option(
            "--opensearch-ca",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help="CA bundle for TLS [env OPENSEARCH_CA].",
        ),
        click.option("--insecure", is_flag=True, help="Do not verify the OpenSearch TLS certificate."),
        click.option("--opensearch-prefix", help="Index name prefix in OpenSearch [default bertknn]."),
    ]
    return functools.reduce(lambda g, opt: opt(g), reversed(options), f)


def model_options(f: F) -> F:
    """Which encoder: for a new index these are used, for an existing one they must match it."""
    options = [
        click.option(
            "--model",
            help="HF checkpoint name or local path [default: the index's; bert-base-uncased for a new one].",
        ),
        click.option(
            "--layer", type=click.IntRange(min=1), help="Hidden layer whose state is the key [default 11]."
        ),
        click.option("--device", help="cpu, cuda, cuda:N or auto [default auto: a GPU when there is one]."),
        click.option(
            "--batch-size",
            type=click.IntRange(min=1),
            help="Masked sentences per forward pass [default 128 on a CPU, 1024 on a GPU].",
        ),
    ]
    return functools.reduce(lambda g, opt: opt(g), reversed(options), f)


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON (one object per line).")


def method_options(f: F) -> F:
    """The paper's settings a query may change (the index fixes model and layer)."""
    options = [
        click.option("--top", type=click.IntRange(min=1, max=1000), help="Answers per ranking [default 10]."),
        click.option("-k", "k", type=click.IntRange(min=1, max=100_000), help="Neighbours [default 128]."),
        click.option(
            "--n-articles", type=click.IntRange(min=1, max=1000), help="Articles searched [default 3]."
        ),
        click.option("--lambda", "lam", type=click.FloatRange(0.0, 1.0), help="Weight of kNN [default 0.3]."),
        click.option(
            "--temperature", type=click.FloatRange(min=0.0, min_open=True), help="The paper's l [default 6]."
        ),
        click.option("--distance", type=click.Choice(DISTANCES), help="d in exp(-d/l) [default squared-l2]."),
    ]
    return functools.reduce(lambda g, opt: opt(g), reversed(options), f)


def make_config(model: str | None = None, insecure: bool = False, **flags: Any) -> Config:
    """The one place flags and environment variables become a Config (flags win)."""
    if model is not None and Path(model).exists():
        model = str(Path(model).resolve())  # the index records it; later commands may run elsewhere
    verify = False if insecure else None
    return Config.from_env(model=model, opensearch_verify=verify, **flags)


def with_settings(config: Config, settings: Path | None, flags: Mapping[str, Any]) -> Config:
    """Apply a tuned settings file, then the method flags given on the command line again (flags win)."""
    if settings is None:
        return config
    given = {k: v for k, v in flags.items() if v is not None and k in config.method_settings()}
    return config.with_settings_file(settings).replace(**given)


# What an index fixes once it is built; later commands take these from it.
ADOPTED = ("model", "layer", "mask_policy", "store_dtype", "max_length")


def adopt_index(config: Config, flags: Mapping[str, Any], must_exist: bool = True) -> Config:
    """Take the encoding settings from the index ``config`` names; flags that were given must agree.

    Args:
        config: settings from flags and environment.
        flags: the command's flags (None where not given).
        must_exist: False for ``ingest wiki``, which may be creating the index.
    """
    from bertknn_search.backends import open_backend

    try:
        backend = open_backend(config)
    except IndexNotFoundError:
        if must_exist:
            raise
        return config
    try:
        meta, where = backend.meta(), backend.location
    finally:
        backend.close()
    if flags.get("max_length") is not None and config.max_length > meta.max_length:
        from bertknn_search.encoder import Encoder

        # The index records the limit in effect, capped at the model's: a larger request means the same.
        capped = Encoder(meta.model, meta.layer, "cpu", config.max_length).max_length
        config = config.replace(max_length=capped)
    for name in ADOPTED:
        if flags.get(name) is not None and getattr(config, name) != getattr(meta, name):
            flag = "--" + name.replace("_", "-")
            raise IndexMismatchError(
                f"index at {where} was built with {name}={getattr(meta, name)!r}, not"
                f" {getattr(config, name)!r}; drop {flag} or use another --index"
            )
    return config.replace(**{name: getattr(meta, name) for name in ADOPTED})


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bertknn-search")
def main() -> None:
    """Answer cloze questions with BERT-kNN: BERT interpolated with a kNN over Wikipedia contexts.

    Example: bertknn-search query "Albert Einstein was born in [MASK]."
    """


@main.group()
def ingest() -> None:
    """Build an index from a corpus."""


def _ingest_options(f: F) -> F:
    options = [
        click.argument("source", type=click.Path(exists=True, path_type=Path)),
        click.option(
            "--format",
            "fmt",
            type=click.Choice(["xml", "jsonl", "parquet", "wikiextractor"]),
            help="Input format [default: detected].",
        ),
        click.option("--limit", type=click.IntRange(min=1), help="Stop after this many articles."),
        click.option("--no-progress", is_flag=True, help="No progress bar."),
        json_option,
    ]
    return functools.reduce(lambda g, opt: opt(g), reversed(options), f)


@ingest.command("wiki")
@_ingest_options
@model_options
@click.option(
    "--mask-policy",
    type=click.Choice(MASK_POLICIES),
    help="Which words get a context [default single-wordpiece].",
)
@click.option(
    "--store-dtype",
    type=click.Choice(STORE_DTYPES),
    help="Context vectors on disk: float16, or int8 (per-vector scale, half the bytes) [default float16].",
)
@click.option(
    "--max-length",
    type=click.IntRange(min=8),
    help="Model input limit; longer sentences are windowed [default 512].",
)
@index_options
def ingest_wiki(
    source: Path, fmt: str | None, limit: int | None, no_progress: bool, as_json: bool, **flags: Any
) -> None:
    """Ingest a Wikipedia dump (XML .bz2, JSONL, parquet or WikiExtractor output) into an index.

    Interrupted or crashed runs resume: run the same command again.

    Example: bertknn-search ingest wiki enwiki-latest-pages-articles1.xml.bz2 --limit 1000
    """
    from bertknn_search.ingest.pipeline import ingest as run_ingest

    config = adopt_index(make_config(**flags), flags, must_exist=False)
    summary = run_ingest(source, config, limit=limit, fmt=fmt, progress=not no_progress)
    _print_summary(summary, as_json, "ingested")


@main.command()
@_ingest_options
@model_options
@index_options
def add(
    source: Path, fmt: str | None, limit: int | None, no_progress: bool, as_json: bool, **flags: Any
) -> None:
    """Add or replace articles in an existing index while it serves; answerable when this returns.

    Example: bertknn-search add new-articles.jsonl
    """
    from bertknn_search.ingest.pipeline import add_articles

    config = make_config(**flags)
    config = adopt_index(config, flags)
    summary = add_articles(source, config, limit=limit, fmt=fmt, progress=not no_progress)
    _print_summary(summary, as_json, "added")


def _print_summary(summary: Any, as_json: bool, verb: str) -> None:
    from bertknn_search.output import to_json

    if as_json:
        click.echo(to_json(summary))
        return
    click.echo(
        f"{verb} {summary.articles:,} articles ({summary.already_stored:,} already stored,"
        f" {summary.empty:,} empty skipped): {summary.sentences:,} sentences,"
        f" {summary.contexts:,} contexts in {summary.seconds:.1f} s"
        f" ({summary.contexts_per_second:,.0f} contexts/s) into {summary.location}"
    )


@main.command()
@click.argument("questions", nargs=-1)
@click.option(
    "--file",
    "qfile",
    type=click.File("r", encoding="utf-8"),
    help="Questions, one per line ('-' for stdin); a tab may separate a subject.",
)
@click.option("--subject", help="The fact's subject: its own article is searched when a title matches.")
@method_options
@click.option(
    "--no-ir", is_flag=True, help="Search every context instead of the top articles' (the paper's ablation)."
)
@click.option(
    "--settings",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Tuned settings JSON (from 'eval grid').",
)
@json_option
@model_options
@index_options
def query(
    questions: tuple[str, ...],
    qfile: Any,
    subject: str | None,
    no_ir: bool,
    settings: Path | None,
    as_json: bool,
    **flags: Any,
) -> None:
    """Answer cloze questions: BERT-kNN, BERT and kNN rankings, the articles used and the evidence.

    Example: bertknn-search query "Albert Einstein was born in [MASK]." --subject "Albert Einstein"
    """
    from bertknn_search.output import render_answer, to_json
    from bertknn_search.records import Question
    from bertknn_search.search import Searcher

    asked = [Question(q, subject) for q in questions] + list(_read_questions(qfile))
    if not asked:
        raise click.UsageError("give a question, or --file with one question per line")
    flags["use_ir"] = False if no_ir else None  # a method flag like the others: it wins over --settings
    config = with_settings(make_config(**flags), settings, flags)
    config = adopt_index(config, flags)
    searcher = Searcher.open(config)
    try:
        size = config.batch_for(searcher.encoder.placement.device.type)
        for lo in range(0, len(asked), size):
            for answer in searcher.answer_batch(asked[lo : lo + size]):
                click.echo(to_json(answer) if as_json else render_answer(answer, config.top) + "\n")
    finally:
        searcher.close()


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
@json_option
@index_options
def stats(as_json: bool, **flags: Any) -> None:
    """Show what the index holds: articles, contexts, model, layer, bytes on disk.

    Example: bertknn-search stats --index ./bertknn-index
    """
    from bertknn_search.backends import open_backend
    from bertknn_search.output import render_stats, to_json

    backend = open_backend(make_config(**flags))
    try:
        result = backend.stats()
    finally:
        backend.close()
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
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def demo(out: Path, no_progress: bool) -> None:
    """Build a tiny model and a corpus of invented facts, ingest it and answer questions about it.

    Runs offline in seconds. BERT cannot know the invented facts; kNN over the ingested contexts can.

    Example: bertknn-search demo --dir ./demo
    """
    from bertknn_search.demo import prepare_demo
    from bertknn_search.ingest.pipeline import ingest as run_ingest
    from bertknn_search.output import render_answer
    from bertknn_search.records import Question
    from bertknn_search.search import Searcher

    files = prepare_demo(out)
    index = out / "index"
    if (index / "index.sqlite").exists():
        # The demo owns this index and builds it in a second: start clean, so an index left by an older
        # version (another schema) never stops the demo.
        shutil.rmtree(index)
    # The tiny random model's distances are ~100x smaller than BERT-base's; l=1 plays the role l=6
    # plays there (the nearest context dominates). A real model uses the paper's l=6.
    config = make_config(model=str(files.model), index=index, device="cpu", max_length=64, temperature=1.0)
    summary = run_ingest(files.corpus, config, progress=not no_progress)
    _print_summary(summary, False, "ingested")
    searcher = Searcher.open(config)
    try:
        for answer in searcher.answer_batch([Question(q, s) for q, s in files.questions]):
            click.echo("\n" + render_answer(answer, 5))
    finally:
        searcher.close()
    click.echo(
        f"\nTry: bertknn-search query --index {config.index} --temperature 1"
        ' "Mirvane was born in [MASK]." --subject Mirvane'
    )


def _register_subcommands() -> None:
    # The eval commands live in their own module; importing it attaches them to ``main``.
    import bertknn_search.cli_eval  # noqa: F401


_register_subcommands()
