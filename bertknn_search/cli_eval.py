"""The ``eval`` commands: P@k tables on LAMA, LAMA-UHN, PopQA or plain JSONL, and the grid search."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from bertknn_search.cli import (
    adopt_index,
    index_options,
    json_option,
    main,
    make_config,
    method_options,
    model_options,
    with_settings,
)
from bertknn_search.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


def dataset_options(f: F) -> F:
    """Which facts to evaluate on: any mix of the supported layouts."""
    path = click.Path(exists=True, path_type=Path)
    options = [
        click.option("--lama", type=path, help="LAMA data folder (relations.jsonl, TREx/, Google_RE/, ...)."),
        click.option("--corpora", help="Comma-separated LAMA corpora [default: all present]."),
        click.option(
            "--lama-uhn", type=path, help="LAMA-UHN folder (TREx_UHN/); templates from --relations."
        ),
        click.option("--relations", type=path, help="relations.jsonl for --lama-uhn [default: --lama's]."),
        click.option("--popqa", type=path, help="PopQA TSV (or the derived dev/test JSON)."),
        click.option("--split", default="test", show_default=True, help="Split of a derived PopQA JSON."),
        click.option("--questions", type=path, help="JSONL of {question, answers, subject?, relation?}."),
        click.option(
            "--per-relation", type=click.IntRange(min=1), help="Use only the first N facts of each relation."
        ),
        click.option(
            "--common-vocab", type=path, help="LAMA common vocabulary: restricts answers and outputs."
        ),
    ]
    return functools.reduce(lambda g, opt: opt(g), reversed(options), f)


def load_facts(
    lama: Path | None,
    corpora: str | None,
    lama_uhn: Path | None,
    relations: Path | None,
    popqa: Path | None,
    split: str,
    questions: Path | None,
    per_relation: int | None,
) -> list[Any]:
    from bertknn_search.eval import datasets

    facts: list[Any] = []
    if lama is not None:
        facts += datasets.read_lama(lama, corpora.split(",") if corpora else None)
    if lama_uhn is not None:
        templates = relations or (lama / "relations.jsonl" if lama else None)
        if templates is None:
            raise ConfigError("--lama-uhn needs --relations (or --lama) for the cloze templates")
        facts += datasets.read_lama_uhn(lama_uhn, templates)
    if popqa is not None:
        facts += datasets.read_popqa(popqa, split)
    if questions is not None:
        facts += datasets.read_questions_jsonl(questions)
    if not facts:
        raise click.UsageError("name a dataset: --lama, --lama-uhn, --popqa or --questions")
    if per_relation:
        seen: dict[tuple[str, str], int] = {}
        kept = []
        for fact in facts:
            key = (fact.corpus, fact.relation)
            seen[key] = seen.get(key, 0) + 1
            if seen[key] <= per_relation:
                kept.append(fact)
        facts = kept
    return facts


@main.group("eval")
def eval_group() -> None:
    """Measure answer quality as the paper does (P@1/5/10, macro over relations)."""


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
    "--no-article-wrong",
    is_flag=True,
    help="Count facts without a retrieved article as wrong (the reference's choice).",
)
@click.option("--no-ir", is_flag=True, help="kNN over every context (the paper's no-IR ablation).")
@click.option(
    "--settings",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Tuned settings JSON (from 'eval grid').",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@json_option
@method_options
@model_options
@index_options
def eval_run(
    out: Path,
    no_resume: bool,
    no_article_wrong: bool,
    no_ir: bool,
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
    from bertknn_search.search import Searcher

    data = {
        k: flags.pop(k)
        for k in ("lama", "corpora", "lama_uhn", "relations", "popqa", "split", "questions", "per_relation")
    }
    facts = load_facts(**data)
    flags["use_ir"] = False if no_ir else None  # a method flag like the others: it wins over --settings
    config = with_settings(make_config(**flags), settings, flags)
    config = adopt_index(config, flags)
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
            no_article_wrong=no_article_wrong,
            progress=not no_progress,
        )
    finally:
        searcher.close()
    if as_json:
        click.echo(result.report["json"].read_text(encoding="utf-8"))
    else:
        click.echo(result.report["markdown"].read_text(encoding="utf-8"))
        click.echo(f"{result.facts:,} facts ({result.computed:,} computed now); report in {out}")


@eval_group.command("compare")
@click.argument(
    "runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path)
)
@click.option("-k", "k", type=click.IntRange(min=1), default=1, show_default=True, help="Which P@k to show.")
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


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"expected comma-separated numbers, got {text!r}") from exc


@eval_group.command("grid")
@dataset_options
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("settings.json"),
    show_default=True,
    help="Where the best setting is written.",
)
@click.option("--grid-n", default="1,2,3,4,5", show_default=True, help="Values of N (articles).")
@click.option("--grid-lambda", default="0.2,0.3,0.4,0.5,0.6,0.7,0.8", show_default=True, help="Values of λ.")
@click.option("--grid-k", default="64,128,512", show_default=True, help="Values of k.")
@click.option("--grid-temperature", default="5,6,7,8,9,10,11,12", show_default=True, help="Values of l.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@json_option
@model_options
@index_options
def eval_grid(
    out: Path,
    grid_n: str,
    grid_lambda: str,
    grid_k: str,
    grid_temperature: str,
    no_progress: bool,
    as_json: bool,
    common_vocab: Path | None,
    **flags: Any,
) -> None:
    """Grid-search N, λ, k and l on a dev set for BERT-kNN P@1; write the best as a settings file.

    The paper tuned on SQuAD + 305 ConceptNet facts. Use the file with 'query --settings'.

    Example: bertknn-search eval grid --lama data/lama --corpora SQuAD --out settings.json
    """
    import json

    from bertknn_search.eval.datasets import read_common_vocab
    from bertknn_search.eval.grid import grid_search
    from bertknn_search.search import Searcher

    data = {
        k: flags.pop(k)
        for k in ("lama", "corpora", "lama_uhn", "relations", "popqa", "split", "questions", "per_relation")
    }
    facts = load_facts(**data)
    grid = {
        "n_articles": [int(v) for v in _floats(grid_n)],
        "lam": _floats(grid_lambda),
        "k": [int(v) for v in _floats(grid_k)],
        "temperature": _floats(grid_temperature),
    }
    config = adopt_index(make_config(**flags), flags)
    vocab = read_common_vocab(common_vocab) if common_vocab else None
    searcher = Searcher.open(config)
    try:
        result = grid_search(
            searcher, facts, grid, out, config=config, common_vocab=vocab, progress=not no_progress
        )
    finally:
        searcher.close()
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(
            f"best {result['best']}: BERT-kNN P@1 {result['score']:.4f}, {result['facts']} facts; wrote {out}"
        )
