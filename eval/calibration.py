"""Confidence calibration: answered facts -> a logistic fit of ``p`` -> its check on left-out relations.

An evaluation (``harness.evaluate``) records each scored fact's confidence signals and whether its top
answer is right. ``calibrate`` fits ``p`` on those answers (``confidence.Fit``) and checks it the way it is
used: each relation's answers are scored by a fit made without any fact of that relation (never a
random split of facts, whose relations the fit would have seen), and the bands' thresholds are chosen on
those left-out scores. ``eval calibrate`` and ``benchmarks/bench_confidence.py`` run it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertknn_search.eval.reliability import BINS, auc, ece, reliability
from bertknn_search.eval.sampling import chance
from bertknn_search.query.answer_kinds import KindSignals, kind_of
from bertknn_search.query.confidence import (
    ANSWER_FEATURES,
    LEVELS,
    MIN_HIGH_VOTES,
    Fit,
    Signals,
    inputs,
    no_vote_p,
)
from bertknn_search.query.signals_json import signals_from_json
from bertknn_search.query.word_frequency import zipf

DEFAULT_FEATURES = ANSWER_FEATURES
MIN_BLOCK = 50  # answers per step of the isotonic curve at least: fewer would follow noise
L2 = 1.0  # ridge penalty on the standardised weights: keeps a small relation from swinging the fit
# Bands, on the probability scale (``choose_bands``), so that they mean the same for every fit: "low" is
# p below LOW_RIGHT at most, lowered until the left-out answers under it were right at most LOW_RIGHT of
# the time; "high" is p of HIGH_RIGHT at least, raised until the left-out answers at or above it (that may
# be "high": votes and kind) were right at least HIGH_RIGHT of the time.
LOW_RIGHT = 0.05
HIGH_RIGHT = 0.5
# "Low" must keep its promise in every kind left out too (issue 49), but only a kind that holds this many
# answers under the cut is checked alone: at 20, one right answer is 5% (1 in 20), within the promise,
# so a single answer never moves the cut; a kind with fewer is checked only with all the others.
MIN_LOW_KIND = round(1 / LOW_RIGHT)
# What a relation is about, for the per-kind numbers (LAMA T-REx; others count as "other").
KINDS: dict[str, tuple[str, ...]] = {
    "places": ("P19", "P20", "P937", "P159", "P740", "P131", "P276"),
    "countries": ("P27", "P495", "P17", "P1001", "P530"),
    "languages": ("P103", "P1412", "P407", "P364", "P37"),
    "professions, fields, offices": ("P106", "P101", "P39"),
    "organisations, owners, makers": ("P108", "P463", "P127", "P176", "P178", "P264", "P449"),
    "genres, instruments, positions": ("P136", "P1303", "P413"),
    # P569 (year of birth) and P0569 (month of birth, a made-up id) are built from T-REx evidences by
    # benchmarks/bench_confidence.py
    "dates": ("date_of_birth", "P569", "P0569", "P570", "P571", "P577"),
    "religion, names, types, parts": ("P140", "P138", "P31", "P527", "P279", "P361"),
}


def kind(relation: str) -> str:
    """The kind of answers ``relation`` asks for ("places", ...; "other" when not listed)."""
    return next((name for name, members in KINDS.items() if relation in members), "other")


@dataclass(frozen=True)
class Measured:
    """One answered fact: its relation, its confidence signals, whether its top answer is right."""

    key: str
    relation: str
    signals: Signals
    hit: bool


def logistic(x: np.ndarray, y: np.ndarray, l2: float = L2, steps: int = 50) -> tuple[np.ndarray, float]:
    """Weights and intercept of a ridge-penalised logistic regression (Newton's method; the intercept is
    not penalised)."""
    n, d = x.shape
    design = np.hstack([x, np.ones((n, 1))])
    w = np.zeros(d + 1)
    penalty = np.full(d + 1, l2)
    penalty[-1] = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ w, -40.0, 40.0)))
        grad = design.T @ (p - y) + penalty * w
        hess = (design * (p * (1 - p))[:, None]).T @ design + np.diag(penalty) + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w[:-1], float(w[-1])


def fit(
    rows: Sequence[Measured],
    features: Sequence[str] = DEFAULT_FEATURES,
    bands: tuple[float, float] = (1.0, 0.0),
    about: Mapping[str, Any] | None = None,
    never_low: Sequence[str] = (),
) -> Fit:
    """A fit of ``p`` on ``rows`` (answers with neighbours), with the given (high, medium) thresholds.

    The regression is fitted on the answers it scores: an answer no neighbour votes for gets
    ``no_vote_p`` (BERT's probability, discounted by what the neighbours saw) whatever the fit, so it
    is left out of the regression, whose weights it would only bend.

    Raises:
        ValueError: no answer, or all right or all wrong (nothing to fit).
    """
    rows = regressed(rows)
    hits = np.array([r.hit for r in rows], dtype=np.float64)
    if not len(rows) or hits.min() == hits.max():
        raise ValueError("a fit needs right and wrong answers")
    x = inputs(features, [r.signals for r in rows])
    # An input may be unknown (NaN: no MLM head) in some answers or all: it is fitted at its mean.
    known = ~np.isnan(x)
    counted = np.maximum(known.sum(axis=0), 1)  # a never-known input: mean 0 (0 / 1), then weight 0
    mean = np.where(known, x, 0.0).sum(axis=0) / counted
    x = np.where(known, x, mean)
    scale = np.sqrt(((x - mean) ** 2).sum(axis=0) / counted)  # over the known values only
    scale[scale < 1e-6] = 1.0  # a constant feature (no partial answer in the data) gets weight 0
    coef, intercept = logistic((x - mean) / scale, hits)
    line = Fit(
        tuple(features),
        tuple(mean.round(6).tolist()),
        tuple(scale.round(6).tolist()),
        tuple(coef.round(6).tolist()),
        round(intercept, 6),
        bands[0],
        bands[1],
        dict(about or {}),
        never_low=tuple(never_low),
    )
    lower, upper = tuple(x.min(axis=0).round(6).tolist()), tuple(x.max(axis=0).round(6).tolist())
    line = dataclasses.replace(line, lower=lower, upper=upper)
    raw_p = line.probability([r.signals for r in rows])
    return dataclasses.replace(line, curve=isotonic(raw_p, hits))


def regressed(rows: Sequence[Measured]) -> list[Measured]:
    """The answers the regression scores (and is fitted on): those some neighbour votes for."""
    return [r for r in rows if no_vote_p(r.signals) is None]


def isotonic(p: np.ndarray, hits: np.ndarray, min_block: int = MIN_BLOCK) -> tuple[tuple[float, float], ...]:
    """Rising (p, share right) points that fit ``hits`` best for the order of ``p`` (pool adjacent
    violators, blocks of at least ``min_block`` answers), one at each block's mean ``p``, with the ends
    at 0 and 1 so that every ``p`` maps."""
    order = np.argsort(p, kind="stable")
    xs, ys = p[order], hits[order]
    blocks: list[list[float]] = []  # [sum p, sum hits, answers]
    for start in range(0, len(xs), min_block):
        blocks.append(
            [
                float(xs[start : start + min_block].sum()),
                float(ys[start : start + min_block].sum()),
                float(len(xs[start : start + min_block])),
            ]
        )
        while len(blocks) > 1 and _rate(blocks[-2]) >= _rate(blocks[-1]):
            last = blocks.pop()
            blocks[-1] = [a + b for a, b in zip(blocks[-1], last)]
    points = [(round(b[0] / b[2], 6), round(_rate(b), 6)) for b in blocks]
    first, last = points[0][1], points[-1][1]
    return ((0.0, first), *points, (1.0, last))


def _rate(block: Sequence[float]) -> float:
    """A block's share right, with half a right answer added: none right says rare, not impossible."""
    return (block[1] + 0.5) / (block[2] + 1)


def left_out_fits(rows: Sequence[Measured], features: Sequence[str] = DEFAULT_FEATURES) -> dict[str, Fit]:
    """Per relation, a fit made without any answer of that relation."""
    relations = sorted({r.relation for r in rows})
    fits = {}
    for rel in relations:
        rest = [r for r in rows if r.relation != rel]
        if len(hits := {r.hit for r in regressed(rest)}) < 2:
            right = "right" if True in hits else "wrong"
            raise ValueError(
                f"without relation {rel}, every answer is {right}: nothing to fit; name more facts"
            )
        fits[rel] = fit(rest, features)
    return fits


def left_out(rows: Sequence[Measured], features: Sequence[str] = DEFAULT_FEATURES) -> np.ndarray:
    """Each answer's ``p`` from a fit made without any answer of its relation."""
    fits = left_out_fits(rows, features)
    return np.array([float(fits[r.relation].probability([r.signals])[0]) for r in rows])


def kinds_left_out(
    rows: Sequence[Measured], features: Sequence[str] = DEFAULT_FEATURES
) -> tuple[np.ndarray, dict[str, Fit]]:
    """Each answer's ``p`` from a fit made without any answer of its relation's kind (``kind``): what
    ``p`` says about a kind of relation it never saw. Returns the p and the fit per kind.

    Raises:
        ValueError: one kind only, or without some kind nothing right or nothing wrong is left.
    """
    names = sorted({kind(r.relation) for r in rows})
    if len(names) < 2:
        raise ValueError("leaving kinds out needs relations of two kinds or more")
    fits: dict[str, Fit] = {}
    for name in names:
        rest = [r for r in rows if kind(r.relation) != name]
        if len({r.hit for r in regressed(rest)}) < 2:
            raise ValueError(f"without the kind {name}, every answer is right or every one wrong")
        fits[name] = fit(rest, features)
    p = np.array([float(fits[kind(r.relation)].probability([r.signals])[0]) for r in rows])
    return p, fits


def choose_bands(
    p: Sequence[float],
    hits: Sequence[bool],
    eligible: Sequence[bool] | None = None,
    low_right: float = LOW_RIGHT,
    high_right: float = HIGH_RIGHT,
    groups: Sequence[str] | None = None,
    min_group: int = MIN_LOW_KIND,
) -> tuple[float, float]:
    """Thresholds (high, medium) on left-out ``p``, on a grid of 0.01.

    ``p`` is calibrated, so a band is first a probability: "low" is p < ``low_right`` (an answer's own
    p says it is right at most that often) and "high" p >= ``high_right`` (at least as likely right as
    wrong). The left-out answers then check the promise: "medium" (the top of "low") is lowered until
    the answers under it were right at most ``low_right`` of the time — all of them, and, with
    ``groups`` (each answer's kind of relation), those of every kind that holds ``min_group`` answers
    or more under the cut — and "high" raised until the answers at or above it that may be "high"
    (``eligible``: enough votes, the neighbours' kind) were right at least ``high_right`` of the time.
    A strong model's "low" may thus hold few answers and a weak one's "high" few: that is what they
    are worth.
    """
    pv = np.asarray(p, dtype=np.float64)
    hv = np.asarray(hits, dtype=bool)
    ev = np.ones(len(pv), dtype=bool) if eligible is None else np.asarray(eligible, dtype=bool)
    gv = np.asarray(groups if groups is not None else [""] * len(pv), dtype=object)
    grid = np.round(np.arange(0, 101) / 100, 2)
    medium = 0.0
    for cut in grid[grid <= low_right][::-1]:
        under = pv < cut
        kinds = [under & (gv == g) for g in set(gv[under].tolist())] if groups is not None else []
        checked = [under, *(mine for mine in kinds if mine.sum() >= min_group)]
        if all(not mine.any() or hv[mine].mean() <= low_right for mine in checked):
            medium = float(cut)
            break
    high = 1.0
    for cut in grid[grid >= max(high_right, medium)]:
        over = (pv >= cut) & ev
        if not over.any() or hv[over].mean() >= high_right:
            high = float(cut)
            break
    return high, medium


def band_table(levels: Sequence[str], hits: Sequence[bool]) -> dict[str, Any]:
    """Per band (each answer's ``Fit.level``): answers, right answers and P@1 (None: empty)."""
    table: dict[str, Any] = {}
    for name in reversed(LEVELS):
        chosen = [h for lv, h in zip(levels, hits) if lv == name]
        table[name] = {
            "answers": len(chosen),
            "hits": int(sum(chosen)),
            "P@1": round(sum(chosen) / len(chosen), 4) if chosen else None,
        }
    p_high, p_low = table["high"]["P@1"], table["low"]["P@1"]
    table["high_over_low"] = round(p_high / p_low, 2) if p_high is not None and p_low else None
    return table


def summary(rows: Sequence[Measured], p: Sequence[float], model: Fit) -> dict[str, Any]:
    """AUROC, ECE, P@1 per band and the single-vote "high" count of ``p`` over ``rows``."""
    hits = [r.hit for r in rows]
    votes = [r.signals.votes for r in rows]
    said = [r.signals for r in rows]
    levels = [model.level(float(x), s.votes, s.kind_agrees, kind=s.kind) for x, s in zip(p, said)]
    return {
        "answers": len(rows),
        "P@1": round(sum(hits) / len(hits), 4) if hits else None,
        "mean_p": round(float(np.mean(p)), 4) if len(rows) else None,
        "auroc": _round(auc(p, hits)),
        "ece": _round(ece(p, hits)),
        "bands": band_table(levels, hits),
        "high_on_one_vote": sum(lv == "high" and v < MIN_HIGH_VOTES for lv, v in zip(levels, votes)),
        "wrong_kind": sum(not r.signals.kind_agrees for r in rows),
        "wrong_kind_right": sum(r.hit and not r.signals.kind_agrees for r in rows),
        "high_of_wrong_kind": sum(lv == "high" and not r.signals.kind_agrees for lv, r in zip(levels, rows)),
    }


def summary_by_chance(rows: Sequence[Measured], p: Sequence[float], model: Fit) -> dict[str, Any]:
    """``summary``, and what chance allows on so few answers (``sampling.chance``: the ECE a perfectly
    calibrated ``p`` would show, the AUROC's and the bands' 95% intervals)."""
    out = summary(rows, p, model)
    return {**out, "chance": chance(p, [r.hit for r in rows], out["bands"], BINS)}


def by_kind(rows: Sequence[Measured], p: np.ndarray, model: Fit) -> dict[str, Any]:
    """``summary_by_chance`` of each kind of relation's answers (``kind``), in the kinds' order."""
    out: dict[str, Any] = {}
    for name in sorted({kind(r.relation) for r in rows}):
        mine = [i for i, r in enumerate(rows) if kind(r.relation) == name]
        out[name] = summary_by_chance([rows[i] for i in mine], p[mine], model)
    return out


def calibrate(
    rows: Sequence[Measured],
    features: Sequence[str] = DEFAULT_FEATURES,
    about: Mapping[str, Any] | None = None,
    never_low: Sequence[str] = (),
) -> tuple[Fit, dict[str, Any]]:
    """Fit ``p`` on all ``rows`` and check it on left-out relations (answers of a kind in ``never_low``
    are never "low": ``Fit.never_low``, and the "low" cut is chosen on the others).

    Returns:
        the fit (bands chosen on the left-out ``p`` of relations, and of kinds where there are two or
        more; ``about`` holds the check's headline numbers) and
        the check: overall, per relation and per kind of relation, each on left-out ``p``.

    Raises:
        ValueError: fewer than two relations, or no right or no wrong answer among the rows.
    """
    relations = sorted({r.relation for r in rows})
    if len(relations) < 2:
        raise ValueError("a fit checked on left-out relations needs facts of two relations or more")
    p = left_out(rows, features)
    # "High" is cut where whole answers' p lies (partial ones, in the fit to teach it what coverage means,
    # would pull it down to the starved answers' p), so that it means one thing everywhere; "low" is cut
    # on all answers, so that a partial answer that is "low" is mostly wrong too (BERT-kNN's partial
    # answers, whose BERT part sees the whole question, are right more often than their coverage says).
    whole = np.array([not r.signals.partial for r in rows])
    chosen = whole if whole.any() else np.ones(len(rows), dtype=bool)
    hits = np.array([r.hit for r in rows])
    eligible = np.array([r.signals.votes >= MIN_HIGH_VOTES and r.signals.kind_agrees for r in rows])
    # Each cut must keep its promise on relations left out and, where there are kinds of relation, on
    # whole kinds left out too (issue 49: "high" and "low" promise the same on a kind no fit saw).
    several_kinds = len({kind(r) for r in relations}) > 1
    p_kind = kinds_left_out(rows, features)[0] if several_kinds else None
    checks = [p] if p_kind is None else [p, p_kind]
    high = max(choose_bands(q[chosen], hits[chosen], eligible[chosen])[0] for q in checks)
    # "Low" on kinds left out holds in each kind that has enough answers under it (``MIN_LOW_KIND``).
    groups = [kind(r.relation) for r in rows]
    # the low cut only: which answers may be "high" (``eligible``) does not enter it
    may_be_low = np.array([r.signals.kind not in never_low for r in rows])
    lows = [
        choose_bands(
            q[may_be_low],
            hits[may_be_low],
            None,
            groups=[g for g, m in zip(groups, may_be_low) if m] if q is p_kind else None,
        )[1]
        for q in checks
    ]
    medium = min(*lows, high)
    check_model = fit(rows, features, (high, medium), never_low=never_low)
    report: dict[str, Any] = {
        "method": "a logistic regression mapped through an isotonic curve",
        "features": list(features),
        "bands": {
            "high": high,
            "medium": medium,
            "high_needs_votes": MIN_HIGH_VOTES,
            "low_checked_per_kind_from": MIN_LOW_KIND,
            "checked_on": "relations and kinds left out" if several_kinds else "relations left out",
            "never_low": list(never_low),
        },
        "left_out": summary_by_chance(rows, p, check_model),
        "reliability": reliability(p, [r.hit for r in rows]),
        "relations": {},
        "kinds": {},
    }
    for relation in relations:
        mine = [i for i, r in enumerate(rows) if r.relation == relation]
        report["relations"][relation] = {
            "kind": kind(relation),
            **summary([rows[i] for i in mine], p[mine], check_model),
        }
    for name, said in by_kind(rows, p, check_model).items():
        report["kinds"][name] = {
            "relations": sorted({r.relation for r in rows if kind(r.relation) == name}),
            **said,
        }
    if p_kind is not None:
        report["kinds_left_out"] = {
            "all": summary_by_chance(rows, p_kind, check_model),
            **by_kind(rows, p_kind, check_model),
        }
        report["reliability_kinds_left_out"] = reliability(p_kind, [r.hit for r in rows])
    head = report["left_out"]
    headline = {k: head[k] for k in ("answers", "P@1", "auroc", "ece")}
    info = {**dict(about or {}), "relations": relations, "left_out": headline}
    info["bands_P@1"] = {name: head["bands"][name]["P@1"] for name in reversed(LEVELS)}
    final = fit(rows, features, (high, medium), info, never_low)
    return final, report


def checkpoint_lines(path: Path) -> list[dict[str, Any]]:
    """An evaluation's checkpoint (``facts.jsonl``), a line a fact."""
    return [json.loads(t) for t in Path(path).read_text(encoding="utf-8").splitlines() if t.strip()]


def partial_answers(checkpoints: Iterable[Path]) -> list[Measured]:
    """The partial answers of budget runs' checkpoints, each keyed by its run's folder as well (the same
    fact answered under two budgets is two answers)."""
    return [
        dataclasses.replace(r, key=f"{r.key}#{Path(path).parent.name}")
        for path in checkpoints
        for r in from_lines(checkpoint_lines(path))
        if r.signals.partial
    ]


def from_lines(lines: Iterable[Mapping[str, Any]]) -> list[Measured]:
    """The answers an evaluation's checkpoint lines hold: scored facts with neighbours (their confidence
    signals recorded) and whether BERT-kNN's top answer is right."""
    out = []
    for line in lines:
        said = line.get("confidence_signals")
        ranks = line.get("ranks") or {}
        if not said or line.get("skipped") or "bert_knn" not in ranks:
            continue
        if "word_zipf" not in said:  # written before it was recorded: the line holds the top word
            words = (line.get("top") or {}).get("bert_knn") or []
            said = {**said, "word_zipf": zipf(words[0]) if words else None}
        out.append(Measured(line["key"], line["relation"], signals_from_json(said), ranks["bert_knn"] == 1))
    return out


# BERT's answer alone is read from its own top-1 probability and whether its kind is the neighbours'
# (``bert_alone_rows``): what an evaluation records of it.
BERT_ALONE_FEATURES = ("top1", "kind_agree")


def bert_alone_rows(lines: Iterable[Mapping[str, Any]]) -> list[Measured]:
    """BERT's own answers (no kNN) in an evaluation's checkpoint lines, as calibration rows: its top-1
    probability (the line's ``signals``), its top word's kind against the neighbours' majority kind,
    whether it is right; its votes are BERT-kNN's where both put the same word first, else unknown (0:
    such an answer counts as one that may not be "high"). Lines of a model without an MLM head hold none.
    """
    out = []
    for line in lines:
        ranks = line.get("ranks") or {}
        top1 = (line.get("signals") or {}).get("top1")
        words = (line.get("top") or {}).get("bert") or []
        if line.get("skipped") or "bert" not in ranks or top1 is None or not words:
            continue
        said = line.get("confidence_signals") or {}
        mine = kind_of(words[0])
        same = bool(said) and words[0] == ((line.get("top") or {}).get("bert_knn") or [None])[0]
        n = int(line.get("neighbors") or 0)
        found = Signals(
            top1=float(top1),
            margin=0.0,
            votes=int(said.get("votes", 0)) if same else 0,
            neighbors=n,
            near_votes=0.0,
            agree=False,
            distinct=0.0,
            nearest=math.inf,
            contexts=n,
            coverage=float(said.get("coverage", 1.0)),
            # no bert_p: the votes here may be unknown (0), which ``no_vote_p`` would read as none
            kinds=KindSignals(mine, str(said.get("majority", mine))),
        )
        out.append(Measured(line["key"], line["relation"], found, ranks["bert"] == 1))
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
