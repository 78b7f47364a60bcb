"""The ``eval`` commands: P@k tables on LAMA, LAMA-UHN, PopQA or plain JSONL, and the grid search.

``eval_group`` is a stand-alone click group; ``cli.py`` adds it to the main command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from bertknn_search import session
from bertknn_search.cli_options import (
    cache_option,
    index_options,
    json_option,
    method_options,
    model_options,
    no_progress_option,
    stacked,
)
from bertknn_search.errors import ConfigError
from bertknn_search.eval.metrics import KS

DATASET_FLAGS = ("lama", "corpora", "lama_uhn", "relations", "popqa", "split", "questions", "per_relation")

_path = click.Path(exists=True, path_type=Path)
dataset_options = stacked(
    click.option("--lama", type=_path, help="LAMA data folder (relations.jsonl, TREx/, Google_RE/, ...)."),
    click.option("--corpora", help="Comma-separated LAMA corpora [default: all present]."),
    click.option("--lama-uhn", type=_path, help="LAMA-UHN folder (TREx_UHN/); templates from --relations."),
    click.option("--relations", type=_path, help="relations.jsonl for --lama-uhn [default: --lama's]."),
    click.option("--popqa", type=_path, help="PopQA TSV (or the derived dev/test JSON)."),
    click.option("--split", default="test", show_default=True, help="Split of a derived PopQA JSON."),
    click.option("--questions", type=_path, help="JSONL of {question, answers, subject?, relation?}."),
    click.option(
        "--per-relation", type=click.IntRange(min=1), help="Use only the first N facts of each relation."
    ),
    click.option("--common-vocab", type=_path, help="LAMA common vocabulary: restricts answers and outputs."),
)


def _facts(flags: dict[str, Any]) -> list[Any]:
    """Read the datasets the flags name, taking their flags out of ``flags``."""
    from bertknn_search.eval.datasets import read_facts

    data = {name: flags.pop(name) for name in DATASET_FLAGS}
    if not any(data[name] for name in ("lama", "lama_uhn", "popqa", "questions")):
        raise click.UsageError("name a dataset: --lama, --lama-uhn, --popqa or --questions")
    corpora = data.pop("corpora")
    return read_facts(corpora=corpora.split(",") if corpora else None, **data)


@click.group("eval")
def eval_group() -> None:
    """Measure answer quality as the paper does (P@1/5/10, macro over relations).

    Example: bertknn-search eval run --lama data/lama --out eval-out
    """


@eval_group.command("run")
@dataset_options
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("eval-out"),
    show_default=True,
    help="Report folder; a re-run resumes from it.",
)
@click.option("--no-resume", is_flag=True, help="Start over instead of continuing an interrupted run.")
@click.option(
    "--no-article",
    type=click.Choice(["skip", "wrong"]),
    default="skip",
    show_default=True,
    help="Facts whose IR step finds no article: leave them out, or score them wrong (the reference's way).",
)
@no_progress_option
@json_option
@method_options
@cache_option
@model_options(new_index=False)
@index_options
def eval_run(
    out: Path,
    no_resume: bool,
    no_article: str,
    settings: Path | None,
    no_progress: bool,
    as_json: bool,
    common_vocab: Path | None,
    **flags: Any,
) -> None:
    """Evaluate BERT, kNN and BERT-kNN; write results.md, results.json and results.png to --out.

    Example: bertknn-search eval run --lama data/lama --corpora T-REx,SQuAD --out eval-out
    """
    from bertknn_search.eval.datasets import read_common_vocab
    from bertknn_search.eval.harness import evaluate
    from bertknn_search.output import render_datastore, render_eval_counts
    from bertknn_search.search import Searcher

    facts = _facts(flags)
    config = session.open_index(flags, settings=settings).config
    vocab = read_common_vocab(common_vocab) if common_vocab else None
    searcher = Searcher.open(config)
    try:
        result = evaluate(
            searcher,
            facts,
            config,
            out,
            common_vocab=vocab,
            resume=not no_resume,
            no_article_wrong=no_article == "wrong",
            progress=not no_progress,
        )
    finally:
        searcher.close()
    if as_json:
        click.echo(result.report["json"].read_text(encoding="utf-8"))
    else:
        click.echo(result.report["markdown"].read_text(encoding="utf-8"))
        cost = render_datastore(result.datastore)
        if cost is not None:
            click.echo(cost)
        click.echo(render_eval_counts(result.facts, result.scored, result.skipped, result.resumed, out))
    if result.scored == 0:
        click.echo(
            "warning: no fact was scored, so every P@k is '–'; see the skipped reasons"
            " (no-article: no article found; answer-not-one-token: not one token of the model's vocabulary)",
            err=True,
        )


@eval_group.command("compare")
@click.argument(
    "runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path)
)
@click.option("-k", "k", type=click.Choice(KS), default=KS[0], show_default=True, help="Which P@k to show.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Also write the table here.")
def eval_compare(runs: tuple[Path, ...], k: int, out: Path | None) -> None:
    """Put several 'eval run' reports in one table: the layer (10/11/12) and no-IR ablations.

    Build one index per layer ('ingest wiki --layer 10 --index idx-l10'), run 'eval run' on each (and once
    with --no-ir), then compare the report folders.

    Example: bertknn-search eval compare eval-l10 eval-l11 eval-l12 eval-noir --out ablation.md
    """
    from bertknn_search.eval.report import compare_runs

    names = [run.name for run in runs]
    if len(set(names)) < len(names):  # a/run and b/run: the folder names alone would merge rows
        names = [str(run) for run in runs]
    results = {}
    for name, run in zip(names, runs):
        path = run / "results.json"
        try:
            results[name] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path} cannot be read ({exc}); is {run} an 'eval run' --out folder?") from exc
    try:
        table = compare_runs(results, k)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"the reports cannot be compared: {exc}") from exc
    if out is not None:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(table, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot write {out}: {exc}") from exc
    click.echo(table)


class NumberList(click.ParamType):
    """Comma-separated numbers of one kind, e.g. ``1,2,3``."""

    def __init__(self, kind: type) -> None:
        self.kind = kind
        self.name = f"{kind.__name__},..."

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, list):
            return value
        try:
            return [self.kind(v) for v in str(value).split(",") if v.strip()]
        except ValueError:
            self.fail(f"expected comma-separated {self.kind.__name__}s, got {value!r}", param, ctx)


@eval_group.command("grid")
@dataset_options
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("settings.json"),
    show_default=True,
    help="Where the best setting is written.",
)
@click.option(
    "--grid-n", type=NumberList(int), default="1,2,3,4,5", show_default=True, help="Values of N (articles)."
)
@click.option(
    "--grid-lambda",
    type=NumberList(float),
    default="0.2,0.3,0.4,0.5,0.6,0.7,0.8",
    show_default=True,
    help="Values of λ.",
)
@click.option("--grid-k", type=NumberList(int), default="64,128,512", show_default=True, help="Values of k.")
@click.option(
    "--grid-temperature",
    type=NumberList(float),
    default="0.5,1,2,3,4,5,6,7,8,9,10,11,12",
    show_default=True,
    help="Values of l: small ones suit small models (the demo's needs 1), 5-12 BERT-base.",
)
@cache_option
@no_progress_option
@json_option
@model_options(new_index=False)
@index_options
def eval_grid(
    out: Path,
    grid_n: list[int],
    grid_lambda: list[float],
    grid_k: list[int],
    grid_temperature: list[float],
    no_progress: bool,
    as_json: bool,
    common_vocab: Path | None,
    **flags: Any,
) -> None:
    """Grid-search N, λ, k and l on a dev set for BERT-kNN P@1; write the best as a settings file.

    The paper tuned on SQuAD + 305 ConceptNet facts. Use the file with 'query --settings'. When several
    settings tie, the first in grid order wins (the values listed first in each --grid-* list).

    Example: bertknn-search eval grid --lama data/lama --corpora SQuAD --out settings.json
    """
    from bertknn_search.eval.datasets import read_common_vocab
    from bertknn_search.eval.grid import grid_search
    from bertknn_search.output import render_grid
    from bertknn_search.search import Searcher

    facts = _facts(flags)
    grid = {"n_articles": grid_n, "lam": grid_lambda, "k": grid_k, "temperature": grid_temperature}
    config = session.open_index(flags).config
    vocab = read_common_vocab(common_vocab) if common_vocab else None
    searcher = Searcher.open(config)
    try:
        result = grid_search(
            searcher, facts, grid, out, config=config, common_vocab=vocab, progress=not no_progress
        )
    finally:
        searcher.close()
    click.echo(json.dumps(result) if as_json else render_grid(result, out))


@eval_group.command("warm")
@dataset_options
@cache_option
@no_progress_option
@json_option
@model_options(new_index=False)
@index_options
def eval_warm(no_progress: bool, as_json: bool, common_vocab: Path | None, **flags: Any) -> None:
    """Encode the articles a dataset's facts will search (a lazy index), in large batches.

    Run before 'eval run' on a lazy index, on the GPU machine; the run itself then only reads.

    Example: bertknn-search eval warm --lama data/lama --corpora T-REx --device cuda
    """
    from bertknn_search.output import render_warm, to_json
    from bertknn_search.records import Question
    from bertknn_search.search import Searcher
    from bertknn_search.warm import needed_articles, warm

    facts = _facts(flags)
    config = session.open_index(flags).config
    searcher = Searcher.open(config)
    try:
        ids = needed_articles(searcher, [Question(f.question, f.subject) for f in facts])
        summary = warm(searcher, ids, progress=not (no_progress or as_json))
    finally:
        searcher.close()
    click.echo(to_json(summary) if as_json else render_warm(summary))
