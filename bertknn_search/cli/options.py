"""Options shared by the commands, declared once as decorators; each sets the Config field of its name."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import click

from bertknn_search.config import (
    BACKENDS,
    CONTEXT_MODES,
    DISTANCES,
    EVIDENCE_MODES,
    GATES,
    MASK_POLICIES,
    PRECISIONS,
    RUNTIMES,
    STORE_DTYPES,
    finite,
)
from bertknn_search.errors import ConfigError, QuestionError
from bertknn_search.query.evidence_words import checked_words

F = TypeVar("F", bound=Callable[..., Any])
Decorator = Callable[[F], F]

FORMATS = ("xml", "jsonl", "parquet", "wikiextractor")


def stacked(*options: Decorator) -> Decorator:
    """One decorator applying ``options`` so that ``--help`` lists them in the order given."""

    def apply(f: F) -> F:
        for option in reversed(options):
            f = option(f)
        return f

    return apply


# Where an index lives besides --index (split out so that a command may take several --index).
backend_options = stacked(
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
    click.option(
        "--elasticsearch-url",
        help="Elasticsearch URL [env ELASTICSEARCH_URL]; credentials from"
        " ELASTICSEARCH_USER/ELASTICSEARCH_PASSWORD.",
    ),
    click.option(
        "--elasticsearch-ca",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="CA bundle for TLS [env ELASTICSEARCH_CA].",
    ),
    click.option(
        "--insecure",
        "opensearch_verify",
        flag_value=False,
        default=None,
        help="Do not verify the engine's TLS certificate"
        " [env OPENSEARCH_VERIFY / ELASTICSEARCH_VERIFY=false].",
    ),
    click.option(
        "--index-prefix",
        "--opensearch-prefix",
        "opensearch_prefix",
        help="Index name prefix in OpenSearch or Elasticsearch [default bertknn].",
    ),
)
index_options = stacked(
    click.option(
        "--index",
        type=click.Path(path_type=Path),
        help="Embedded index directory [env BERTKNN_INDEX; default ./bertknn-index].",
    ),
    backend_options,
)


def model_options(new_index: bool) -> Decorator:
    """Which encoder. A new index takes these; an existing one fixes model and layer, which must match.

    Args:
        new_index: the command may create the index (``ingest wiki``), so the defaults apply there.
    """
    model_default = (
        "the index's; bert-base-uncased for a new index" if new_index else "the index's (another is an error)"
    )
    layer_default = "the index's; 11 for a new index" if new_index else "the index's (another is an error)"
    precision_default = "the index's; auto for a new index" if new_index else "the index's"
    return stacked(
        click.option(
            "--model",
            help=f"HF checkpoint name or local path [env BERTKNN_MODEL; default {model_default}].",
        ),
        click.option(
            "--layer",
            type=click.IntRange(min=1),
            help=f"Hidden layer whose state is the key [default {layer_default}].",
        ),
        click.option(
            "--device",
            help="cpu, cuda, cuda:N or auto [env BERTKNN_DEVICE; default auto: a GPU when there is one].",
        ),
        click.option(
            "--batch-size",
            type=click.IntRange(min=1),
            help="Masked sentences per forward pass [default 128 on a CPU, 1024 on a GPU].",
        ),
        click.option(
            "--precision",
            type=click.Choice(PRECISIONS),
            help="Encoder arithmetic; an index keeps the one its contexts were encoded in [default"
            f" {precision_default}: bf16 on a GPU or a CPU with AVX512-BF16/AMX, else fp32; int8: CPU only].",
        ),
        click.option(
            "--runtime",
            type=click.Choice(RUNTIMES),
            help="What runs the encoder: torch (plain torch, BERT checkpoints) or transformers (any; the"
            " reference) [env BERTKNN_RUNTIME; default auto: torch where the checkpoint is BERT].",
        ),
    )


encoding_options = stacked(
    click.option(
        "--mask-policy",
        type=click.Choice(MASK_POLICIES),
        help="Which words get a context: one-wordpiece words (the paper's), or every word with its"
        " wordpieces under one [MASK] (whole-word) [default single-wordpiece].",
    ),
    click.option(
        "--store-dtype",
        type=click.Choice(STORE_DTYPES),
        help="Vectors on disk: float16, or int8 (a scale per vector, half the bytes) [default float16].",
    ),
    click.option(
        "--max-length",
        type=click.IntRange(min=8),
        help="Model input limit (capped at the model's); longer sentences are windowed [default 512].",
    ),
    click.option(
        "--contexts",
        type=click.Choice(CONTEXT_MODES),
        help="lazy: store text and the IR index now, encode an article's contexts when a query first"
        " needs it; eager: encode every context now (needed for --no-ir) [default lazy].",
    ),
    click.option(
        "--no-ir-graph",
        "no_ir_graph",
        flag_value=True,
        default=None,
        help="A new eager index made for --no-ir: OpenSearch builds an HNSW graph over every context (an"
        " approximate --no-ir; slower writes, more disk and heap); without it --no-ir scans every context"
        " exactly, as Elasticsearch and the embedded backend always do [default: no graph].",
    ),
)


class FiniteFloat(click.FloatRange):
    """A float in an optional range that is not NaN or ±inf, which ``click.FloatRange`` lets through."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        try:
            finite(number, "the value")
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)
        return super().convert(number, param, ctx)

    def _describe_range(self) -> str:
        # click describes a range without bounds as "x<=None" in the help: say nothing instead.
        if self.min is None and self.max is None:
            return ""
        return super()._describe_range()


class ByteSize(click.ParamType):
    """A size in bytes: 20GB, 500MB, 1.5GiB or a plain number."""

    name = "size"
    UNITS: ClassVar[dict[str, int]] = {
        **{"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12},
        **{"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40},
    }

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower().replace(" ", "")
        number = text.rstrip("kmgtib")
        unit = text[len(number) :]
        try:
            size = int(float(number) * self.UNITS[unit])
        except (KeyError, ValueError, OverflowError):  # int(inf): "inf", "1e400GB"
            self.fail(f"{value!r} is not a size; write e.g. 20GB, 500MB or 1.5GiB", param, ctx)
        if size <= 0:
            self.fail(f"{value!r} must be more than 0 bytes", param, ctx)
        return size


cache_option = click.option(
    "--cache-size",
    type=ByteSize(),
    help="Lazy index: keep at most this many bytes of encoded contexts (e.g. 20GB), least recently"
    " used dropped first, text never [default: keep all].",
)

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON (one object per line).")
no_progress_option = click.option("--no-progress", is_flag=True, help="No progress bar.")

method_options = stacked(
    click.option("--top", type=click.IntRange(min=1, max=1000), help="Answers per ranking [default 10]."),
    click.option("-k", "k", type=click.IntRange(min=1, max=100_000), help="Neighbours [default 128]."),
    click.option("--n-articles", type=click.IntRange(min=1, max=1000), help="Articles searched [default 3]."),
    click.option("--lambda", "lam", type=FiniteFloat(0.0, 1.0), help="Weight of kNN [default 0.3]."),
    click.option(
        "--temperature", type=FiniteFloat(min=0.0, min_open=True), help="The paper's l [default 6]."
    ),
    click.option("--distance", type=click.Choice(DISTANCES), help="d in exp(-d/l) [default squared-l2]."),
    click.option(
        "--no-ir",
        "use_ir",
        flag_value=False,
        default=None,
        help="Search every context instead of the top articles' (the paper's ablation).",
    ),
    click.option(
        "--gate",
        type=click.Choice(GATES),
        help="Adaptive retrieval: retrieve only when the subject's popularity (or BERT's top-1"
        " probability) is below the threshold, or p_BERT's entropy above it [default none].",
    ),
    click.option(
        "--gate-threshold",
        type=FiniteFloat(),
        help="The gate's threshold for every relation (log page views, a probability, or nats)"
        " [default: per relation, from 'eval grid' --settings].",
    ),
    click.option(
        "--evidence",
        type=click.Choice(EVIDENCE_MODES),
        help="Evidence sentences: chosen by information gain (no repeats), or the nearest [default diverse].",
    ),
    click.option(
        "--budget",
        type=click.IntRange(min=1),
        help="Lazy index: contexts a question encodes before it answers, each article's lead (its first"
        " sentences) first; the answer says it is partial, and the rest is encoded later"
        " [default 1,024 on a CPU (where --budget-s bounds it first), 65,536 on a GPU].",
    ),
    click.option(
        "--budget-s",
        type=FiniteFloat(min=0.001, max=86_400.0),
        help="Lazy index: seconds a question may spend encoding, best contexts first, after its floor (the"
        " first 32 contexts of each article it searches, which no clock cuts); each question of a batch its"
        " own; with --budget, whichever comes first [default 2.4 on a CPU, none on a GPU; none with"
        " --budget].",
    ),
    click.option(
        "--exact",
        flag_value=True,
        default=None,
        help="Lazy index: encode every missing context of the question's articles before answering.",
    ),
    click.option(
        "--same-kind",
        flag_value=True,
        default=None,
        help="Rank only answers of the kind most of the neighbours hold (year, number, month, punctuation,"
        " word): no year to a place question [default: off; docs/evaluation.md#confidence].",
    ),
    click.option(
        "--settings",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Tuned settings JSON from 'eval grid' (keys as the flags: lambda, k, ...); flags win.",
    ),
)

ingest_options = stacked(
    click.argument("source", type=click.Path(exists=True, path_type=Path)),
    click.option("--format", "fmt", type=click.Choice(FORMATS), help="Input format [default: detected]."),
    click.option("--limit", type=click.IntRange(min=1), help="Stop after this many articles."),
    click.option(
        "--max-article-bytes",
        type=ByteSize(),
        help="Skip, with a warning, an article longer than this (its XML wikitext, JSONL line or <doc>"
        " body, as read; a parquet text), never holding it whole [default 2MiB, Wikipedia's page limit;"
        " OpenSearch and Elasticsearch hold at most 16MiB an article].",
    ),
    no_progress_option,
    json_option,
)


def _evidence_words(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    if not value:  # the callback runs for every query: no import when the option is not given
        return ()
    try:
        return checked_words([word for given in value for word in given.split(",")])
    except QuestionError as exc:
        raise click.BadParameter(str(exc)) from exc


evidence_for_option = click.option(
    "--evidence-for",
    multiple=True,
    metavar="WORD",
    callback=_evidence_words,
    help="Also show the sentences of the neighbours that voted for WORD, ranked in the top answers or not"
    " (repeatable, or a comma list; a word of several wordpieces on a whole-word index too).",
)
