"""Several evaluation runs in one table: per-relation rows, then the macro averages (paper layout)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bertknn_search.eval.metrics import MODELS
from bertknn_search.eval.report import COLORS, NA, label, pct, table, unavailable_note

# Settings columns of the runs table: (title, where it is in results.json's meta).
RUN_COLUMNS = (
    ("Model", ("model",)),
    ("Layer", ("layer",)),
    ("Mask policy", ("store", "mask_policy")),
    ("Store dtype", ("store", "store_dtype")),
    ("IR", ("settings", "use_ir")),
    ("N", ("settings", "n_articles")),
    ("k", ("settings", "k")),
    ("l", ("settings", "temperature")),
    ("λ", ("settings", "lam")),
)


@dataclass(frozen=True)
class Row:
    """One line of the comparison.

    Attributes:
        kind: "relation", "corpus" (macro over its relations) or "aggregate" (the paper's LAMA figure).
        corpus: the corpus; for an aggregate its parts joined by "+".
        name: relation id, corpus or aggregate name.
        facts: facts read (from the first run that has the row).
        relations: relations in the mean (1 for a relation row).
        precision: run -> model -> mean P@k in [0, 1], None where the run has no scored fact there or
            cannot rank with that model (see ``Comparison.runs``' "unavailable").
    """

    kind: str
    corpus: str
    name: str
    facts: int
    relations: int
    precision: dict[str, dict[str, float | None]]


@dataclass(frozen=True)
class Comparison:
    """What ``compare_runs`` returns: the runs' settings and the rows, relations first.

    Each run's settings hold "unavailable": the models it could not rank with (["bert"] for a model
    without an MLM head), shown as "n/a" rather than as a score.
    """

    k: int
    models: list[str]
    runs: list[dict[str, Any]]
    rows: list[Row]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_runs(
    results: Mapping[str, Mapping[str, Any]], k: int = 1, models: Sequence[str] = MODELS
) -> Comparison:
    """Join runs on their relations: one row per relation, then per corpus and aggregate (macro averages).

    Args:
        results: run name -> the parsed ``results.json`` of that run.
        k: which P@k.
        models: which rankings to show (e.g. only "knn" for a checkpoint without an MLM head).

    Raises:
        ValueError: a run did not compute P@k, or an unknown model.
    """
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise ValueError(f"unknown models {unknown}; choose from {list(MODELS)}")
    rows: dict[tuple[str, str, str], Row] = {}
    for run, payload in results.items():
        if k not in payload["ks"]:
            raise ValueError(f"run {run} has no P@{k} (it computed P@{payload['ks']})")
        kinds = [("relation", payload["relations"]), ("corpus", payload["corpora"])]
        for kind, scores in [*kinds, ("aggregate", payload["aggregates"])]:
            for score in scores:
                key = (kind, score["corpus"], score["name"])
                if key not in rows:
                    relations = 1 if kind == "relation" else score["relations"]
                    rows[key] = Row(kind, score["corpus"], score["name"], score["facts"], relations, {})
                precision = score["precision"]
                rows[key].precision[run] = {
                    m: precision[m][str(k)] if precision and m in precision else None for m in models
                }
    found = list(rows.values())
    # Relations grouped by corpus (in the order the corpora first appear), then the macro averages.
    corpora = list(dict.fromkeys(r.corpus for r in found if r.kind == "relation"))
    relation_rows = sorted((r for r in found if r.kind == "relation"), key=lambda r: corpora.index(r.corpus))
    ordered = relation_rows + [r for kind in ("corpus", "aggregate") for r in found if r.kind == kind]
    runs = [{"name": run, **_settings(payload)} for run, payload in results.items()]
    return Comparison(k, list(models), runs, ordered)


def _settings(payload: Mapping[str, Any]) -> dict[str, Any]:
    meta = payload.get("meta", {})
    found: dict[str, Any] = {}
    for title, path in RUN_COLUMNS:
        value: Any = meta
        for part in path:
            value = value.get(part) if isinstance(value, Mapping) else None
        found[title] = value
    found["Facts scored"] = sum(s["scored"] for s in payload["corpora"])
    found["unavailable"] = list(meta.get("unavailable_models") or [])
    return found


def _unavailable(comparison: Comparison) -> list[str]:
    return list(dict.fromkeys(m for run in comparison.runs for m in run.get("unavailable", [])))


def _cell(value: Any) -> str:
    if value is None:
        return "?"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str) and "/" in value:
        return Path(value).name  # a model path: its folder says which model
    return str(value)


def _headers(comparison: Comparison) -> list[str]:
    runs = [r["name"] for r in comparison.runs]
    if len(runs) == 1:
        return [label(m) for m in comparison.models]
    if len(comparison.models) == 1:
        return runs
    return [f"{run} {label(m)}" for run in runs for m in comparison.models]


def _cells(row: Row, comparison: Comparison) -> list[str]:
    return [
        NA if m in run.get("unavailable", []) else pct(row.precision.get(run["name"], {}).get(m))
        for run in comparison.runs
        for m in comparison.models
    ]


def _run_cell(run: Mapping[str, Any], title: str) -> str:
    # λ weighs BERT against kNN: without BERT there is nothing to weigh.
    if title == "λ" and "bert" in run.get("unavailable", []):
        return NA
    return _cell(run[title])


def _row_names(row: Row) -> tuple[str, str]:
    if row.kind == "relation":
        return row.corpus, row.name
    if row.kind == "corpus":
        return f"**{row.corpus}**", f"macro ({row.relations} rel.)"
    return f"**{row.name}**", f"{row.corpus} macro ({row.relations} rel.)"


def render_comparison(comparison: Comparison) -> str:
    """Markdown: the runs' settings, then one table of P@k with relation rows and the macro averages."""
    k = comparison.k
    lines = [f"# BERT-kNN runs compared: mean P@{k} in %", ""]
    header = ["Run", *(title for title, _ in RUN_COLUMNS), "Facts scored"]
    runs = [[r["name"], *(_run_cell(r, title) for title in header[1:])] for r in comparison.runs]
    lines += [*table(header, runs, 5), ""]
    note = f"Mean P@{k} in %: per relation over its facts, then macro averages over relations (bold)."
    missing = [m for m in _unavailable(comparison) if m in comparison.models]
    if missing:
        named = [r["name"] for r in comparison.runs if set(missing) & set(r.get("unavailable", []))]
        note += f" {unavailable_note(missing)} (runs: {', '.join(named)})"
    if any(r.kind == "aggregate" for r in comparison.rows):
        note += " LAMA is the paper's figure: T-REx and Google-RE relations together."
    lines += [note, ""]
    header = ["Corpus", "Relation", "Facts", *_headers(comparison)]
    body = [[*_row_names(r), str(r.facts), *_cells(r, comparison)] for r in comparison.rows]
    lines += [*table(header, body, 2), ""]
    return "\n".join(lines)


def render_latex(comparison: Comparison) -> str:
    """The P@k table as a LaTeX ``tabular`` (booktabs), relation rows then the macro averages."""

    def esc(text: str) -> str:
        for char, escaped in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("&", r"\&"), ("%", r"\%")):
            text = text.replace(char, escaped)
        return text

    headers = _headers(comparison)
    lines = [
        f"% mean P@{comparison.k} in %; runs: " + "; ".join(_describe(r) for r in comparison.runs),
        r"\begin{tabular}{ll" + "r" * (1 + len(headers)) + "}",
        r"\toprule",
        " & ".join(["Corpus", "Relation", "Facts", *map(esc, headers)]) + r" \\",
        r"\midrule",
    ]
    first_macro = True
    for row in comparison.rows:
        if row.kind != "relation" and first_macro:
            lines.append(r"\midrule")
            first_macro = False
        names = [esc(n.strip("*")) for n in _row_names(row)]
        cells = [*names, str(row.facts), *_cells(row, comparison)]
        lines.append(" & ".join(cells).replace("–", "--") + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", ""]
    return "\n".join(lines)


def _describe(run: Mapping[str, Any]) -> str:
    return f"{run['name']}: " + ", ".join(f"{title} {_run_cell(run, title)}" for title, _ in RUN_COLUMNS)


def plot_comparison(comparison: Comparison, path: Path) -> None:
    """One panel per macro row (corpus or aggregate): a group of bars per run, one bar per model."""
    from matplotlib.figure import Figure  # imported here: matplotlib is slow to import

    panels = [r for r in comparison.rows if r.kind != "relation"]
    runs = [r["name"] for r in comparison.runs]
    fig = Figure(figsize=(max(4.0, 1.2 * len(runs) + 1.5) * max(len(panels), 1), 3.8), layout="constrained")
    axes = fig.subplots(1, max(len(panels), 1), squeeze=False)[0]
    width = 0.8 / len(comparison.models)
    unavailable = {r["name"]: r.get("unavailable", []) for r in comparison.runs}
    for ax, row in zip(axes, panels):
        for i, model in enumerate(comparison.models):
            xs = [j + (i - (len(comparison.models) - 1) / 2) * width for j in range(len(runs))]
            # NaN draws no bar: a run that cannot rank with a model has none, rather than one of 0.
            values = [row.precision.get(run, {}).get(model) for run in runs]
            heights = [
                float("nan") if model in unavailable[run] else 100 * (value or 0.0)
                for run, value in zip(runs, values)
            ]
            ax.bar(xs, heights, width, label=label(model), color=COLORS.get(model, f"C{3 + i}"))
        ax.set_xticks(range(len(runs)), runs, rotation=30, ha="right", fontsize=7)
        ax.set_ylim(0, 100)
        ax.set_title(f"{row.name} ({row.relations} rel.)", fontsize=9)
    missing = [m for m in _unavailable(comparison) if m in comparison.models]
    if missing:
        names = ", ".join(label(m) for m in missing)
        fig.suptitle(f"{names}: n/a in some runs (no masked-LM head)", fontsize=8)
    axes[0].set_ylabel(f"mean P@{comparison.k} (%)")
    if panels:
        axes[0].legend(fontsize=8)
    fig.savefig(path, dpi=120)
