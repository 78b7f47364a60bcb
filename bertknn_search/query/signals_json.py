"""An answer's confidence signals as flat JSON and back: what an evaluation's checkpoint records of each
answer (``eval calibrate`` and ``bench_confidence.py --from-checkpoint`` fit on it)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any

from bertknn_search.query.answer_kinds import KindSignals
from bertknn_search.query.confidence import Signals
from bertknn_search.query.hardness import Hardness

# The kind signals' names in the JSON (checkpoints, ``eval calibrate``), flat beside the others.
_KIND_JSON = {"kind": "kind", "majority": "majority", "share": "kind_share"}
_KIND_JSON |= {"bert_share": "bert_kind_share", "bert_p": "bert_p", "zipf": "word_zipf"}


def signals_json(found: Signals) -> dict[str, Any]:
    """``found`` as JSON, flat: floats rounded (a batch of another shape moves the last bits), no infinity."""
    flat = {f.name: getattr(found, f.name) for f in fields(found) if f.name not in ("kinds", "hard")}
    flat |= {_KIND_JSON[name]: value for name, value in asdict(found.kinds).items()}
    flat |= asdict(found.hard)
    out: dict[str, Any] = {}
    for name, value in flat.items():
        if isinstance(value, float):
            value = None if math.isinf(value) else round(value, 6)
        out[name] = value
    return out


def signals_from_json(data: Mapping[str, Any]) -> Signals:
    """``signals_json``'s inverse (a line written before a signal was recorded leaves it at its default)."""
    rest = dict(data)
    kinds = KindSignals(**{name: rest.pop(key) for name, key in _KIND_JSON.items() if key in rest})
    hard = Hardness(**{f.name: rest.pop(f.name) for f in fields(Hardness) if f.name in rest})
    nearest = rest.get("nearest")
    return Signals(
        **{**rest, "nearest": math.inf if nearest is None else nearest, "kinds": kinds, "hard": hard}
    )
