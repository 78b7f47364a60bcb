"""Reading a stored confidence fit safely: a size cap before parsing, bounded depth and arrays, every
number finite (issue 51.3).

A fit is a small JSON object (the shipped one is ~3 KB): a file far larger, nested deeper or with longer
arrays than any fit has is refused before it costs time or memory, and a fit whose numbers are not finite
would make every ``p`` NaN. Every refusal is one line naming the file and what to do.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from bertknn_search.errors import ConfigError

MAX_BYTES = 256 * 1024  # a fit with every feature and a 1,000-point curve is ~60 KB
MAX_DEPTH = 8  # {"about": {"left_out": {...}}}, {"curve": [[x, y]]}: 4 levels deep at most
MAX_ITEMS = 2_000  # elements of one array or keys of one object


def what_to_do(where: Path | str) -> str:
    """How to get past a refused fit: go back to the shipped one, or fit again."""
    folder = Path(where).parent if Path(where).name == "confidence-fit.json" else "INDEX"
    return (
        f"run 'bertknn-search eval calibrate --reset --index {folder}' to go back to the shipped fit,"
        " or eval calibrate again"
    )


def read_fit_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, checked for size (before parsing), depth, array sizes and finite numbers.

    Raises:
        ConfigError: unreadable, too large, not JSON, too deep or long, or a number that is not finite.
    """
    path = Path(path)
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > MAX_BYTES:
                raise ConfigError(_bad(path, f"{size:,} bytes, over the {MAX_BYTES:,} a fit may have"))
            raw = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(_bad(path, f"cannot read it ({exc.strerror or exc})")) from None
    if len(raw) > MAX_BYTES:  # grew since the stat
        raise ConfigError(_bad(path, f"over the {MAX_BYTES:,} bytes a fit may have"))
    return parse_fit_json(raw, str(path))


def parse_fit_json(raw: bytes | str, where: str) -> dict[str, Any]:
    """``read_fit_json`` for text already read (``where`` names it in errors)."""
    if len(raw) > MAX_BYTES:
        raise ConfigError(_bad(where, f"over the {MAX_BYTES:,} bytes a fit may have"))
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    depth = _max_depth(text)
    if depth > MAX_DEPTH:  # before json.loads, whose recursion a deep file would exhaust
        raise ConfigError(_bad(where, f"nested {depth} deep, a fit is at most {MAX_DEPTH}"))
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise ConfigError(_bad(where, f"not JSON ({exc})")) from None
    check_fit_json(data, where)
    if not isinstance(data, dict):
        raise ConfigError(_bad(where, "not a JSON object"))
    return data


def check_fit_json(data: Any, where: str, _depth: int = 0) -> None:
    """Every number finite, every array and object within ``MAX_ITEMS``."""
    if isinstance(data, dict | list) and len(data) > MAX_ITEMS:
        raise ConfigError(_bad(where, f"an array or object of {len(data):,} items, at most {MAX_ITEMS:,}"))
    items = data.values() if isinstance(data, dict) else data if isinstance(data, list) else ()
    for value in items:
        check_fit_json(value, where, _depth + 1)
    if isinstance(data, float) and not math.isfinite(data):
        raise ConfigError(_bad(where, f"a number that is not finite ({data})"))


def _max_depth(text: str) -> int:
    """How deep ``[`` and ``{`` nest, outside strings (a linear scan: no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return deepest
        elif char in "]}":
            depth -= 1
    return deepest


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a fit may hold")


def _bad(where: Path | str, what: str) -> str:
    return f"confidence fit {where} is refused: {what}; {what_to_do(where)}"
