"""How sure an answer is: an answer's signals -> ``p``, the estimated probability that its top answer is
right, and a band ("high", "medium", "low") that cuts ``p``.

``p`` is a logistic regression over the signals an answer already has (its votes and neighbours, the
nearest neighbours' agreement, the top-1 probability and margin, how much of its articles it saw, its
kind against its neighbours', with an MLM head how far under BERT's own first choice the answer is,
without one how common a word it is: ``word_frequency``) and, for BERT-base's BERT-kNN fit, how hard
the question is (the kNN's entropy, the neighbours' distances and spread: ``hardness``), mapped through
an isotonic curve to the share of such answers that were right; a kind of answer the fit cannot judge
(a year or a month without an MLM head: ``Fit.never_low``) is never "low". The
shipped fits (``SHIPPED``: all-MiniLM-L6-v2's kNN answers, BERT-base's BERT-kNN and BERT-alone answers)
were fitted by ``benchmarks/bench_confidence.py`` on the LAMA T-REx relations in ``../shared/data`` and
date relations built from their evidences, checked on whole relations and whole kinds of relation left
out (``docs/evaluation.md#confidence``). ``eval calibrate`` fits
them again for another model or corpus and stores the fit in the index folder (``FIT_FILE``), where the
Searcher reads it.

An answer without neighbours (no article found, or the adaptive gate skipped retrieval) is BERT's alone:
its ``p`` is BERT's top-1 probability, as for an index answering by BERT alone (checked on BERT-base's
answers: ``confidence_fit_bert.json``), and never "high" (no votes). An answer that has neighbours but
no vote (BERT put it first, none of the neighbours holds it) is BERT's alone too, but the neighbours'
silence says something: ``no_vote_p`` discounts BERT's probability by the share of the articles the
neighbours saw (issue 49).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from bertknn_search.errors import ConfigError
from bertknn_search.query.answer_kinds import KINDS, KindSignals
from bertknn_search.query.fit_files import check_fit_json, parse_fit_json, read_fit_json, what_to_do
from bertknn_search.query.hardness import Hardness
from bertknn_search.query.word_frequency import above_common
from bertknn_search.records import Confidence, Coverage, Neighbors, Prediction

LEVELS = ("low", "medium", "high")
NEAR = 10  # the nearest neighbours ``near_votes`` counts
MIN_HIGH_VOTES = 2  # one neighbour holding the answer is never "high", whatever p says
FIT_FILE = "confidence-fit.json"  # in the index folder: the fit ``eval calibrate`` stored
FIT_FORMAT = 1
P_FROM = ("fit", "top1")  # where a fit's p comes from (``Fit.p_from``)


@dataclass(frozen=True)
class Signals:
    """What an answer's confidence is read from.

    Attributes:
        top1: probability of the top answer (BERT-kNN's ranking).
        margin: top1 minus the second answer's probability.
        votes: neighbours whose value is the top answer.
        neighbors: how many neighbours the answer had.
        near_votes: share of the ``NEAR`` nearest neighbours that hold the top answer.
        agree: whether the nearest neighbour holds the top answer.
        distinct: distinct values among the neighbours, over their number (0 without neighbours).
        nearest: squared distance of the nearest neighbour (inf without neighbours).
        contexts: contexts the searched articles hold (encoded or not; ``neighbors`` where unknown).
        coverage: share of those contexts the answer could see (1: whole articles).
        kinds: the answer's kind against its neighbours' (``answer_kinds.KindSignals``; "word" for all in
            checkpoints written before they were recorded). Its fields read as ``kind``, ``majority``,
            ``kind_share``, ``bert_kind_share`` and ``bert_p`` here and in the JSON, and ``zipf`` as
            ``word_zipf`` in the JSON.
        hard: how hard the question is, whatever its relation (``hardness.Hardness``: BERT's top-1
            probability and entropy, the kNN distribution's entropy, the neighbours' mean distance;
            its fields flat in the JSON, each None where not known).
    """

    top1: float
    margin: float
    votes: int
    neighbors: int
    near_votes: float
    agree: bool
    distinct: float
    nearest: float
    contexts: int
    coverage: float
    kinds: KindSignals = field(default_factory=KindSignals)
    hard: Hardness = field(default_factory=Hardness)

    @property
    def kind(self) -> str:
        """The top answer's kind."""
        return self.kinds.kind

    @property
    def majority(self) -> str:
        """The kind that holds most of the neighbours' kNN probability."""
        return self.kinds.majority

    @property
    def kind_share(self) -> float:
        """The share of the kNN probability on answers of the top answer's kind."""
        return self.kinds.share

    @property
    def bert_kind_share(self) -> float | None:
        """BERT's probability mass on the top answer's kind; None without an MLM head."""
        return self.kinds.bert_share

    @property
    def bert_p(self) -> float | None:
        """BERT's probability of the top answer; None without an MLM head."""
        return self.kinds.bert_p

    @property
    def share(self) -> float:
        """Share of the neighbours that hold the top answer (0 without neighbours)."""
        return self.votes / self.neighbors if self.neighbors else 0.0

    @property
    def partial(self) -> bool:
        return self.coverage < 1.0

    @property
    def kind_agrees(self) -> bool:
        """Whether the answer has the kind most of the neighbours hold."""
        return self.kinds.agree


# The fit's inputs, each a number computed from the signals. Counts enter as logs: one vote more
# matters among 3 neighbours, hardly among 128.
FEATURES: dict[str, Any] = {
    # log of the share that holds the answer, smoothed so that 0 votes (an answer BERT put first) is finite
    "log_share": lambda s: math.log((s.votes + 0.5) / (s.neighbors + 1)),
    "log_votes": lambda s: math.log1p(s.votes),
    "log_neighbors": lambda s: math.log1p(s.neighbors),
    "near_votes": lambda s: s.near_votes,
    "agree": lambda s: float(s.agree),
    "spread": lambda s: 1.0 - s.distinct,
    "top1": lambda s: s.top1,
    "margin": lambda s: s.margin,
    "log_contexts": lambda s: math.log1p(s.contexts),
    "coverage": lambda s: s.coverage,
    # The answer's kind against the neighbours' (issue 49): a year to a place question is wrong.
    "kind_agree": lambda s: float(s.kind_agrees),
    "kind_share": lambda s: s.kind_share,
    # BERT's view of the kind and the answer, where the model has an MLM head; without one, the kNN's
    # share and 0 (a fit for such a model is fitted where they are absent, so they carry no weight).
    "bert_kind_share": lambda s: s.kind_share if s.bert_kind_share is None else s.bert_kind_share,
    "bert_p": lambda s: 0.0 if s.bert_p is None else s.bert_p,
    # How far under BERT's own first choice the answer is, as a log ratio (0: BERT's first choice too).
    # BERT knows the kind of answer a question wants even where it does not know the answer ('jones'
    # to "X plays [MASK] ." is a name, not an instrument); linear in bert_p that is lost among the small
    # probabilities. NaN where unknown (no MLM head, a word of several wordpieces): the fit takes it at
    # its mean, which weighs nothing either way.
    "log_bert_ratio": lambda s: _log_ratio(s.bert_p, s.hard.bert_top1),
    # How far the answer word is above a common name's frequency in English (``word_frequency``): a
    # fact's answer is mostly a name, a wrong kNN answer often a common word of the sentence ('based',
    # 'born'). What BERT's ratio says for a model with an MLM head, for one without. NaN where unknown
    # (a wordpiece that is no word, a checkpoint without it): taken at the fit's mean.
    "common_word": lambda s: _or_nan(above_common(s.kinds.zipf)),
    # How hard the question is, whatever its relation (``hardness``; issue 49): where a signal is not
    # known (no MLM head, a checkpoint without it) it enters as 0, which a fit where it is never known
    # gives no weight.
    "bert_top1": lambda s: _known(s.hard.bert_top1),
    "bert_entropy": lambda s: _known(s.hard.bert_entropy),
    "knn_entropy": lambda s: _known(s.hard.knn_entropy),
    "log_distinct": lambda s: math.log1p(s.distinct * s.neighbors),
    "log_nearest": lambda s: math.log1p(s.nearest) if math.isfinite(s.nearest) else 0.0,
    "log_mean_distance": lambda s: _known(s.hard.mean_distance, math.log1p),
}
# The inputs a fit may weigh, in three groups: the signals of the answer and of its kind, how common a
# word it is, and how hard the question is (``hardness``); ``eval calibrate`` refits on the group(s) of
# the fit in use.
ANSWER_FEATURES = (
    "log_share",
    "log_votes",
    "log_neighbors",
    "near_votes",
    "agree",
    "spread",
    "top1",
    "margin",
    "log_contexts",
    "coverage",
    "kind_agree",
    "kind_share",
    "bert_kind_share",
    "bert_p",
    "log_bert_ratio",
)
# How common a word the answer is: a fit for a model without an MLM head reads it (there it tells a name
# from a common word, as BERT's ratio does with a head); BERT-base's BERT-kNN fit checked no better with it.
WORD_FEATURES = ("common_word",)
HARDNESS_FEATURES = (
    "bert_top1",
    "bert_entropy",
    "knn_entropy",
    "log_distinct",
    "log_nearest",
    "log_mean_distance",
)


# A probability under this counts as this: BERT's distribution reaches 1e-9 for junk wordpieces, and
# how much under it says nothing more about an answer's kind; it is also the precision at which an
# evaluation's checkpoint records the probabilities (6 decimals), so that a fit sees what a query sees.
PROB_FLOOR = 1e-6


def _log_ratio(p: float | None, top: float | None) -> float:
    """log(p / top) with both floored at ``PROB_FLOOR``; NaN where either is unknown."""
    if p is None or top is None or not math.isfinite(p) or not math.isfinite(top):
        return math.nan
    return math.log(max(p, PROB_FLOOR) / max(top, PROB_FLOOR))


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _known(value: float | None, then: Any = None) -> float:
    """A signal that may be unknown as a fit input: 0 where it is None or not finite."""
    if value is None or not math.isfinite(value):
        return 0.0
    return float(then(value) if then is not None else value)


def signals(
    ranking: Sequence[Prediction],
    nb: Neighbors,
    coverage: Mapping[str, Coverage] | None = None,
    kinds: KindSignals | None = None,
    hard: Hardness | None = None,
) -> Signals:
    """The signals of an answer whose ranking (best first) was computed from the neighbours ``nb``.

    Args:
        coverage: per searched article on a lazy index, its contexts encoded and in all; None or {}: the
            articles were whole (an eager index).
    """
    probs = [p.prob for p in ranking[:2]] + [0.0, 0.0]
    top = ranking[0].token_id if ranking else None
    return signals_of(top, probs[0], probs[1], nb, coverage, kinds, hard)


def signals_of(
    top: int | None,
    top1: float,
    second: float,
    nb: Neighbors,
    coverage: Mapping[str, Coverage] | None,
    kinds: KindSignals | None = None,
    hard: Hardness | None = None,
) -> Signals:
    """``signals`` from the top answer's value and the two best probabilities (what evaluation has)."""
    n = len(nb)
    seen = sum(c.encoded for c in (coverage or {}).values())
    total = sum(c.total for c in (coverage or {}).values())
    contexts = total if total else n
    share_seen = min(seen / total, 1.0) if total else 1.0
    k, h = kinds or KindSignals(), hard or Hardness()
    if top is None or n == 0:
        return Signals(top1, top1 - second, 0, n, 0.0, False, 0.0, math.inf, contexts, share_seen, k, h)
    holds = nb.token_ids == top
    nearest_first = np.argsort(nb.distances, kind="stable")
    return Signals(
        top1=float(top1),
        margin=float(top1 - second),
        votes=int(holds.sum()),
        neighbors=n,
        near_votes=float(holds[nearest_first[:NEAR]].mean()),
        agree=bool(holds[nearest_first[0]]),
        distinct=len(np.unique(nb.token_ids)) / n,
        nearest=float(nb.distances[nearest_first[0]]),
        contexts=contexts,
        coverage=share_seen,
        kinds=k,
        hard=h,
    )


def no_vote_p(s: Signals) -> float | None:
    """``p`` of an answer that has neighbours but no vote (interpolated: BERT put it first and no
    neighbour holds it), from BERT's own probability of it and what the neighbours saw; None where this
    does not apply (votes, no neighbours, or BERT's probability unknown: no MLM head, a word of several
    wordpieces), and the fit gives ``p``.

    BERT's probability ``b`` (the BERT-alone rule's ``p``, ``confidence_fit_bert.json``) is the prior;
    had the answer been right, its evidence would have given it a vote unless it lay in the contexts not
    encoded (share ``1 - coverage``), while a wrong answer gets no vote anyway, so by Bayes
    p = b(1 - c) / (b(1 - c) + 1 - b): BERT's own p where nothing was seen, 0 where the whole articles
    were. No parameter is fitted. Measured (BERT-base, λ = 0.3; docs/evaluation.md#confidence): such
    answers on whole articles were right 1 time in 113, partial ones 17 in 46; BERT's p alone said 0.68
    and 0.71, the regression 0.22 and 0.18.
    """
    if s.votes > 0 or s.neighbors == 0 or s.bert_p is None or not math.isfinite(s.bert_p):
        return None
    b = min(max(float(s.bert_p), 0.0), 1.0)
    unseen = 1.0 - min(max(float(s.coverage), 0.0), 1.0)
    odds = b * unseen + (1.0 - b)
    return b * unseen / odds if odds > 0 else 0.0


def inputs(features: Sequence[str], rows: Sequence[Signals]) -> np.ndarray:
    """(n, features) raw inputs, NaN where one is unknown."""
    x = np.array([[FEATURES[f](s) for f in features] for s in rows], dtype=np.float64)
    return x.reshape(len(rows), len(features))


@dataclass(frozen=True)
class Fit:
    """A logistic regression from the signals to ``p``, and the band thresholds on ``p``.

    Attributes:
        features: names in ``FEATURES``, in the order of ``coef``.
        mean, scale: each feature is standardised ((x - mean) / scale) before the weights apply.
        coef, intercept: the regression's weights.
        high, medium: ``p`` at or above ``high`` is "high" (with at least ``MIN_HIGH_VOTES`` votes), at
            or above ``medium`` "medium", else "low".
        lower, upper: each feature's range in the data it was fitted on; inputs are clipped to it.
        curve: (regression's p, share right) points, rising: the regression's p is mapped through them
            (linear between points), which corrects a sigmoid too steep or too flat for the data
            (isotonic regression); () keeps the regression's p.
        about: what it was fitted on (model, relations, answers) and how it did on left-out relations.
        p_from: "fit" (the regression and curve; ``no_vote_p`` for an answer no neighbour votes for), or
            "top1": ``p`` is the answer's top-1 probability itself, no regression (BERT's answers alone,
            where no fit of it checked better than it).
        never_low: answer kinds (``answer_kinds.KINDS``) that are never "low", whatever ``p``: a fit
            that cannot tell a question that wants a date from one that does not (kNN alone) puts a
            right year under "low" (issue 49: MiniLM's years and months to date questions were right
            19 times in 44, most though their neighbours mostly held words).
    """

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    high: float
    medium: float
    about: Mapping[str, Any] = field(default_factory=dict)
    curve: tuple[tuple[float, float], ...] = ()
    lower: tuple[float, ...] = ()
    upper: tuple[float, ...] = ()
    p_from: str = "fit"
    never_low: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [f for f in self.features if f not in FEATURES]
        sizes = {len(self.features), len(self.mean), len(self.scale), len(self.coef)}
        sizes |= {len(self.lower) or len(self.features), len(self.upper) or len(self.features)}
        rising = all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(self.curve, self.curve[1:]))
        numbers = [*self.mean, *self.scale, *self.coef, self.intercept, self.high, self.medium]
        numbers += [*self.lower, *self.upper, *(v for point in self.curve for v in point)]
        problems = [
            f"unknown features {unknown}" if unknown else "",
            f"lists of different sizes {sorted(sizes)}" if len(sizes) != 1 else "",
            "a number that is not finite" if not all(math.isfinite(v) for v in numbers) else "",
            "a zero scale" if any(v == 0.0 for v in self.scale) else "",
            "bands out of order (0 <= medium <= high <= 1)"
            if not 0.0 <= self.medium <= self.high <= 1.0
            else "",
            "a curve that does not rise within [0, 1]"
            if not rising or any(not 0.0 <= v <= 1.0 for point in self.curve for v in point)
            else "",
            "lower bounds above upper ones" if any(a > b for a, b in zip(self.lower, self.upper)) else "",
            f"p_from {self.p_from!r}, not one of {P_FROM}" if self.p_from not in P_FROM else "",
            f"never_low {list(self.never_low)}: not all of {KINDS}"
            if not set(self.never_low) <= set(KINDS)
            else "",
        ]
        if any(problems):
            raise ValueError("; ".join(x for x in problems if x))

    def matrix(self, rows: Sequence[Signals]) -> np.ndarray:
        """(n, features) standardised inputs."""
        x = inputs(self.features, rows)
        if self.lower:  # the fit knows nothing past what it saw: an input beyond is taken at the edge
            x = np.clip(x, self.lower, self.upper)
        mean = np.asarray(self.mean)
        x = np.where(np.isnan(x), mean, x)  # an unknown input is taken at its mean: no weight either way
        return (x - mean) / np.asarray(self.scale)

    def probability(self, rows: Sequence[Signals]) -> np.ndarray:
        """``p`` of each answer: the regression's, or ``no_vote_p`` for an answer no neighbour votes for."""
        if self.p_from == "top1":
            return np.clip(np.array([s.top1 for s in rows], dtype=np.float64), 0.0, 1.0)
        z = self.matrix(rows) @ np.asarray(self.coef) + self.intercept
        p = 1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0)))
        if self.curve:
            xs, ys = zip(*self.curve)
            p = np.interp(p, xs, ys)
        for i, s in enumerate(rows):
            alone = no_vote_p(s)
            if alone is not None:
                p[i] = alone
        return p

    def level(self, p: float, votes: int, kind_agrees: bool, *, kind: str) -> str:
        """The band of ``p``; never "high" on fewer than ``MIN_HIGH_VOTES`` votes, nor for an answer of
        another kind than most of its neighbours hold (a year to a place question); never "low" for an
        answer of a kind in ``never_low``."""
        if p >= self.high and votes >= MIN_HIGH_VOTES and kind_agrees:
            return "high"
        return "medium" if p >= self.medium or kind in self.never_low else "low"

    def as_json(self) -> dict[str, Any]:
        return {"format": FIT_FORMAT, **asdict(self)}

    def save(self, path: Path) -> Path:
        """Write the fit as JSON (atomically: a reader never sees half a file)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.as_json(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> Fit:
        """Raises: ConfigError: not a fit this version reads (one line naming ``where`` and what to do)."""
        try:
            check_fit_json(data, where)
            if data.get("format") != FIT_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, this version reads {FIT_FORMAT}")
            return cls(
                tuple(str(v) for v in data["features"]),
                tuple(float(v) for v in data["mean"]),
                tuple(float(v) for v in data["scale"]),
                tuple(float(v) for v in data["coef"]),
                float(data["intercept"]),
                float(data["high"]),
                float(data["medium"]),
                dict(data.get("about") or {}),
                tuple((float(x), float(y)) for x, y in data.get("curve") or ()),
                tuple(float(v) for v in data.get("lower") or ()),
                tuple(float(v) for v in data.get("upper") or ()),
                str(data.get("p_from", "fit")),
                tuple(str(v) for v in data.get("never_low") or ()),
            )
        except KeyError as exc:
            raise ConfigError(f"confidence fit {where} is refused: no {exc}; {what_to_do(where)}") from None
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise ConfigError(f"confidence fit {where} is refused: {exc}; {what_to_do(where)}") from None

    @classmethod
    def read(cls, path: Path) -> Fit:
        """Raises: ConfigError: unreadable, too large or deep, or not a fit."""
        return cls.from_json(read_fit_json(Path(path)), str(path))


# The shipped fits, each for the answers of one kind of model and method (``about.applies_to``); the
# first is the fallback for a model and method none of them names: MiniLM's kNN answers, then
# bert-base-uncased's BERT-kNN answers, and BERT's answers alone (λ = 0), whose p is BERT's own top-1
# probability (``p_from`` "top1": no fit of it checked better) (docs/evaluation.md#confidence).
SHIPPED: tuple[str, ...] = ("confidence_fit.json", "confidence_fit_bert_knn.json", "confidence_fit_bert.json")
METHODS = ("knn", "bert", "interpolated")


def method_of(bert_available: bool, lam: float) -> str:
    """How an index's answers are made: kNN alone (no MLM head, or λ = 1), BERT alone (λ = 0), or both."""
    if not bert_available or lam >= 1.0:
        return "knn"
    return "bert" if lam <= 0.0 else "interpolated"


@lru_cache(maxsize=4)
def shipped(name: str = SHIPPED[0]) -> Fit:
    """A fit that ships with the package (default: all-MiniLM-L6-v2, kNN alone, on LAMA T-REx)."""
    text = resources.files("bertknn_search.query").joinpath(name).read_text("utf-8")
    return Fit.from_json(parse_fit_json(text, f"the shipped {name}"), f"the shipped {name}")


def shipped_for(model: str | None, method: str) -> tuple[Fit, str]:
    """The shipped fit for answers of ``model`` made by ``method``, and its name: one whose
    ``applies_to`` names the method and the model's name (its last path part), else one for the method,
    else the first."""
    base = Path(model or "").name.lower()
    candidates = []
    for name in SHIPPED:
        try:
            fit = shipped(name)
        except (FileNotFoundError, ConfigError):
            continue
        applies = fit.about.get("applies_to") or {}
        models = [str(m).lower() for m in applies.get("models") or ()]
        same_method = method in (applies.get("methods") or ())
        candidates.append((same_method and any(m in base for m in models), same_method, name, fit))
    if not candidates:
        raise ConfigError("no shipped confidence fit could be read: reinstall bertknn-search")
    best = max(candidates, key=lambda c: (c[0], c[1], -SHIPPED.index(c[2])))
    return best[3], f"shipped:{best[2]}"


def fit_for(index: Path | str | None, model: str | None = None, method: str = "knn") -> Fit:
    """The fit an index's answers use: the one ``eval calibrate`` stored in its folder, else the shipped
    one for its model and method (``fit_name`` says which).

    Raises:
        ConfigError: the stored fit is refused (one line naming it and how to go back).
    """
    return fit_and_name(index, model, method)[0]


def fit_and_name(index: Path | str | None, model: str | None = None, method: str = "knn") -> tuple[Fit, str]:
    """``fit_for`` and the fit's name: ``stored:<path>`` or ``shipped:<file>``."""
    stored = Path(index) / FIT_FILE if index is not None else None
    if stored is not None and stored.is_file():
        return Fit.read(stored), f"stored:{stored}"
    return shipped_for(model, method)


def reset_fit(index: Path | str) -> str:
    """``eval calibrate --reset``: remove the fit stored in ``index`` (a file or a link, never a folder);
    returns what was done.

    Raises:
        ConfigError: something else than a file stands at the fit's place.
    """
    stored = Path(index) / FIT_FILE
    if stored.is_symlink() or stored.is_file():
        stored.unlink()
        return f"removed {stored}: answers over this index use the shipped fit again"
    if stored.exists():
        raise ConfigError(f"{stored} is not a file: remove it yourself")
    return f"no fit stored in {stored.parent}: answers already use the shipped fit"


def describe_fit(index: Path | str | None, model: str | None, method: str) -> str:
    """Which fit an index's answers use, for ``stats``: stored or shipped, what it was fitted on and its
    left-out check; a stored fit that is refused says so (queries then refuse too)."""
    try:
        fit, name = fit_and_name(index, model, method)
    except ConfigError as exc:
        return f"refused: {exc}"
    about = fit.about
    head = about.get("left_out") or {}
    check = ", ".join(f"{k} {head[k]}" for k in ("auroc", "ece") if k in head)
    what = about.get("model") or "unknown model"
    never = f"; never low: {', '.join(fit.never_low)}" if fit.never_low else ""
    return f"{name} ({what}{'; left-out ' + check if check else ''}{never})"


def assess(
    ranking: Sequence[Prediction],
    nb: Neighbors,
    bert_available: bool,
    coverage: Mapping[str, Coverage] | None = None,
    fit: Fit | None = None,
    kinds: KindSignals | None = None,
    fit_name: str | None = None,
    hard: Hardness | None = None,
) -> Confidence | None:
    """An answer's confidence; None where no answer was computed (no neighbours and no MLM head).

    Args:
        ranking: BERT-kNN's answers, best first.
        nb: the neighbours the kNN part was computed from.
        bert_available: whether the model has an MLM head (without one and without neighbours, the
            ranking is all zeros: no answer).
        coverage: per article searched on a lazy index, its contexts encoded and in all.
        fit: the regression and bands (default: the shipped fit).
        kinds: the answer's kind against its neighbours' (``answer_kinds.KindTable.signals``).
        fit_name: which fit this is, for the answer's JSON (``fit_and_name``).
        hard: how hard the question is (``hardness.hardness``).
    """
    found = signals(ranking, nb, coverage, kinds, hard)
    return judge(found, bert_available and bool(ranking), fit, fit_name)


def judge(
    found: Signals, bert_available: bool, fit: Fit | None = None, fit_name: str | None = None
) -> Confidence | None:
    """The confidence of an answer with the signals ``found`` (see ``assess``)."""
    fit = fit or shipped()
    if found.neighbors == 0:
        if not bert_available:
            return None
        p = found.top1  # BERT's answer alone: its own probability, and no vote, so never "high"
    else:
        p = float(fit.probability([found])[0])
    p = min(max(float(p), 0.0), 1.0) if math.isfinite(p) else 0.0
    kinds = {"kind": found.kind, "neighbours_kind": found.majority} if found.neighbors else {}
    return Confidence(
        fit.level(p, found.votes, found.kind_agrees, kind=found.kind),
        round(p, 4),
        found.votes,
        found.neighbors,
        fit=fit_name,
        **kinds,
    )
