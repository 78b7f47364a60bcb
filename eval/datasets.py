"""Benchmark readers: LAMA, LAMA-UHN, PopQA and plain JSONL questions -> Fact records."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertknn_search.errors import ConfigError, InputFormatError
from bertknn_search.eval import popqa
from bertknn_search.eval.relations import canonical_ids, unknown_relations

MASK = "[MASK]"

# LAMA hard-codes these in scripts/run_experiments.py; relations.jsonl has no Google-RE entries.
GOOGLE_RE_TEMPLATES = {
    "date_of_birth": "[X] (born [Y]).",
    "place_of_birth": "[X] was born in [Y] .",
    "place_of_death": "[X] died in [Y] .",
}
LAMA_CORPORA = ("Google-RE", "T-REx", "ConceptNet", "SQuAD")
LAMA_FOLDERS = {"Google-RE": "Google_RE", "T-REx": "TREx", "ConceptNet": "ConceptNet", "SQuAD": "Squad"}


@dataclass(frozen=True)
class Fact:
    """One benchmark item.

    Attributes:
        corpus: e.g. "T-REx", "Google-RE", "SQuAD", "LAMA-UHN", "PopQA".
        relation: e.g. "P19"; ConceptNet and SQuAD are one relation each, named like the corpus.
        question: cloze text with one [MASK]. LAMA's SQuAD has 3 sentences with two; they are kept so
            that counts match the release, and the harness skips and counts them.
        answers: gold objects, the main one first.
        subject: the IR query for KB facts; None where the question itself is the query.
        uuid: the dataset's id, unique within (corpus, relation).
        popularity: PopQA's subject page views, else None.
    """

    corpus: str
    relation: str
    question: str
    answers: tuple[str, ...]
    subject: str | None
    uuid: str
    popularity: float | None = None

    @property
    def key(self) -> str:
        """Unique across benchmarks: the checkpoint key of the harness."""
        return f"{self.corpus}/{self.relation}/{self.uuid}"


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line.

    Raises:
        InputFormatError: unreadable file, a line that is not UTF-8 or not a JSON object.
    """
    try:
        with Path(path).open("rb") as handle:
            for lineno, raw in enumerate(handle, 1):
                try:
                    line = raw.decode("utf-8").strip()
                    row = json.loads(line) if line else None
                except (UnicodeDecodeError, ValueError) as exc:
                    raise InputFormatError(f"{path}:{lineno}: not a UTF-8 JSON line ({exc})") from exc
                if row is None:
                    continue
                if not isinstance(row, dict):
                    kind = type(row).__name__
                    raise InputFormatError(f"{path}:{lineno}: expected a JSON object, got {kind}")
                yield lineno, row
    except OSError as exc:
        raise InputFormatError(f"cannot read {path}: {exc.strerror}") from exc


def text_field(row: dict[str, Any], name: str, where: str) -> str:
    """``row[name]`` as a non-empty string, else an error naming the place (``file:line``).

    A number is refused: ``"obj_label": 5`` is a malformed line, not the answer "5".
    """
    value = row.get(name)
    if not isinstance(value, str) or not value.strip():
        got = "" if value is None else f" (got {type(value).__name__} {json.dumps(value)[:40]})"
        raise InputFormatError(f"{where}: field {name!r} is missing or not a non-empty string{got}")
    return value


def id_field(row: dict[str, Any], name: str, where: str) -> str:
    """``row[name]`` as an id: a non-empty string, or an integer written as one (numeric ids)."""
    value = row.get(name)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return text_field(row, name, where)


def read_templates(path: Path) -> dict[str, str]:
    """LAMA's relations.jsonl -> {relation id: template with [X] and [Y]}."""
    templates = {}
    for lineno, row in read_jsonl(path):
        where = f"{path}:{lineno}"
        template = text_field(row, "template", where)
        if "[X]" not in template or "[Y]" not in template:
            raise InputFormatError(f"{where}: template {template!r} lacks [X] or [Y]")
        if MASK in template:
            # Every fact of the relation would hold two [MASK]s: none could be asked.
            raise InputFormatError(f"{where}: template {template!r} holds {MASK}; write the object as [Y]")
        templates[id_field(row, "relation", where)] = template
    return templates


def cloze(template: str, subject: str) -> str:
    """LAMA's cloze: [X] -> subject, [Y] -> [MASK].

    [Y] is replaced first, so a subject that happens to contain "[Y]" stays literal text.
    """
    return template.replace("[Y]", MASK).replace("[X]", subject)


def relation_files(folder: Path) -> list[Path]:
    """P*.jsonl sorted by property number (P19 before P101), as LAMA lists them."""
    files = [p for p in folder.glob("P*.jsonl") if re.fullmatch(r"P\d+", p.stem)]
    return sorted(files, key=lambda p: int(p.stem[1:]))


def _template_facts(path: Path, corpus: str, relation: str, template: str) -> list[Fact]:
    """T-REx / Google-RE lines (sub_label, obj_label, uuid) turned into template clozes."""
    facts = []
    for lineno, row in read_jsonl(path):
        where = f"{path}:{lineno}"
        subject = text_field(row, "sub_label", where)
        obj = text_field(row, "obj_label", where)
        uuid = id_field(row, "uuid", where)
        facts.append(Fact(corpus, relation, cloze(template, subject), (obj,), subject, uuid))
    return facts


def _google_re_positive(row: dict[str, Any]) -> bool:
    """LAMA's filter_samples: drop a Google-RE fact whose raters said "no" more often than "yes"."""
    votes = [j.get("judgment") for j in row.get("judgments", []) if isinstance(j, dict)]
    return sum(v != "yes" for v in votes) <= sum(v == "yes" for v in votes)


def _sentence_facts(path: Path, corpus: str) -> list[Fact]:
    """ConceptNet / SQuAD lines: the first of ``masked_sentences`` is the question, as is."""
    facts = []
    for lineno, row in read_jsonl(path):
        where = f"{path}:{lineno}"
        sentences = row.get("masked_sentences")
        if not isinstance(sentences, list) or not sentences or not isinstance(sentences[0], str):
            raise InputFormatError(f"{where}: field 'masked_sentences' must be a non-empty list of strings")
        if MASK not in sentences[0]:
            raise InputFormatError(f"{where}: masked sentence has no {MASK}")
        uuid = id_field(row, "uuid" if "uuid" in row else "id", where)
        # No subject: the retriever queries with the question itself (method-facts, IR step).
        facts.append(Fact(corpus, corpus, sentences[0], (text_field(row, "obj_label", where),), None, uuid))
    return facts


def read_lama(
    root: Path,
    corpora: Sequence[str] | None = None,
    *,
    google_re_judgments: bool = True,
    relations: Collection[str] | None = None,
) -> list[Fact]:
    """Read LAMA's data.zip layout under ``root``; absent sub-folders are skipped.

    Args:
        root: folder with relations.jsonl, TREx/P*.jsonl, Google_RE/*_test.jsonl, ConceptNet/test.jsonl,
            Squad/test.jsonl.
        corpora: subset of ``LAMA_CORPORA`` to read; None reads all that are present.
        google_re_judgments: apply LAMA's rater filter to Google-RE (its evaluation does).
        relations: read only these relation ids (``lama_relations`` lists them); None reads all. Files
            of other relations are not opened.

    Returns:
        Facts in the order Google-RE, T-REx, ConceptNet, SQuAD.

    Raises:
        ConfigError: an unknown corpus name.
        InputFormatError: none of the asked corpora is under ``root``, or a file is malformed.
    """
    root = Path(root)
    present = _present_corpora(root, corpora)

    def asked(relation: str) -> bool:
        return relations is None or relation in relations

    facts: list[Fact] = []
    for corpus in present:
        folder = root / LAMA_FOLDERS[corpus]
        if corpus == "T-REx":
            facts += _read_trex(folder, root / "relations.jsonl", corpus, relations)
        elif corpus == "Google-RE":
            for relation, template in GOOGLE_RE_TEMPLATES.items():
                path = folder / f"{relation}_test.jsonl"
                if not path.exists() or not asked(relation):
                    continue
                keep = {str(r.get("uuid")) for _, r in read_jsonl(path) if _google_re_positive(r)}
                rows = _template_facts(path, corpus, relation, template)
                facts += [f for f in rows if f.uuid in keep] if google_re_judgments else rows
        elif (folder / "test.jsonl").exists() and asked(corpus):
            facts += _sentence_facts(folder / "test.jsonl", corpus)
    return facts


def _present_corpora(root: Path, corpora: Sequence[str] | None) -> list[str]:
    """The LAMA corpora asked for that have a folder under ``root``.

    Raises:
        ConfigError: an unknown corpus name.
        InputFormatError: none of them is there.
    """
    wanted = list(LAMA_CORPORA if corpora is None else corpora)
    unknown = [c for c in wanted if c not in LAMA_CORPORA]
    if unknown:
        raise ConfigError(f"unknown LAMA corpora {unknown}; choose from {list(LAMA_CORPORA)}")
    present = [c for c in LAMA_CORPORA if c in wanted and (root / LAMA_FOLDERS[c]).is_dir()]
    if not present:
        folders = ", ".join(LAMA_FOLDERS[c] + "/" for c in wanted)
        raise InputFormatError(f"no LAMA data under {root}: expected {folders} (LAMA's data.zip layout)")
    return present


def lama_relations(root: Path, corpora: Sequence[str] | None = None) -> list[str]:
    """The relation ids a LAMA folder holds, from its file names alone (nothing is parsed).

    T-REx relations by property id (``P19``), Google-RE by LAMA's names (``place_of_birth``); ConceptNet
    and SQuAD are one relation each, named like the corpus.

    Raises:
        ConfigError, InputFormatError: as ``read_lama``.
    """
    root = Path(root)
    ids: list[str] = []
    for corpus in _present_corpora(root, corpora):
        folder = root / LAMA_FOLDERS[corpus]
        if corpus == "T-REx":
            ids += [p.stem for p in relation_files(folder)]
        elif corpus == "Google-RE":
            ids += [r for r in GOOGLE_RE_TEMPLATES if (folder / f"{r}_test.jsonl").exists()]
        elif (folder / "test.jsonl").exists():
            ids.append(corpus)
    return ids


def uhn_folder(root: Path) -> Path:
    """LAMA-UHN's relation folder: ``root/TREx_UHN`` when there is one, else ``root`` itself."""
    root = Path(root)
    return root / "TREx_UHN" if (root / "TREx_UHN").is_dir() else root


def lama_uhn_relations(root: Path) -> list[str]:
    """The relation ids of a LAMA-UHN folder, from its file names."""
    return [p.stem for p in relation_files(uhn_folder(root))]


def _read_trex(
    folder: Path, relations_path: Path, corpus: str, relations: Collection[str] | None = None
) -> list[Fact]:
    files = [p for p in relation_files(folder) if relations is None or p.stem in relations]
    if not files:
        return []
    if not relations_path.exists():
        raise InputFormatError(f"{relations_path} is missing: T-REx questions need its templates")
    templates = read_templates(relations_path)
    facts: list[Fact] = []
    for path in files:
        if path.stem not in templates:
            raise InputFormatError(f"{path}: relation {path.stem} has no template in {relations_path}")
        facts += _template_facts(path, corpus, path.stem, templates[path.stem])
    return facts


def read_lama_uhn(root: Path, relations_path: Path, relations: Collection[str] | None = None) -> list[Fact]:
    """Read LAMA-UHN's ``TREx_UHN/P*.jsonl`` (LAMA's line format) with the templates of relations.jsonl.

    Args:
        root: folder holding ``TREx_UHN/`` (or that folder itself).
        relations_path: LAMA's relations.jsonl.
        relations: read only these relation ids; None reads all.

    Raises:
        InputFormatError: no P*.jsonl files, a relation without template, a malformed line.
    """
    root = Path(root)
    if not lama_uhn_relations(root):
        raise InputFormatError(f"no LAMA-UHN data under {root}: expected TREx_UHN/P*.jsonl")
    return _read_trex(uhn_folder(root), Path(relations_path), "LAMA-UHN", relations)


def read_common_vocab(path: Path) -> set[str]:
    """LAMA's common vocabulary file: one word per line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFormatError(f"cannot read common vocabulary {path}: {exc}") from exc
    return {w.strip() for w in text.splitlines() if w.strip()}


def read_questions_jsonl(path: Path) -> list[Fact]:
    """Plain JSONL: ``{"question": "... [MASK] ...", "answers": [...], "subject"?, "relation"?, "id"?}``.

    The corpus is the file's stem; relation defaults to it, the id to the line number.

    Raises:
        InputFormatError: a question without exactly one [MASK], answers not a non-empty list of strings.
    """
    path = Path(path)
    facts = []
    for lineno, row in read_jsonl(path):
        where = f"{path}:{lineno}"
        question = text_field(row, "question", where)
        if question.count(MASK) != 1:
            raise InputFormatError(f"{where}: the question must contain exactly one {MASK}")
        answers = row.get("answers")
        answers = [answers] if isinstance(answers, str) else answers
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
            raise InputFormatError(f"{where}: field 'answers' must be a non-empty list of strings")
        subject = row.get("subject")
        if subject is not None and not isinstance(subject, str):
            raise InputFormatError(f"{where}: field 'subject' must be a string")
        relation = id_field(row, "relation", where) if "relation" in row else path.stem
        uuid = id_field(row, "id", where) if "id" in row else str(lineno)
        facts.append(Fact(path.stem, relation, question, tuple(answers), subject, uuid))
    return facts


def read_popqa(path: Path, split: str = "test") -> list[Fact]:
    """PopQA, from the official ``popQA.tsv`` or the derived ``{dev, test}`` JSON (``split`` picks one).

    Questions become clozes through ``popqa.TEMPLATES``; popularity is the subject's ``s_pop``. The
    derived JSON has no ``prop``/``subj`` columns: both are parsed back out of the question.

    Raises:
        InputFormatError: a missing column or field, an unknown relation or question pattern.
    """
    return [
        Fact(
            "PopQA",
            r.prop,
            cloze(popqa.TEMPLATES[r.prop], r.subject),
            r.answers,
            r.subject,
            r.id,
            r.popularity,
        )
        for r in popqa.read_rows(Path(path), split)
    ]


def read_facts(
    *,
    lama: Path | None = None,
    corpora: Sequence[str] | None = None,
    lama_uhn: Path | None = None,
    relations: Sequence[str] | None = None,
    relations_file: Path | None = None,
    popqa: Path | None = None,
    split: str = "test",
    questions: Path | None = None,
    per_relation: int | None = None,
) -> list[Fact]:
    """Every fact of the datasets named, in that order; ``per_relation`` keeps the first N of each relation.

    Args:
        lama: LAMA's data folder; ``corpora`` picks some of its corpora (default: all present).
        lama_uhn: LAMA-UHN's folder; its templates come from ``relations_file`` (default: ``lama``'s).
        relations: keep only these relation ids (``P19``, ``place_of_birth``, ``SQuAD``, a PopQA or JSONL
            relation), in every dataset named; matched without regard to case. None keeps all.
        popqa: the PopQA TSV or a derived JSON, of which ``split`` is read.
        questions: plain JSONL facts.

    Raises:
        ConfigError: LAMA-UHN without templates; a relation id that no dataset named holds (the message
            lists the ones they hold).
        InputFormatError: a file that cannot be read as its layout.
    """
    facts: list[Fact] = []
    known: list[str] = []  # relation ids of the datasets named, in their order
    wanted = None if relations is None else canonical_ids(relations, [])
    if lama is not None:
        known += lama_relations(lama, corpora)
        wanted = None if relations is None else canonical_ids(relations, known)
        facts += read_lama(lama, corpora, relations=wanted)
    if lama_uhn is not None:
        templates = relations_file or (lama / "relations.jsonl" if lama else None)
        if templates is None:
            raise ConfigError("--lama-uhn needs --relations-file (or --lama) for the cloze templates")
        known += lama_uhn_relations(lama_uhn)
        wanted = None if relations is None else canonical_ids(relations, known)
        facts += read_lama_uhn(lama_uhn, templates, wanted)
    others: list[Fact] = []
    if popqa is not None:
        others += read_popqa(popqa, split)
    if questions is not None:
        others += read_questions_jsonl(questions)
    known += [r for r in dict.fromkeys(f.relation for f in others) if r not in known]
    if relations is not None:
        wanted = canonical_ids(relations, known)
        unknown = [r for r in relations if r.lower() not in {k.lower() for k in known}]
        if unknown:
            raise ConfigError(unknown_relations(unknown, known))
        others = [f for f in others if f.relation in wanted]
    facts += others
    if per_relation:
        seen: dict[tuple[str, str], int] = {}
        kept = []
        for fact in facts:
            key = (fact.corpus, fact.relation)
            seen[key] = seen.get(key, 0) + 1
            if seen[key] <= per_relation:
                kept.append(fact)
        facts = kept
    return facts
