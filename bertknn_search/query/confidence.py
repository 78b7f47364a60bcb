"""How sure an answer is: an answer's signals -> ``p``, the estimated probability that its top answer is
right, and a band ("high", "medium", "low") that cuts ``p``.

``p`` is a logistic regression over the signals an answer already has (its votes and neighbours, the
nearest neighbours' agreement, the top-1 probability and margin, how much of its articles it saw), mapped
through an isotonic curve to the share of such answers that were right. The
shipped coefficients (``confidence_fit.json``) were fitted by ``benchmarks/bench_confidence.py`` on the
LAMA T-REx relations in ``../shared/data`` with all-MiniLM-L6-v2 (kNN alone), each relation's answers
scored by a fit made without that relation (``docs/evaluation.md#confidence``). ``eval calibrate`` fits
them again for another model or corpus and stores the fit in the index folder (``FIT_FILE``), where the
Searcher reads it.

An answer without neighbours (no article found, or the adaptive gate skipped retrieval) is BERT's alone:
its ``p`` is BERT's top-1 probability, which no fit here has checked.
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
from bertknn_search.records import Confidence, Coverage, Neighbors, Prediction

LEVELS = ("low", "medium", "high")
NEAR = 10  # the nearest neighbours ``near_votes`` counts
MIN_HIGH_VOTES = 2  # one neighbour holding the answer is never "high", whatever p says
FIT_FILE = "confidence-fit.json"  # in the index folder: the fit ``eval calibrate`` stored
FIT_FORMAT = 1


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

    @property
    def share(self) -> float:
        """Share of the neighbours that hold the top answer (0 without neighbours)."""
        return self.votes / self.neighbors if self.neighbors else 0.0

    @property
    def partial(self) -> bool:
        return self.coverage < 1.0


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
}


def signals(
    ranking: Sequence[Prediction], nb: Neighbors, coverage: Mapping[str, Coverage] | None = None
) -> Signals:
    """The signals of an answer whose ranking (best first) was computed from the neighbours ``nb``.

    Args:
        coverage: per searched article on a lazy index, its contexts encoded and in all; None or {}: the
            articles were whole (an eager index).
    """
    probs = [p.prob for p in ranking[:2]] + [0.0, 0.0]
    top = ranking[0].token_id if ranking else None
    return signals_of(top, probs[0], probs[1], nb, coverage)


def signals_of(
    top: int | None, top1: float, second: float, nb: Neighbors, coverage: Mapping[str, Coverage] | None
) -> Signals:
    """``signals`` from the top answer's value and the two best probabilities (what evaluation has)."""
    n = len(nb)
    seen = sum(c.encoded for c in (coverage or {}).values())
    total = sum(c.total for c in (coverage or {}).values())
    contexts = total if total else n
    share_seen = min(seen / total, 1.0) if total else 1.0
    if top is None or n == 0:
        return Signals(top1, top1 - second, 0, n, 0.0, False, 0.0, math.inf, contexts, share_seen)
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
    )


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

    def __post_init__(self) -> None:
        unknown = [f for f in self.features if f not in FEATURES]
        sizes = {len(self.features), len(self.mean), len(self.scale), len(self.coef)}
        sizes |= {len(self.lower) or len(self.features), len(self.upper) or len(self.features)}
        rising = all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(self.curve, self.curve[1:]))
        if unknown or len(sizes) != 1 or not 0.0 <= self.medium <= self.high <= 1.0 or not rising:
            raise ValueError(f"bad confidence fit: unknown features {unknown}, sizes {sizes}, bands, curve")

    def matrix(self, rows: Sequence[Signals]) -> np.ndarray:
        """(n, features) standardised inputs."""
        x = np.array([[FEATURES[f](s) for f in self.features] for s in rows], dtype=np.float64)
        x = x.reshape(len(rows), len(self.features))
        if self.lower:  # the fit knows nothing past what it saw: an input beyond is taken at the edge
            x = np.clip(x, self.lower, self.upper)
        return (x - np.asarray(self.mean)) / np.asarray(self.scale)

    def probability(self, rows: Sequence[Signals]) -> np.ndarray:
        """``p`` of each answer."""
        z = self.matrix(rows) @ np.asarray(self.coef) + self.intercept
        p = 1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0)))
        if not self.curve:
            return p
        xs, ys = zip(*self.curve)
        return np.interp(p, xs, ys)

    def level(self, p: float, votes: int) -> str:
        """The band of ``p``; never "high" on fewer than ``MIN_HIGH_VOTES`` votes."""
        if p >= self.high and votes >= MIN_HIGH_VOTES:
            return "high"
        return "medium" if p >= self.medium else "low"

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
        """Raises: ConfigError: not a fit this version reads."""
        try:
            if data.get("format") != FIT_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, this version reads {FIT_FORMAT}")
            return cls(
                tuple(data["features"]),
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
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{where} is no confidence fit ({exc}); run eval calibrate again") from exc

    @classmethod
    def read(cls, path: Path) -> Fit:
        """Raises: ConfigError: unreadable or not a fit."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read confidence fit {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path} is no confidence fit (not a JSON object); run eval calibrate again")
        return cls.from_json(data, str(path))


@lru_cache(maxsize=1)
def shipped() -> Fit:
    """The fit that ships with the package (all-MiniLM-L6-v2 on LAMA T-REx)."""
    text = resources.files("bertknn_search.query").joinpath("confidence_fit.json").read_text("utf-8")
    return Fit.from_json(json.loads(text), "the shipped confidence_fit.json")


def fit_for(index: Path | str | None) -> Fit:
    """The fit an index's answers use: the one ``eval calibrate`` stored in its folder, else the shipped one.

    Raises:
        ConfigError: the stored fit cannot be read.
    """
    stored = Path(index) / FIT_FILE if index is not None else None
    if stored is not None and stored.is_file():
        return Fit.read(stored)
    return shipped()


def assess(
    ranking: Sequence[Prediction],
    nb: Neighbors,
    bert_available: bool,
    coverage: Mapping[str, Coverage] | None = None,
    fit: Fit | None = None,
) -> Confidence | None:
    """An answer's confidence; None where no answer was computed (no neighbours and no MLM head).

    Args:
        ranking: BERT-kNN's answers, best first.
        nb: the neighbours the kNN part was computed from.
        bert_available: whether the model has an MLM head (without one and without neighbours, the
            ranking is all zeros: no answer).
        coverage: per article searched on a lazy index, its contexts encoded and in all.
        fit: the regression and bands (default: the shipped fit).
    """
    return judge(signals(ranking, nb, coverage), bert_available and bool(ranking), fit)


def judge(found: Signals, bert_available: bool, fit: Fit | None = None) -> Confidence | None:
    """The confidence of an answer with the signals ``found`` (see ``assess``)."""
    fit = fit or shipped()
    if found.neighbors == 0:
        if not bert_available:
            return None
        p = found.top1  # BERT's answer alone: its own probability, and no vote, so never "high"
    else:
        p = float(fit.probability([found])[0])
    p = min(max(float(p), 0.0), 1.0)
    return Confidence(fit.level(p, found.votes), round(p, 4), found.votes, found.neighbors)


def signals_json(found: Signals) -> dict[str, Any]:
    """``found`` as JSON: floats rounded (a batch of another shape moves the last bits), no infinity."""
    out: dict[str, Any] = {}
    for name, value in asdict(found).items():
        if isinstance(value, float):
            value = None if math.isinf(value) else round(value, 6)
        out[name] = value
    return out


def signals_from_json(data: Mapping[str, Any]) -> Signals:
    """``signals_json``'s inverse."""
    nearest = data.get("nearest")
    return Signals(**{**data, "nearest": math.inf if nearest is None else nearest})
