"""``eval calibrate`` on an index: fit ``p`` on an evaluation's answers (``calibration.calibrate``), and
store the fit with the index only where it checks no worse than the fit in use."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bertknn_search.errors import ConfigError
from bertknn_search.eval.calibration import (
    DEFAULT_FEATURES,
    Measured,
    calibrate,
    checkpoint_lines,
    from_lines,
)
from bertknn_search.eval.reliability import auc, ece
from bertknn_search.eval.report import plot_reliability, render_calibration
from bertknn_search.query.confidence import FIT_FILE, HARDNESS_FEATURES, WORD_FEATURES, Fit

# Kinds of answer kNN alone cannot tell a question wants: with all-MiniLM-L6-v2 (no MLM head), years and
# months to date questions were right 19 times in 44, most though their neighbours mostly held words, and
# nothing in the answer's signals (nor the kinds of its neighbours across the whole index) told them from
# years and months to other questions, right 0 times in 98 (issue 49; docs/evaluation.md#confidence).
# Such an answer's low ``p`` is no promise, so it is never "low" for a model without an MLM head.
NO_HEAD_NEVER_LOW = ("year", "month")

# What a stored fit needs (issue 51.4): fewer answers or relations fit noise (3 relations x 15 facts gave
# a left-out AUROC of 0.5 and bands that made every later answer "low").
MIN_ANSWERS = 300
MIN_RELATIONS = 5


def judge_new_fit(
    rows: Sequence[Measured], check: Mapping[str, Any], current: Fit, current_name: str
) -> tuple[bool, str]:
    """Whether a new fit may replace ``current``: enough answers and relations, and its left-out AUROC
    and ECE not worse (to 3 decimals) than ``current``'s on the same answers. Returns (keep, why)."""
    relations = len({r.relation for r in rows})
    if len(rows) < MIN_ANSWERS or relations < MIN_RELATIONS:
        return False, (
            f"{len(rows):,} answers of {relations} relation(s); a stored fit needs {MIN_ANSWERS:,} answers"
            f" of {MIN_RELATIONS} relations or more"
        )
    hits = [r.hit for r in rows]
    p_now = current.probability([r.signals for r in rows])
    now_auroc, now_ece = auc(p_now, hits), ece(p_now, hits)
    head = check["left_out"]
    new_auroc, new_ece = head["auroc"], head["ece"]
    if new_auroc is None or new_ece is None or now_auroc is None or now_ece is None:
        return False, "AUROC or ECE undefined (no right or no wrong answer)"
    said = (
        f"left-out AUROC {new_auroc:.3f}, ECE {new_ece:.3f}; the fit in use ({current_name}) on the same"
        f" answers: AUROC {now_auroc:.3f}, ECE {now_ece:.3f}"
    )
    better = round(new_auroc, 3) >= round(now_auroc, 3) and round(new_ece, 3) <= round(now_ece, 3)
    return better, said


def calibration_line(check: Mapping[str, Any], where: Path | None, out: Path, in_use: str) -> str:
    """``eval calibrate``'s last line: the left-out check, the bands and whether the fit was stored."""
    head, bands, decision = check["left_out"], check["bands"], check["stored"]
    kept = f"fit stored in {where}" if decision["stored"] else f"fit in {out} only (--no-store)"
    if where is not None and not decision["stored"]:
        kept = f"fit NOT stored ({decision['why']}); the index keeps {in_use}; --force stores it anyway"
    return (
        f"left-out relations: AUROC {head['auroc']}, ECE {head['ece']}; bands high p >= {bands['high']},"
        f" medium p >= {bands['medium']}; {kept}"
    )


def refit_features(current: Fit | None, with_head: bool = True) -> tuple[str, ...]:
    """The inputs of a new fit: every input of the answer's (``ANSWER_FEATURES``, those added since the
    fit in use was made included), how common a word the answer is where the model has no MLM head
    (``WORD_FEATURES``; a fit stored before it gains it; a model with a head never reads it, even where a
    shipped fit of a model without one is in use), and the hardness inputs the regression in use reads (a
    shipped fit chose them for its model and method: BERT-base's BERT-kNN fit reads the kNN's half);
    ``DEFAULT_FEATURES`` (and the word's) where no regression is in use."""
    base = DEFAULT_FEATURES if with_head else (*DEFAULT_FEATURES, *WORD_FEATURES)
    if current is not None and current.p_from == "fit" and current.features:
        return (*base, *(f for f in current.features if f not in base and f not in WORD_FEATURES))
    return base


def never_low_kinds(with_head: bool) -> tuple[str, ...]:
    """The answer kinds a new fit never calls "low" (``Fit.never_low``): ``NO_HEAD_NEVER_LOW`` for a model
    without an MLM head, none for one with a head (BERT tells a question that wants a date), whatever
    the fit in use (a model with a head answering by kNN alone falls back to MiniLM's shipped fit)."""
    return () if with_head else NO_HEAD_NEVER_LOW


def write_calibration(
    checkpoint: Path,
    out: Path,
    model: str,
    store_at: Path | None,
    current: tuple[Fit, str] | None = None,
    force: bool = False,
) -> tuple[Fit, dict[str, Any]]:
    """``eval calibrate`` after its evaluation: fit ``p`` on the checkpoint's answers, check it on left-out
    relations, write the report into ``out`` and store the fit at ``store_at`` (None: only in ``out``)
    when ``judge_new_fit`` keeps it over ``current`` (the fit in use and its name), or with ``force``.
    The check's ``stored`` says whether it was stored and why.

    Raises:
        ConfigError: answers of fewer than two relations, or none right or none wrong.
    """
    rows = from_lines(checkpoint_lines(checkpoint))
    relations = sorted({r.relation for r in rows})
    if len(relations) < 2 or len({r.hit for r in rows}) < 2:
        raise ConfigError(
            "a fit checked on left-out relations needs answers of two relations or more, right and wrong;"
            f" {len(rows):,} answers of {len(relations)} relation(s) here: name more facts"
        )
    has_head = any(r.signals.bert_p is not None for r in rows)  # the model has an MLM head
    features = refit_features(current[0] if current else None, has_head)
    # BERT's ratio reads BERT's top-1 probability, recorded with the hardness signals
    with_head = "log_bert_ratio" in features and has_head
    if set(features) & set(HARDNESS_FEATURES) or with_head:
        # an answer with neighbours always has a kNN entropy since the hardness signals were recorded:
        # lines written before them (a checkpoint resumed across the change) would enter the fit as 0
        recorded = {r.signals.hard.knn_entropy is not None for r in rows if r.signals.neighbors}
        if len(recorded) > 1:
            raise ConfigError(
                f"{checkpoint} mixes answers recorded with and without the question's hardness signals"
                " (a run resumed across versions): evaluate again into a new --out to calibrate"
            )
    about = {"model": model, "stored": f"fitted by eval calibrate on {len(rows):,} answers ({out})"}
    try:
        fit, check = calibrate(rows, features, about, never_low_kinds(has_head))
    except ValueError as exc:
        raise ConfigError(f"cannot fit confidence: {exc}") from None
    keep, why = judge_new_fit(rows, check, *current) if current is not None else (True, "no fit in use")
    stored = store_at is not None and (keep or force)
    check["stored"] = {"stored": stored, "at": str(store_at) if stored else None, "why": why, "forced": force}
    if stored and store_at is not None:
        store_at.parent.mkdir(parents=True, exist_ok=True)
        fit.save(store_at)
    fit.save(out / FIT_FILE)
    head = check["left_out"]
    plot_reliability(
        check["reliability"], head["ece"], out / "reliability-left-out.png", "p, relations left out"
    )
    report = {"fit": fit.as_json(), "check": check}
    (out / "calibration.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "calibration.md").write_text(
        render_calibration(check, store_at if stored else None), encoding="utf-8"
    )
    return fit, check
