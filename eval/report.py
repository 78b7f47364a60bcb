"""Evaluation report: results.json (every number), results.md (the paper's tables) and bar plots."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bertknn_search.eval.metrics import NO_ARTICLE, Bucket, MacroResult, Score

LABELS = {
    "bert": "BERT",
    "knn": "kNN",
    "bert_knn": "BERT-kNN",
    "adaptive_popularity": "Adaptive (popularity)",
    "adaptive_top1": "Adaptive (top-1)",
    "adaptive_entropy": "Adaptive (entropy)",
}
# One colour per model across all plots.
COLORS = {"bert": "C0", "knn": "C1", "bert_knn": "C2", "adaptive_popularity": "C3", "adaptive_top1": "C4"}
COLORS["adaptive_entropy"] = "C5"
# Bars of the popularity plot: the parametric model against the interpolation (PopQA's comparison),
# and the adaptive models where a run has them.
POPULARITY_MODELS = ("bert", "bert_knn", "adaptive_popularity", "adaptive_top1", "adaptive_entropy")
SIGNAL_UNITS = {"popularity": "log page views", "top1": "top-1 probability", "entropy": "nats"}
# A cell of a ranking the model cannot give (BERT of a checkpoint without an MLM head): not 0.0.
NA = "n/a"
UNAVAILABLE_NOTES = {
    "bert": "BERT is n/a: the model has no masked-LM head, so there is no BERT ranking and BERT-kNN is kNN "
    "alone (λ=1)."
}


def write_report(
    result: MacroResult, out_dir: Path, meta: Mapping[str, Any] | None = None
) -> dict[str, Path]:
    """Write the report files of one evaluation into ``out_dir`` (created if needed).

    Args:
        result: what ``metrics.macro_average`` returned.
        out_dir: target folder; existing report files are overwritten.
        meta: settings to record with the numbers (config, data paths, model), JSON-serialisable.

    Returns:
        name -> path: "json", "markdown", "plot", "popularity_plot" when facts had a popularity, and
        "reliability" (the reliability diagram of the answers' confidence) when answers had neighbours.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "results.json",
        "markdown": out_dir / "results.md",
        "plot": out_dir / "results.png",
    }
    payload = {"meta": dict(meta or {}), **dataclasses.asdict(result)}
    # A model the run could not rank with (``meta["unavailable_models"]``) is absent from every number
    # in results.json, and shown as "n/a" in the Markdown and noted on the plots.
    unavailable = list(payload["meta"].get("unavailable_models") or [])
    paths["json"].write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    text = render_markdown(result, unavailable)
    if meta and meta.get("adaptive"):
        text += "\n" + render_adaptive(meta["adaptive"])
    conf = (meta or {}).get("confidence")
    if conf:
        text += "\n" + render_confidence(conf)
        paths["reliability"] = out_dir / "reliability.png"
        title = "BERT-kNN's answers: share right per bin of p"
        plot_reliability(conf["reliability"], conf["ece"], paths["reliability"], title)
    paths["markdown"].write_text(text, encoding="utf-8")
    plot_precision(result, paths["plot"], unavailable)
    if result.popularity:
        paths["popularity_plot"] = out_dir / "popularity.png"
        plot_popularity(result.popularity, paths["popularity_plot"], unavailable)
    return paths


def unavailable_note(unavailable: Sequence[str]) -> str:
    """Why the models in ``unavailable`` have no numbers, in one sentence each ("" when none)."""
    return " ".join(UNAVAILABLE_NOTES.get(m, f"{label(m)} is n/a for this model.") for m in unavailable)


def _shown(models: Sequence[str], unavailable: Sequence[str]) -> list[str]:
    """The table's model columns: the unavailable ones (BERT, first in the paper's order) kept as n/a."""
    return [*(m for m in unavailable if m not in models), *models]


def label(model: str) -> str:
    return LABELS.get(model, model)


def pct(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{100 * value:.1f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], text_columns: int = 1) -> list[str]:
    align = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    return [f"| {' | '.join(header)} |", f"| {' | '.join(align)} |"] + [f"| {' | '.join(r)} |" for r in rows]


def _p(score: Score, model: str, k: int) -> str:
    if model not in score.precision:
        return NA if score.precision else "–"
    return pct(score.precision[model][k])


def _precision_rows(
    scores: Sequence[Score], models: Sequence[str], k: int, bold: bool = False
) -> list[list[str]]:
    rows = []
    for s in scores:
        name = f"**{s.name}** ({s.corpus})" if bold else s.name
        cells = [_p(s, m, k) for m in models]
        rows.append([name, str(s.relations), f"{s.scored}/{s.facts}", *cells])
    return rows


def render_markdown(result: MacroResult, unavailable: Sequence[str] = ()) -> str:
    """The report as Markdown: P@k tables per corpus, skipped facts, per-relation P@1, popularity buckets.

    Args:
        result: the scores.
        unavailable: models the run could not rank with (BERT without an MLM head): columns of "n/a".
    """
    models = _shown(result.models, unavailable)
    lines = ["# BERT-kNN evaluation", ""]
    lines += [
        "Mean P@k in %: averaged over the facts of each relation, then over relations (LAMA's convention). "
        "Facts scored / read: facts whose answer is not one token, or whose IR step found no context, are "
        "left out and listed under *Skipped facts*.",
        "",
    ]
    if unavailable:
        lines += [unavailable_note(unavailable), ""]
    for k in result.ks:
        lines += [f"## P@{k}", ""]
        header = ["Corpus", "Relations", "Facts scored", *(label(m) for m in models)]
        rows = _precision_rows(result.corpora, models, k) + _precision_rows(
            result.aggregates, models, k, True
        )
        lines += [*table(header, rows), ""]
    lines += ["## Skipped facts", ""]
    # No-article facts have their own column, whether they were skipped or scored as wrong.
    reasons = sorted({r for s in result.relations for r in s.skipped} - {NO_ARTICLE})
    header = ["Corpus", "Relation", "Facts", "Scored", "No article", *reasons]
    rows = [
        [
            s.corpus,
            s.name,
            str(s.facts),
            str(s.scored),
            str(s.no_article),
            *(str(s.skipped.get(r, 0)) for r in reasons),
        ]
        for s in result.relations
    ]
    lines += [*table(header, rows, 2), ""]
    first = result.ks[0]
    lines += [f"## Per relation, P@{first}", ""]
    header = ["Corpus", "Relation", "Facts scored", *(label(m) for m in models)]
    rows = [
        [
            s.corpus,
            s.name,
            f"{s.scored}/{s.facts}",
            *(_p(s, m, first) for m in models),
        ]
        for s in result.relations
    ]
    lines += [*table(header, rows, 2), ""]
    if result.popularity:
        lines += ["## P@1 by subject popularity", ""]
        lines += ["Buckets: the 10-bin histogram edges of log(popularity) (natural log), as in PopQA.", ""]
        header = ["log popularity", "Facts", *(label(m) for m in models)]
        rows = [
            [f"[{b.low:.2f}, {b.high:.2f}{']' if i == len(result.popularity) - 1 else ')'}", str(b.facts)]
            + [NA if m in unavailable else pct(b.precision.get(m)) for m in models]
            for i, b in enumerate(result.popularity)
        ]
        lines += [*table(header, rows), ""]
    return "\n".join(lines)


def render_adaptive(adaptive: Mapping[str, Any]) -> str:
    """Adaptive retrieval: per gate, the share of facts that retrieved and the time it saves; per
    relation, each gate's threshold and share (PopQA's Figure 10)."""
    signals = list(adaptive)
    lines = ["## Adaptive retrieval", ""]
    lines += [
        "A question retrieves (IR and kNN run) only where its gate says so: popularity or BERT's top-1"
        " probability below the relation's threshold, or p_BERT's entropy above it (thresholds from"
        " `eval grid`, the relation's or else `*`). Elsewhere the answer is BERT's. IR + kNN time: what"
        " those stages took for every scored fact in this run, and the part the gate skips.",
        "",
    ]
    header = ["Gate", "Facts", "Retrieved (%)", "IR + kNN s", "Saved s", "Saved (%)"]
    rows = []
    for signal, g in adaptive.items():
        total, saved = g["seconds_retrieval"], g["seconds_saved"]
        name = f"{signal}{' (--gate)' if g['chosen'] else ''}"
        share = pct(saved / total) if total else "–"
        rows.append([name, str(g["facts"]), pct(g["retrieved"]), f"{total:.2f}", f"{saved:.2f}", share])
    lines += [*table(header, rows), ""]
    relations = list(dict.fromkeys(r for g in adaptive.values() for r in g["relations"]))
    header = ["Relation", "Facts"]
    for signal in signals:
        header += [f"{signal} threshold ({SIGNAL_UNITS[signal]})", f"{signal} retrieved (%)"]
    rows = []
    for relation in relations:
        found = [adaptive[s]["relations"].get(relation) for s in signals]
        row = [relation, str(max((f["facts"] for f in found if f), default=0))]
        for signal, f in zip(signals, found):
            if f is None or f["threshold"] is None:
                row += ["–", pct(None if f is None else f["retrieved"])]
            else:
                row += [_threshold(signal, f["threshold"]), pct(f["retrieved"])]
        rows.append(row)
    lines += [*table(header, rows), ""]
    return "\n".join(lines)


def _threshold(signal: str, value: float) -> str:
    """The threshold, or what it means when it lies past any value: retrieve always, or never."""
    oriented = value if signal != "entropy" else -value  # entropy retrieves above its threshold
    return "always" if oriented >= 1e9 else "never" if oriented <= -1e9 else f"{value:.3g}"


def plot_precision(result: MacroResult, path: Path, unavailable: Sequence[str] = ()) -> None:
    """Grouped bars like the paper's Figure 2: one panel per corpus, groups P@k, one bar per model.

    A model in ``unavailable`` has no bar; a line above the panels says why.
    """
    from matplotlib.figure import Figure  # imported here: matplotlib is slow to import

    panels = [s for s in [*result.corpora, *result.aggregates] if s.precision]
    fig = Figure(figsize=(4 * max(len(panels), 1), 3.6), layout="constrained")
    if unavailable:
        fig.suptitle(_plot_note(unavailable), fontsize=8)
    axes = fig.subplots(1, max(len(panels), 1), squeeze=False)[0]
    if not panels:
        axes[0].text(0.5, 0.5, "no scored facts", ha="center", va="center")
        axes[0].set_axis_off()
    width = 0.8 / len(result.models)
    for ax, score in zip(axes, panels):
        for i, model in enumerate(result.models):
            xs = [j + (i - (len(result.models) - 1) / 2) * width for j in range(len(result.ks))]
            heights = [100 * score.precision[model][k] for k in result.ks]
            ax.bar(xs, heights, width, label=label(model), color=COLORS.get(model, f"C{3 + i}"))
        ax.set_xticks(range(len(result.ks)), [f"P@{k}" for k in result.ks])
        ax.set_ylim(0, 100)
        ax.set_title(f"{score.name} ({score.relations} rel., {score.scored} facts)", fontsize=9)
    axes[0].set_ylabel("mean P@k (%)")
    if panels:
        axes[0].legend(fontsize=8)
    fig.savefig(path, dpi=120)


def _plot_note(unavailable: Sequence[str]) -> str:
    names = ", ".join(label(m) for m in unavailable)
    if list(unavailable) == ["bert"]:
        return f"{names}: n/a (the model has no masked-LM head; BERT-kNN is kNN alone)"
    return f"{names}: n/a for this model"


def plot_popularity(buckets: Sequence[Bucket], path: Path, unavailable: Sequence[str] = ()) -> None:
    """P@1 per log-popularity bucket, parametric BERT against BERT-kNN (PopQA's Figure-style analysis)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.6), layout="constrained")
    if unavailable:
        fig.suptitle(_plot_note(unavailable), fontsize=8)
    ax = fig.subplots()
    models = [m for m in POPULARITY_MODELS if any(m in b.precision for b in buckets)]
    width = 0.8 / max(len(models), 1)
    for i, model in enumerate(models):
        xs = [j + (i - (len(models) - 1) / 2) * width for j in range(len(buckets))]
        heights = [100 * b.precision.get(model, 0.0) for b in buckets]
        ax.bar(xs, heights, width, label=label(model), color=COLORS.get(model, f"C{3 + i}"))
    ax.set_xticks(range(len(buckets)), [f"{b.low:.1f}\n({b.facts})" for b in buckets], fontsize=7)
    ax.set_xlabel("log popularity, bucket start (facts)")
    ax.set_ylabel("P@1 (%)")
    ax.set_ylim(0, 100)
    if models:
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)


def render_confidence(conf: Mapping[str, Any]) -> str:
    """Confidence of this run's BERT-kNN answers: ECE and AUROC of ``p``, P@1 per band."""
    lines = ["## Confidence", ""]
    lines += [
        "`p` is each answer's estimated probability of being right (the confidence fit in use:"
        f" {conf['fit']}). ECE: the answers' weighted gap between mean `p` and the share right, over"
        " 10 bins of `p` (reliability.png); AUROC: how often a right answer's `p` beats a wrong one's.",
        "",
    ]
    rows = [
        [str(conf["answers"]), pct(conf["P@1"]), pct(conf["mean_p"]), _num(conf["ece"]), _num(conf["auroc"])]
    ]
    lines += [*table(["Answers", "P@1", "Mean p (%)", "ECE", "AUROC"], rows, 0), ""]
    header = ["Band", "Answers", "P@1"]
    rows = [
        [name, str(b["answers"]), pct(b["P@1"])] for name, b in conf["bands"].items() if isinstance(b, dict)
    ]
    lines += [*table(header, rows), ""]
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def plot_reliability(bins: Sequence[Mapping[str, Any]], ece: float | None, path: Path, title: str) -> Path:
    """A reliability diagram: share right against mean ``p`` per bin (the diagonal is perfect), the
    answers per bin below (``reliability.reliability``'s table)."""
    from matplotlib.figure import Figure  # imported here: matplotlib is slow to import

    fig = Figure(figsize=(4.6, 5.2), layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=(3, 1), sharex=True)
    top.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1, label="perfect")
    if bins:
        top.plot([b["mean_p"] for b in bins], [b["right"] for b in bins], "o-", color="C2", label="answers")
        centres = [(b["low"] + b["high"]) / 2 for b in bins]
        bottom.bar(centres, [b["answers"] for b in bins], width=0.09, color="C0")
    answers = sum(b["answers"] for b in bins)
    top.set_title(f"{title}\nECE {_num(ece)}, {answers:,} answers", fontsize=9)
    top.set_ylabel("share right")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.legend(fontsize=8, loc="upper left")
    bottom.set_xlabel("p (confidence)")
    bottom.set_ylabel("answers")
    fig.savefig(path, dpi=110)
    return path


def render_calibration(check: Mapping[str, Any], stored: Path | None) -> str:
    """``eval calibrate``'s report: the fit's check on left-out relations, overall, per kind of relation
    and per relation (``calibration.calibrate``'s second value)."""
    bands = check["bands"]
    lines = ["# Confidence calibration", ""]
    lines += [
        f"`p` fitted by {check['method']}, on {', '.join(check['features'])}. Every number below is of"
        " left-out `p`: each relation's answers scored by a fit that never saw that relation. Bands:"
        f" high at p >= {bands['high']:.2f} with {bands['high_needs_votes']} votes or more, medium at"
        f" p >= {bands['medium']:.2f}, low below (reliability-left-out.png).",
        "",
    ]
    if bands.get("never_low"):
        # a model without an MLM head cannot tell a question that wants a date: docs/evaluation.md
        lines += [f"Never low: answers that are a {' or a '.join(bands['never_low'])}.", ""]
    if bands.get("checked_on"):
        # how the cuts were chosen: what each band promises, and on which left-out answers it was checked
        per_kind = bands.get("low_checked_per_kind_from")
        kinds = f", in each kind with {per_kind} answers or more under it" if per_kind else ""
        lines += [
            f'The cuts were checked on {bands["checked_on"]}: "high" raised until its answers were'
            ' right at least half the time, "low" lowered until its answers were right at most 1 time'
            f" in 20{kinds}.",
            "",
        ]
    if stored is not None:
        lines += [f"Stored in {stored}: query, serve and eval over this index use it.", ""]
    decision = check.get("stored") or {}
    if decision.get("why"):
        verdict = "stored" if decision.get("stored") else "not stored (--force stores it anyway)"
        lines += [f"Against the fit in use: {decision['why']}: {verdict}.", ""]
    header = ["", "Relations", "Answers", "P@1", "AUROC", "ECE", "high", "medium", "low", "high ÷ low"]
    rows = [_calibration_row("**all**", len(check["relations"]), check["left_out"])]
    rows += [_calibration_row(name, len(k["relations"]), k) for name, k in check["kinds"].items()]
    rows += [_calibration_row(f"{rel} ({r['kind']})", 1, r) for rel, r in check["relations"].items()]
    lines += [*table(header, rows), ""]
    if check.get("kinds_left_out"):  # each kind's answers scored by a fit that saw no relation of it
        lines += ["Whole kinds left out:", ""]
        kinds = check["kinds_left_out"]
        rows = [_calibration_row("**all**" if k == "all" else k, 0, v) for k, v in kinds.items()]
        # the ECE a perfectly calibrated p shows on so few answers by chance (eval.sampling.ece_floor)
        floors = [_floor((v.get("chance") or {}).get("ece_floor")) for v in kinds.values()]
        rows = [[*row[:6], floor, *row[6:]] for row, floor in zip(rows, floors)]
        lines += [*table([*header[:6], "ECE by chance", *header[6:]], rows), ""]
        lines += [
            "ECE by chance: the median and 95th percentile of the ECE of outcomes drawn from each"
            " answer's own p (a perfectly calibrated p on these answers); an ECE above the second is a"
            " real miss.",
            "",
        ]
    lines += ["P@1 per band in %, its answers in brackets.", ""]
    return "\n".join(lines)


def _floor(floor: Mapping[str, Any] | None) -> str:
    if not floor or floor.get("median") is None:
        return "–"
    return f"{_num(floor['median'])} ({_num(floor['p95'])})"


def _calibration_row(name: str, relations: int, s: Mapping[str, Any]) -> list[str]:
    b = s["bands"]
    cells = [f"{pct(b[n]['P@1'])} ({b[n]['answers']})" for n in ("high", "medium", "low")]
    ratio = "–" if b.get("high_over_low") is None else f"{b['high_over_low']:.1f}"
    return [
        name,
        str(relations),
        str(s["answers"]),
        pct(s["P@1"]),
        _num(s["auroc"]),
        _num(s["ece"]),
        *cells,
        ratio,
    ]
