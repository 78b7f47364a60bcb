"""Ablations: one evaluation per setting (l, k, λ, N, IR) and per index (store choices), one table."""

from __future__ import annotations

import itertools
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertknn_search.config import Config
from bertknn_search.errors import BertKnnError, ConfigError
from bertknn_search.eval.compare import Comparison, compare_runs, plot_comparison, render_comparison
from bertknn_search.eval.datasets import Fact
from bertknn_search.eval.harness import EvalResult, evaluate
from bertknn_search.eval.metrics import MODELS

# The settings an ablation varies without re-ingesting, with the short names its run folders use.
VARIED = {"temperature": "l", "k": "k", "lam": "lambda", "n_articles": "n", "use_ir": "ir"}


@dataclass(frozen=True)
class Variant:
    """One evaluation of an ablation: an index and the settings to evaluate it with."""

    name: str
    config: Config


@dataclass(frozen=True)
class AblationResult:
    """What ``ablate`` returns: each run's result by name, the joined table and the files written."""

    runs: dict[str, EvalResult]
    comparison: Comparison
    files: dict[str, Path]


def variants(indexes: Sequence[Config], values: Mapping[str, Sequence[Any]]) -> list[Variant]:
    """Every index with every combination of ``values``, named by what differs between them.

    Args:
        indexes: one Config per index (their own method settings are the base).
        values: Config field (a key of ``VARIED``) -> values to try; a field left out keeps the index's.

    Returns:
        Variants in index order, then in the order of the values given; names like ``l6-noir`` or
        ``idx-nostop-l20`` (the index's folder name when there are several indexes).

    Raises:
        ConfigError: a field that cannot be varied here, an empty list, or a value Config rejects.
    """
    unknown = sorted(set(values) - set(VARIED))
    if unknown:
        raise ConfigError(f"cannot vary {unknown} without another index; vary {sorted(VARIED)}")
    empty = [name for name, vals in values.items() if not vals]
    if empty:
        raise ConfigError(f"no values given for {empty}")
    fields = [name for name in VARIED if name in values]
    combos = list(itertools.product(*(list(dict.fromkeys(values[name])) for name in fields)))
    labels = _index_labels(indexes)
    found = []
    for config, index_label in zip(indexes, labels):
        for combo in combos:
            changes = dict(zip(fields, combo))
            parts = [index_label] if len(indexes) > 1 else []
            parts += [_part(name, value) for name, value in changes.items() if len(set(values[name])) > 1]
            found.append(Variant("-".join(parts) or "run", config.replace(**changes)))
    return found


def _index_labels(indexes: Sequence[Config]) -> list[str]:
    names = [c.index.name if c.backend == "embedded" else c.opensearch_prefix for c in indexes]
    if len(set(names)) < len(names):
        raise ConfigError(f"give the indexes folders of different names (they name the runs): {names}")
    return names


def _part(name: str, value: Any) -> str:
    if name == "use_ir":
        return "ir" if value else "noir"
    return f"{VARIED[name]}{value:g}" if isinstance(value, float) else f"{VARIED[name]}{value}"


def check_variants(found: Sequence[Variant]) -> None:
    """Refuse, before anything runs, a no-IR run on a lazy index that has not encoded every article to
    its end (it would stop the ablation half-way); a lazy index encoded whole holds what an eager one
    holds, and the run searches it all.

    Raises:
        ConfigError: naming the index and the fix.
    """
    for v in found:
        if not v.config.use_ir and v.config.contexts == "lazy" and not _encoded_whole(v.config):
            raise ConfigError(
                f"run {v.name} searches every context (no IR), but the index at {v.config.index} is lazy"
                " and not every article is encoded; encode them all (eval warm, or ingest wiki --contexts"
                " eager) or leave 'off' out of --ir"
            )


def _encoded_whole(config: Config) -> bool:
    """Whether the index has every article encoded to its end (False where it cannot be opened: the
    run's own open then says why)."""
    from bertknn_search.backends import open_backend

    try:
        backend = open_backend(config)
    except BertKnnError:
        return False
    try:
        held = backend.stats()
    finally:
        backend.close()
    return held.articles > 0 and held.encoded_whole


def ablate(
    facts: Sequence[Fact],
    found: Sequence[Variant],
    out_dir: Path,
    *,
    at: int = 1,
    models: Sequence[str] = MODELS,
    common_vocab: Collection[str] | None = None,
    resume: bool = True,
    no_article_wrong: bool = False,
    progress: bool = False,
) -> AblationResult:
    """Evaluate ``facts`` under every variant, each into ``out_dir/<name>``, then join them in one table.

    Each run is an ``evaluate`` report folder of its own (resumable: a re-run continues each where it
    stopped). An index is opened once for all its settings.

    Args:
        facts: what to evaluate.
        found: from ``variants`` (checked with ``check_variants``).
        out_dir: receives a folder per run and ``ablation.md``, ``ablation.json``, ``ablation.png``.
        at: the P@k of the table and the plot.
        models: the rankings to show.
        common_vocab, resume, no_article_wrong, progress: as for ``evaluate``.

    Raises:
        ConfigError, InputFormatError: as ``evaluate``.
    """
    from bertknn_search.query.search import Searcher

    check_variants(found)
    out_dir = Path(out_dir)
    runs: dict[str, EvalResult] = {}
    for _, group in itertools.groupby(found, key=lambda v: (v.config.backend, v.config.index)):
        members = list(group)
        searcher = Searcher.open(members[0].config)
        try:
            for v in members:
                runs[v.name] = evaluate(
                    searcher,
                    facts,
                    v.config,
                    out_dir / v.name,
                    common_vocab=common_vocab,
                    resume=resume,
                    no_article_wrong=no_article_wrong,
                    progress=progress,
                )
        finally:
            searcher.close()
    results = {name: json.loads(r.report["json"].read_text(encoding="utf-8")) for name, r in runs.items()}
    comparison = compare_runs(results, at, models)
    files = {
        "markdown": out_dir / "ablation.md",
        "json": out_dir / "ablation.json",
        "plot": out_dir / "ablation.png",
    }
    files["markdown"].write_text(render_comparison(comparison), encoding="utf-8")
    files["json"].write_text(json.dumps(comparison.as_dict(), indent=2) + "\n", encoding="utf-8")
    plot_comparison(comparison, files["plot"])
    return AblationResult(runs, comparison, files)
