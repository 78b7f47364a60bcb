"""LAMA evidence sentences -> a corpus of real Wikipedia sentences, one article per subject."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from bertknn_search.errors import InputFormatError
from bertknn_search.eval.datasets import read_jsonl
from bertknn_search.records import Article

MASK = "[MASK]"


def evidence_articles(paths: Iterable[Path]) -> list[Article]:
    """Group the T-REx evidence sentences (mask filled with the object's surface form) by subject.

    This is the Wikipedia text LAMA's facts were extracted from; ingested, it gives every subject its own
    article, the setting in which the paper's title shortcut applies.

    Args:
        paths: T-REx or LAMA-UHN relation files (``P*.jsonl``), or folders of them.

    Returns:
        Articles ordered by first appearance; each sentence once.

    Raises:
        InputFormatError: a line without evidences or with a malformed one.
    """
    sentences: dict[str, dict[str, None]] = {}
    titles: dict[str, str] = {}
    for path in _files(paths):
        for number, row in read_jsonl(path):
            try:
                key = str(row.get("sub_uri") or row["sub_label"])
                titles.setdefault(key, row["sub_label"])
                bucket = sentences.setdefault(key, {})
                for ev in row.get("evidences", []):
                    bucket[ev["masked_sentence"].replace(MASK, ev["obj_surface"]).strip()] = None
            except (KeyError, TypeError, AttributeError) as exc:
                raise InputFormatError(f"{path}:{number}: not a LAMA fact with evidences ({exc!r})") from exc
    return [Article(key, titles[key], "\n".join(s)) for key, s in sentences.items() if s]


def write_jsonl(articles: Iterable[Article], out: Path) -> int:
    """Write ``articles`` as ``{id, title, text}`` lines; returns how many."""
    count = 0
    with out.open("w", encoding="utf-8") as f:
        for a in articles:
            f.write(json.dumps({"id": a.id, "title": a.title, "text": a.text}, ensure_ascii=False) + "\n")
            count += 1
    return count


def _files(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        path = Path(path)
        yield from sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
