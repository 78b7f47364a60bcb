"""Relation ids on the command line: parsed, matched to the ids a dataset holds, or refused in one line."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bertknn_search.errors import ConfigError


def canonical_ids(asked: Sequence[str], known: Sequence[str]) -> set[str]:
    """The known ids that ``asked`` names, case aside (``p19`` is ``P19``); unknown ones as given."""
    by_lower = {k.lower(): k for k in known}
    return {by_lower.get(r.lower(), r) for r in asked}


def unknown_relations(
    unknown: Sequence[str], known: Sequence[str], held: str = "the data named holds"
) -> str:
    """One line naming the unknown ids and every known one (and the templates flag, for a path)."""
    line = f"unknown relation{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}"
    line += f"; {held}: {', '.join(known)}" if known else f"; {held} none"
    if any(Path(r).suffix == ".jsonl" or Path(r).is_file() for r in unknown):
        line += " (a templates file such as relations.jsonl goes to --relations-file)"
    return line


def parse_relations(text: str | None) -> list[str] | None:
    """``"P19, P103"`` -> ``["P19", "P103"]``; None -> None (every relation).

    Raises:
        ConfigError: the text names no relation (``""`` or ``","``).
    """
    if text is None:
        return None
    ids = [r.strip() for r in text.split(",") if r.strip()]
    if not ids:
        raise ConfigError(f"--relations {text!r} names no relation; give ids such as P19,P103")
    return list(dict.fromkeys(ids))
