"""Options and value types of the ``eval`` commands: datasets, relation ids, lists of settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from bertknn_search.cli.options import Decorator, stacked
from bertknn_search.config import finite
from bertknn_search.errors import ConfigError
from bertknn_search.eval.metrics import MODELS

DATASET_FLAGS = (
    *("lama", "corpora", "lama_uhn", "relations", "relations_file"),
    *("popqa", "split", "questions", "per_relation"),
)

existing = click.Path(exists=True, path_type=Path)
relations_option = click.option(
    "--relations",
    help="Only these relations, comma-separated: T-REx/LAMA-UHN ids (P19,P103), Google-RE names"
    " (place_of_birth), ConceptNet, SQuAD, PopQA or JSONL relations [default: all].",
)
dataset_options = stacked(
    click.option("--lama", type=existing, help="LAMA data folder (relations.jsonl, TREx/, Google_RE/, ...)."),
    click.option("--corpora", help="Comma-separated LAMA corpora [default: all present]."),
    click.option(
        "--lama-uhn",
        type=existing,
        help="LAMA-UHN folder (TREx_UHN/); templates from --relations-file.",
    ),
    relations_option,
    click.option(
        "--relations-file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="LAMA's relations.jsonl (templates) for --lama-uhn [default: --lama's].",
    ),
    click.option("--popqa", type=existing, help="PopQA TSV (or the derived dev/test JSON)."),
    click.option("--split", default="test", show_default=True, help="Split of a derived PopQA JSON."),
    click.option("--questions", type=existing, help="JSONL of {question, answers, subject?, relation?}."),
    click.option(
        "--per-relation", type=click.IntRange(min=1), help="Use only the first N facts of each relation."
    ),
    click.option(
        "--common-vocab", type=existing, help="LAMA common vocabulary: restricts answers and outputs."
    ),
)


def report_options(default_out: str, out_help: str, resume_help: str, no_article_help: str) -> Decorator:
    """``--out``, ``--no-resume`` and ``--no-article``: where a run's reports go and how it resumes."""
    return stacked(
        click.option(
            "--out",
            type=click.Path(file_okay=False, path_type=Path),
            default=Path(default_out),
            show_default=True,
            help=out_help,
        ),
        click.option("--no-resume", is_flag=True, help=resume_help),
        click.option(
            "--no-article",
            type=click.Choice(["skip", "wrong"]),
            default="skip",
            show_default=True,
            help=no_article_help,
        ),
    )


def json_flag(what: str) -> Decorator:
    """``--json`` with help that says what is printed (each command prints one object per line)."""
    return click.option("--json", "as_json", is_flag=True, help=f"Print JSON: {what}.")


class NumberList(click.ParamType):
    """Comma-separated numbers of one kind, e.g. ``1,2,3``."""

    def __init__(self, kind: type) -> None:
        self.kind = kind
        self.name = f"{kind.__name__},..."

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, list):
            return value
        try:
            numbers = [self.kind(v) for v in str(value).split(",") if v.strip()]
        except ValueError:
            self.fail(f"expected comma-separated {self.kind.__name__}s, got {value!r}", param, ctx)
        try:
            return [finite(n, "each value") if self.kind is float else n for n in numbers]
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


class ModelList(click.ParamType):
    """Comma-separated rankings: bert, knn, bert_knn (BERT-kNN and bert-knn are accepted too)."""

    name = "models"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, list):
            return value
        names = [v.strip().lower().replace("-", "_") for v in str(value).split(",") if v.strip()]
        unknown = [n for n in names if n not in MODELS]
        if unknown or not names:
            self.fail(f"expected some of {', '.join(MODELS)}, got {value!r}", param, ctx)
        return list(dict.fromkeys(names))


class IrList(click.ParamType):
    """Comma-separated on/off: whether the IR step runs (off searches every context)."""

    name = "on,off"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, list):
            return value
        words = [v.strip().lower() for v in str(value).split(",") if v.strip()]
        if not words or any(w not in ("on", "off") for w in words):
            self.fail(f"expected on, off or on,off, got {value!r}", param, ctx)
        return [w == "on" for w in dict.fromkeys(words)]


models_option = click.option(
    "--models",
    type=ModelList(),
    default=",".join(MODELS),
    show_default=True,
    help="Rankings to show, comma-separated (knn alone for a checkpoint without an MLM head).",
)

# What ``eval ablate`` varies: several indexes (store choices) and lists of query-time settings.
ablation_options = stacked(
    click.option(
        "--index",
        "indexes",
        multiple=True,
        type=click.Path(path_type=Path),
        help="An index to evaluate; repeat it to compare store choices (mask policy, store dtype, layer)"
        " [env BERTKNN_INDEX; default ./bertknn-index].",
    ),
    click.option("--temperature", type=NumberList(float), help="Values of l [default: the index's 6]."),
    click.option("-k", "k", type=NumberList(int), help="Values of k, the neighbours [default 128]."),
    click.option("--lambda", "lam", type=NumberList(float), help="Values of λ [default 0.3]."),
    click.option(
        "--n-articles", type=NumberList(int), help="Values of N, the articles searched [default 3]."
    ),
    click.option("--ir", "use_ir", type=IrList(), help="on, off or on,off: the IR step, or every context."),
)
