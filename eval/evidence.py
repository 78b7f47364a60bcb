"""LAMA evidence sentences -> a corpus of real Wikipedia sentences, one article per subject."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertknn_search.errors import ConfigError, InputFormatError
from bertknn_search.eval.datasets import LAMA_FOLDERS, lama_relations, read_jsonl, relation_files, uhn_folder
from bertknn_search.eval.relations import canonical_ids, unknown_relations
from bertknn_search.records import Article

MASK = "[MASK]"
# The LAMA corpora whose facts carry the sentences they were extracted from, with a subject.
EVIDENCE_CORPORA = ("Google-RE", "T-REx")


@dataclass(frozen=True)
class CorpusSummary:
    """What ``write_evidence_corpus`` wrote.

    Attributes:
        articles: one per subject.
        sentences: distinct evidence sentences over all articles.
        facts: facts read.
        relations: the relation ids read, in the order read.
        out: the JSONL file.
    """

    articles: int
    sentences: int
    facts: int
    relations: list[str]
    out: Path


def evidence_files(
    lama: Path | None = None, lama_uhn: Path | None = None, relations: Sequence[str] | None = None
) -> list[tuple[str, Path]]:
    """(relation id, file) of every relation file with evidence sentences that the flags select.

    T-REx (``P19``) and Google-RE (``place_of_birth``) under ``lama``, and LAMA-UHN's ``TREx_UHN``.

    Raises:
        ConfigError: no dataset named, or a relation id none of them holds (the message lists those held).
        InputFormatError: a folder without LAMA's layout.
    """
    if lama is None and lama_uhn is None:
        raise ConfigError("name the facts: --lama (T-REx, Google-RE) and/or --lama-uhn")
    files: list[tuple[str, Path]] = []
    if lama is not None:
        trex, google = Path(lama) / LAMA_FOLDERS["T-REx"], Path(lama) / LAMA_FOLDERS["Google-RE"]
        for relation in lama_relations(lama, EVIDENCE_CORPORA):
            path = trex / f"{relation}.jsonl"
            files.append((relation, path if path.exists() else google / f"{relation}_test.jsonl"))
    if lama_uhn is not None:
        files += [(p.stem, p) for p in relation_files(uhn_folder(lama_uhn))]
    if relations is None:
        return files
    known = list(dict.fromkeys(r for r, _ in files))
    unknown = [r for r in relations if r.lower() not in {k.lower() for k in known}]
    if unknown:
        raise ConfigError(unknown_relations(unknown, known, "the relations with evidence sentences are"))
    wanted = canonical_ids(relations, known)
    return [(r, p) for r, p in files if r in wanted]


def evidence_articles(paths: Iterable[Path]) -> list[Article]:
    """Group the evidence sentences (mask filled with the object) by subject.

    This is the Wikipedia text LAMA's facts were extracted from; ingested, it gives every subject its own
    article, the setting in which the paper's title shortcut applies. T-REx and LAMA-UHN lines give their
    ``evidences``' masked sentences (filled with ``obj_surface``), Google-RE lines their
    ``masked_sentences`` (filled with ``obj_label``).

    Args:
        paths: T-REx, LAMA-UHN or Google-RE relation files, or folders of them.

    Returns:
        Articles ordered by first appearance; each sentence once. A subject in several relations is one
        article.

    Raises:
        InputFormatError: a line without evidences or with a malformed one.
    """
    return _group(row for path in _files(paths) for row in _rows(path))[0]


def write_evidence_corpus(
    files: Sequence[tuple[str, Path]], out: Path, per_relation: int | None = None
) -> CorpusSummary:
    """Write the evidence articles of ``files`` (from ``evidence_files``) to ``out`` as JSONL.

    The lines are ``{id, title, text}``, what ``ingest wiki`` reads.

    Args:
        files: (relation, file) pairs.
        out: the JSONL file to write.
        per_relation: read only the first N facts of each file, the facts ``eval run --per-relation N``
            evaluates (a small corpus for a first number).

    Raises:
        InputFormatError: a malformed line, or ``out`` cannot be written.
    """
    rows = (row for _, path in files for row in itertools.islice(_rows(path), per_relation))
    articles, facts, sentences = _group(rows)
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(articles, Path(out))
    except OSError as exc:
        raise InputFormatError(f"cannot write {out}: {exc.strerror or exc}") from exc
    relations = list(dict.fromkeys(r for r, _ in files))
    return CorpusSummary(len(articles), sentences, facts, relations, Path(out))


def _rows(path: Path) -> Iterator[tuple[str, str, list[str]]]:
    """(subject key, subject label, filled sentences) per line of one relation file."""
    for number, row in read_jsonl(path):
        try:
            yield _subject(row), row["sub_label"], _sentences(row)
        except (KeyError, TypeError, AttributeError) as exc:
            raise InputFormatError(f"{path}:{number}: not a LAMA fact with evidences ({exc!r})") from exc


def _subject(row: dict[str, Any]) -> str:
    # T-REx names subjects by Wikidata id, Google-RE by Freebase id; the label is the fallback.
    return str(row.get("sub_uri") or row.get("sub") or row["sub_label"])


def _sentences(row: dict[str, Any]) -> list[str]:
    evidences = row.get("evidences", [])
    trex_style = any(isinstance(e, dict) and "masked_sentence" in e for e in evidences)
    if "masked_sentences" in row and not trex_style:
        return [s.replace(MASK, row["obj_label"]).strip() for s in row["masked_sentences"]]  # Google-RE
    return [ev["masked_sentence"].replace(MASK, ev["obj_surface"]).strip() for ev in row.get("evidences", [])]


def _group(rows: Iterable[tuple[str, str, list[str]]]) -> tuple[list[Article], int, int]:
    """Articles, facts read, distinct sentences."""
    sentences: dict[str, dict[str, None]] = {}
    titles: dict[str, str] = {}
    facts = 0
    for key, title, found in rows:
        facts += 1
        titles.setdefault(key, title)
        sentences.setdefault(key, {}).update(dict.fromkeys(s for s in found if s))
    articles = [Article(key, titles[key], "\n".join(s)) for key, s in sentences.items() if s]
    return articles, facts, sum(len(s) for s in sentences.values())


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
