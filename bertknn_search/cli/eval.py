"""The ``eval`` commands: P@k tables on LAMA, LAMA-UHN, PopQA or plain JSONL, and the grid search.

``eval_group`` is a stand-alone click group; ``cli.py`` adds it to the main command.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from bertknn_search import session
from bertknn_search.cli.eval_options import (
    DATASET_FLAGS,
    NumberList,
    ablation_options,
    dataset_options,
    existing,
    json_flag,
    models_option,
    relations_option,
    report_options,
)
from bertknn_search.cli.group import defer_interrupts
from bertknn_search.cli.options import (
    backend_options,
    cache_option,
    index_options,
    method_options,
    model_options,
    no_progress_option,
)
from bertknn_search.config import GATES, Config
from bertknn_search.errors import ConfigError
from bertknn_search.eval.metrics import KS


def _exact_unless_budget(config: Config) -> Config:
    """Evaluation answers over every context of a fact's articles, unless --budget or --budget-s asks for
    anytime answers (results.json records which, with the other settings)."""
    anytime = config.budget is not None or config.budget_s is not None
    return config if anytime else config.replace(exact=True)


def _facts(flags: dict[str, Any]) -> list[Any]:
    """Read the datasets the flags name, taking their flags out of ``flags``."""
    from bertknn_search.eval.datasets import read_facts
    from bertknn_search.eval.relations import parse_relations

    data = {name: flags.pop(name) for name in DATASET_FLAGS}
    if not any(data[name] for name in ("lama", "lama_uhn", "popqa", "questions")):
        raise click.UsageError("name a dataset: --lama, --lama-uhn, --popqa or --questions")
    corpora = data.pop("corpora")
    data["relations"] = parse_relations(data["relations"])
    return read_facts(corpora=corpora.split(",") if corpora else None, **data)


@click.group("eval")
def eval_group() -> None:
    """Measure answer quality as the paper does (P@1/5/10, macro over relations).

    Example: bertknn-search eval run --lama data/lama --out eval-out
    """
    defer_interrupts()  # Ctrl-C at a safe point, never inside torch (cli.group)


@eval_group.command("run")
@dataset_options
@report_options(
    "eval-out",
    "Report folder; a re-run resumes from it.",
    "Start over instead of continuing an interrupted run.",
    "Facts whose IR step finds no article: leave them out, or score them wrong (the reference's way).",
)
@no_progress_option
@json_flag(
    "the report as one object on one line (the numbers of results.json, what was read, scored and"
    " skipped, and the report's files)"
)
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
    from bertknn_search.output import eval_json, render_datastore, render_eval_counts
    from bertknn_search.query.search import Searcher

    facts = _facts(flags)
    config = _exact_unless_budget(session.open_index(flags, settings=settings).config)
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
        click.echo(eval_json(result))
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


@eval_group.command("calibrate")
@dataset_options
@report_options(
    "calibrate-out",
    "Report folder: eval run's answers, the fit and its check; a re-run resumes from it.",
    "Start over instead of continuing an interrupted run.",
    "Facts whose IR step finds no article: leave them out, or score them wrong (the reference's way).",
)
@click.option(
    "--store/--no-store",
    default=True,
    help="Store the fit with the index (confidence-fit.json in --index), where query, serve and eval read"
    " it; --no-store only writes it to --out.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Store the fit even with fewer than 300 answers of 5 relations or a worse left-out check than the"
    " fit in use on the same answers.",
)
@click.option("--reset", is_flag=True, help="Remove the fit stored with --index: back to the shipped one.")
@no_progress_option
@json_flag("the fit, its check on left-out relations and where it was stored, as one object on one line")
@method_options
@cache_option
@model_options(new_index=False)
@index_options
def eval_calibrate(
    out: Path,
    no_resume: bool,
    no_article: str,
    store: bool,
    force: bool,
    reset: bool,
    settings: Path | None,
    no_progress: bool,
    as_json: bool,
    common_vocab: Path | None,
    **flags: Any,
) -> None:
    """Fit each answer's confidence p to this model and index, checked on whole relations left out.

    Answers the facts as eval run does, fits p (a logistic regression on each answer's signals: votes,
    neighbours, agreement, top-1 probability, coverage), scores every relation's answers with a fit made
    without that relation, sets the bands on those scores and stores the fit with the index. Writes
    calibration.md, calibration.json, confidence-fit.json and reliability-left-out.png to --out. The fit
    is stored only if it has 300 answers of 5 relations or more and its left-out AUROC and ECE are not
    worse than the fit in use on the same answers (--force stores it anyway); --reset goes back to the
    shipped fit.

    Example: bertknn-search eval calibrate --lama data/lama --corpora T-REx --index my-index
    """
    from bertknn_search.eval.datasets import read_common_vocab
    from bertknn_search.eval.harness import evaluate
    from bertknn_search.eval.index_calibration import calibration_line, write_calibration
    from bertknn_search.query.confidence import FIT_FILE, reset_fit
    from bertknn_search.query.search import Searcher

    if reset:
        rest = {name: value for name, value in flags.items() if name not in DATASET_FLAGS}
        click.echo(reset_fit(session.resolve_config(rest).config.index))
        return
    facts = _facts(flags)
    config = _exact_unless_budget(session.open_index(flags, settings=settings).config)
    vocab = read_common_vocab(common_vocab) if common_vocab else None
    searcher = Searcher.open(config)
    try:
        wrong = no_article == "wrong"
        result = evaluate(searcher, facts, config, out, common_vocab=vocab, resume=not no_resume,
                          no_article_wrong=wrong, progress=not no_progress)  # fmt: skip
        model = f"{searcher.encoder.model_name} layer {searcher.encoder.layer}"
        in_use = (searcher.confidence_fit, searcher.fit_name)
    finally:
        searcher.close()
    where = Path(config.index) / FIT_FILE if store else None
    fit, check = write_calibration(result.checkpoint, out, model, where, in_use, force)
    decision = check["stored"]
    if as_json:
        click.echo(json.dumps({"fit": fit.as_json(), "check": check, "stored": decision["at"]}))
        return
    click.echo((out / "calibration.md").read_text(encoding="utf-8"))
    click.echo(calibration_line(check, where, out, in_use[1]))


@eval_group.command("compare")
@click.argument(
    "runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path)
)
@click.option("-k", "k", type=click.Choice(KS), default=KS[0], show_default=True, help="Which P@k to show.")
@models_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["markdown", "latex"]),
    default="markdown",
    show_default=True,
    help="Markdown, or a LaTeX tabular (booktabs) to paste into a paper.",
)
@click.option(
    "--macro-only",
    is_flag=True,
    help="Only the macro averages: datasets by model, the layout of the paper's Table 1.",
)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Also write the table here.")
@click.option(
    "--plot", type=click.Path(dir_okay=False, path_type=Path), help="Also draw the macro rows here (PNG)."
)
@json_flag("the table as one object on one line (runs with their settings, and rows)")
def eval_compare(
    runs: tuple[Path, ...],
    k: int,
    models: list[str],
    fmt: str,
    macro_only: bool,
    out: Path | None,
    plot: Path | None,
    as_json: bool,
) -> None:
    """Join 'eval run' reports in the table a paper shows: a row per relation, then the macro averages.

    Columns are runs x models; a first table lists each run's settings (model, layer, mask policy, store
    dtype, IR, N, k, l, λ). Use it for the layer (10/11/12), no-IR and store ablations: build one index per
    choice ('ingest wiki --layer 10 --index idx-l10'), run 'eval run' on each, then compare the folders.

    Example: bertknn-search eval compare eval-l10 eval-l11 eval-l12 eval-noir --out ablation.md
    """
    from bertknn_search.eval.compare import compare_runs, plot_comparison, render_comparison, render_latex

    names = [run.name for run in runs]
    if len(set(names)) < len(names):  # a/run and b/run: the folder names alone would merge columns
        names = [str(run) for run in runs]
    results = {}
    for name, run in zip(names, runs):
        path = run / "results.json"
        try:
            results[name] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path} cannot be read ({exc}); is {run} an 'eval run' --out folder?") from exc
    try:
        comparison = compare_runs(results, k, models)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"the reports cannot be compared: {exc}") from exc
    if macro_only:
        macro = [r for r in comparison.rows if r.kind != "relation"]
        comparison = dataclasses.replace(comparison, rows=macro)
    text = render_latex(comparison) if fmt == "latex" else render_comparison(comparison)
    if out is not None:
        _write(out, lambda path: path.write_text(text, encoding="utf-8"))
    if plot is not None:
        _write(plot, lambda path: plot_comparison(comparison, path))
    click.echo(json.dumps(comparison.as_dict(), ensure_ascii=False) if as_json else text)


def _write(path: Path, write: Callable[[Path], object]) -> None:
    """Write a file with ``write``, creating its folder; a failure is one line."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc}") from exc


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
@click.option(
    "--gate",
    type=click.Choice(GATES),
    help="Also learn adaptive-retrieval thresholds per relation (popularity, top1, entropy) at the best"
    " setting, and turn this gate on in the file ('none': thresholds only, for 'eval run' to report).",
)
@cache_option
@no_progress_option
@json_flag("the result as one object on one line (best setting, its score, every setting's score)")
@model_options(new_index=False)
@index_options
def eval_grid(
    out: Path,
    grid_n: list[int],
    grid_lambda: list[float],
    grid_k: list[int],
    grid_temperature: list[float],
    gate: str | None,
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
    from bertknn_search.query.search import Searcher

    facts = _facts(flags)
    grid = {"n_articles": grid_n, "lam": grid_lambda, "k": grid_k, "temperature": grid_temperature}
    config = _exact_unless_budget(session.open_index(flags).config)
    vocab = read_common_vocab(common_vocab) if common_vocab else None
    searcher = Searcher.open(config)
    try:
        result = grid_search(
            searcher,
            facts,
            grid,
            out,
            config=config,
            common_vocab=vocab,
            progress=not no_progress,
            gate=gate,
        )
    finally:
        searcher.close()
    click.echo(json.dumps(result) if as_json else render_grid(result, out))


@eval_group.command("warm")
@dataset_options
@cache_option
@no_progress_option
@json_flag("the summary as one object on one line")
@model_options(new_index=False)
@index_options
def eval_warm(no_progress: bool, as_json: bool, common_vocab: Path | None, **flags: Any) -> None:
    """Encode the articles a dataset's facts will search (a lazy index), in large batches.

    Run before 'eval run' on a lazy index, on the GPU machine; the run itself then only reads.

    Example: bertknn-search eval warm --lama data/lama --corpora T-REx --device cuda
    """
    from bertknn_search.output import render_warm, to_json
    from bertknn_search.query.search import Searcher
    from bertknn_search.records import Question
    from bertknn_search.warm import needed_articles, warm

    facts = _facts(flags)
    config = _exact_unless_budget(session.open_index(flags).config)
    searcher = Searcher.open(config)
    try:
        ids = needed_articles(searcher, [Question(f.question, f.subject) for f in facts])
        summary = warm(searcher, ids, progress=not (no_progress or as_json))
    finally:
        searcher.close()
    click.echo(to_json(summary) if as_json else render_warm(summary))


@eval_group.command("cloze")
@click.option(
    "--corpus",
    type=existing,
    required=True,
    help="The corpus the index was built from (any format 'ingest wiki' reads): its articles are drawn from.",
)
@click.option(
    "--targets",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Targets of each kind: words of one wordpiece, and words of several.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Decides the articles and words drawn.")
@click.option(
    "--per-article",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="At most this many targets of each kind from one article.",
)
@method_options
@cache_option
@no_progress_option
@json_flag("the result as one object on one line (settings, counts, P@1 and P@10 per kind and model)")
@model_options(new_index=False)
@index_options
def eval_cloze(
    corpus: Path,
    targets: int,
    seed: int,
    per_article: int,
    no_progress: bool,
    as_json: bool,
    **flags: Any,
) -> None:
    """Leave-one-out cloze: mask a word of the index's own sentences, answer from the other contexts.

    Targets are drawn with --seed from the text and the tokenizer, so indexes of one corpus under other
    mask policies get the same targets. The question is the sentence with the whole word as one [MASK]
    and the article's title as subject; its own sentence's contexts are left out of the kNN. Reports
    P@1 and P@10 for words of one wordpiece and of several. A lazy index encodes the articles drawn whole.

    Example: bertknn-search eval cloze --corpus corpus.jsonl --index idx-whole --targets 200
    """
    from bertknn_search.eval.cloze import cloze, cloze_json, render_cloze
    from bertknn_search.ingest.readers import read_articles
    from bertknn_search.query.search import Searcher

    config = session.open_index(flags).config
    articles = [(a.id, a.title) for a in read_articles(corpus) if a.text.strip()]
    searcher = Searcher.open(config)
    try:
        result = cloze(
            searcher,
            articles,
            config,
            per_kind=targets,
            seed=seed,
            per_article=per_article,
            progress=not (no_progress or as_json),
        )
    finally:
        searcher.close()
    click.echo(json.dumps(cloze_json(result), ensure_ascii=False) if as_json else render_cloze(result))


@eval_group.command("corpus")
@click.option("--lama", type=existing, help="LAMA data folder: its T-REx and Google-RE facts' sentences.")
@click.option("--lama-uhn", type=existing, help="LAMA-UHN folder (TREx_UHN/): its facts' sentences.")
@relations_option
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("corpus.jsonl"),
    show_default=True,
    help="The corpus, JSONL of {id, title, text}.",
)
@click.option(
    "--per-relation",
    type=click.IntRange(min=1),
    help="Only the first N facts of each relation (those 'eval run --per-relation N' reads).",
)
@json_flag("the summary as one object on one line")
def eval_corpus(
    lama: Path | None,
    lama_uhn: Path | None,
    relations: str | None,
    out: Path,
    per_relation: int | None,
    as_json: bool,
) -> None:
    """Write the Wikipedia sentences LAMA's facts came from as a corpus 'ingest wiki' reads.

    One article per subject (a subject of several relations is one article), holding the evidence
    sentences of its facts with the object filled in: T-REx and LAMA-UHN evidences, Google-RE's masked
    sentences. Ingested, every fact's subject has its own article, as in the paper's setting.

    Example: bertknn-search eval corpus --lama data/lama --relations P19,P103 --out corpus.jsonl
    """
    from bertknn_search.eval.evidence import evidence_files, write_evidence_corpus
    from bertknn_search.eval.relations import parse_relations
    from bertknn_search.output import render_corpus, to_json

    files = evidence_files(lama, lama_uhn, parse_relations(relations))
    summary = write_evidence_corpus(files, out, per_relation)
    click.echo(to_json(summary) if as_json else render_corpus(summary))


@eval_group.command("ablate")
@dataset_options
@ablation_options
@click.option("--at", type=click.Choice(KS), default=KS[0], show_default=True, help="P@k in table and plot.")
@models_option
@report_options(
    "eval-ablation",
    "A report folder per run, and ablation.md/.json/.png; a re-run resumes.",
    "Start every run over.",
    "Facts whose IR step finds no article: leave them out, or score them wrong.",
)
@cache_option
@no_progress_option
@json_flag("one object on one line: the table (runs with their settings, rows), each run's counts and files")
@model_options(new_index=False)
@backend_options
def eval_ablate(
    indexes: tuple[Path, ...],
    temperature: list[float] | None,
    k: list[int] | None,
    lam: list[float] | None,
    n_articles: list[int] | None,
    use_ir: list[bool] | None,
    at: int,
    models: list[str],
    out: Path,
    no_resume: bool,
    no_article: str,
    no_progress: bool,
    as_json: bool,
    common_vocab: Path | None,
    **flags: Any,
) -> None:
    """Evaluate every combination of settings (l, k, λ, N, IR) on one or more indexes; one table and plot.

    Query-time settings need no re-ingest: each list given is tried, in every combination. Store choices
    (mask policy, store dtype, layer) are fixed when an index is built: build one index per choice and
    give each with --index. Each run is a full 'eval run' report in OUT/<run>; OUT/ablation.md is the
    'eval compare' table of them all (a row per relation, then the macro averages), ablation.png its plot.

    Example: bertknn-search eval ablate --lama data/lama --relations P19 --index a --index b --ir on,off
    """
    from bertknn_search.eval.ablate import ablate, check_variants, variants
    from bertknn_search.eval.compare import render_comparison
    from bertknn_search.eval.datasets import read_common_vocab
    from bertknn_search.output import ablation_json

    facts = _facts(flags)
    configs = [
        _exact_unless_budget(session.open_index({**flags, "index": index}).config)
        for index in indexes or [None]
    ]
    values = {"temperature": temperature, "k": k, "lam": lam, "n_articles": n_articles, "use_ir": use_ir}
    found = variants(configs, {name: v for name, v in values.items() if v is not None})
    check_variants(found)
    result = ablate(
        facts,
        found,
        out,
        at=at,
        models=models,
        common_vocab=read_common_vocab(common_vocab) if common_vocab else None,
        resume=not no_resume,
        no_article_wrong=no_article == "wrong",
        progress=not (no_progress or as_json),
    )
    if as_json:
        click.echo(ablation_json(result))
    else:
        click.echo(render_comparison(result.comparison))
        files = ", ".join(map(str, result.files.values()))
        click.echo(f"{len(result.runs)} runs in {out}; table and plot: {files}")
