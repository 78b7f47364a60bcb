"""Demo data: a tiny BertForMaskedLM and a corpus of invented facts no model can know, built on the fly."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PUNCT = list(".,;:!?'\"()-")
FILLER = (
    "the a an of in on at to was is were be born died lived worked works as and or but it he she his her "
    "they their by from for with city town river country capital famous painter farmer poet doctor "
    "teacher sailor singer writer known also later moved there where which who has had many people "
    "year years old new large small north south east west near region family first second after "
    "before during until built named after language speaks spoke plays played instrument"
).split()
PEOPLE = "zorblat mirvane tukosh elvaris brondel quillam vesperine tolgrin aszura dremmick".split()
CITIES = "quenton farrowby lintmere oskavel pradnor hullweck sarnith velcombe gorrash yentil".split()
JOBS = ["painter", "farmer", "poet", "doctor", "teacher", "sailor", "singer", "writer", "painter", "poet"]
PIECES = ["##s", "##ed", "##ing", "##ly", "un", "##known"]


@dataclass(frozen=True)
class Fact:
    person: str
    city: str
    job: str


def vocabulary() -> list[str]:
    words = SPECIALS + PUNCT + FILLER + PEOPLE + CITIES + PIECES + [str(d) for d in range(10)]
    return list(dict.fromkeys(words))


def make_facts() -> list[Fact]:
    return [Fact(p, c, j) for p, c, j in zip(PEOPLE, CITIES, JOBS)]


def person_text(f: Fact) -> str:
    return (
        f"{f.person.title()} was born in {f.city.title()}. "
        f"{f.person.title()} worked as a {f.job} in the north of the country. "
        f"Many people in {f.city.title()} knew {f.person.title()} as a famous {f.job}."
    )


def city_text(f: Fact, rng: random.Random) -> str:
    river = rng.choice(CITIES)
    return (
        f"{f.city.title()} is a small town near the river. "
        f"It was built by a farmer and named after a {rng.choice(JOBS)}. "
        f"The town is north of {river.title()}."
    )


def write_corpus(path: Path, facts: list[Fact], seed: int = 0) -> list[dict[str, str]]:
    """JSONL articles: one per invented person, one per invented city."""
    rng = random.Random(seed)
    rows = []
    for i, f in enumerate(facts):
        rows.append({"id": str(100 + i), "title": f.person.title(), "text": person_text(f)})
        rows.append({"id": str(200 + i), "title": f.city.title(), "text": city_text(f, rng)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return rows


def build_tiny_model(
    out: Path,
    layers: int = 12,
    hidden: int = 64,
    seed: int = 0,
    words: list[str] | None = None,
    max_positions: int = 64,
) -> Path:
    """Save a randomly initialised 12-layer BertForMaskedLM and its uncased tokenizer to ``out``.

    ``words`` replaces the invented-facts vocabulary (whole words only: no wordpieces). ``initializer_range``
    is raised from BERT's 0.02 because at 0.02 a deep random model's state at the
    mask depends on the position alone (rank collapse), so kNN could not tell contexts apart.
    """
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    vocab_file = out / "vocab.txt"
    vocab = vocabulary() if words is None else list(dict.fromkeys(SPECIALS + PUNCT + words))
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab=str(vocab_file), do_lower_case=True)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=max_positions,
        initializer_range=0.1,
    )
    model = BertForMaskedLM(config).eval()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a 1-second save needs no progress bar
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@dataclass(frozen=True)
class DemoFiles:
    """What ``prepare_demo`` writes: a model, a corpus, and the questions to ask it."""

    model: Path
    corpus: Path
    questions: list[tuple[str, str]]  # (cloze question, subject)


def prepare_demo(out: Path) -> DemoFiles:
    """Write the tiny model and the invented-facts corpus under ``out`` (reused if already there)."""
    facts = make_facts()
    model = out / "model"
    if not (model / "config.json").exists():
        build_tiny_model(model)
    corpus = out / "corpus.jsonl"
    write_corpus(corpus, facts)
    questions = [(f"{f.person.title()} was born in [MASK].", f.person.title()) for f in facts[:3]]
    return DemoFiles(model, corpus, questions)


@dataclass(frozen=True)
class DemoRun:
    """What ``run_demo`` did: the ingest summary, the answers, and the settings to query it again."""

    summary: Any  # ingest.pipeline.IngestSummary
    answers: list[Any]  # records.Answer
    config: Any  # config.Config


def run_demo(out: Path, progress: bool = True) -> DemoRun:
    """Build the tiny model and corpus under ``out``, ingest them into ``out/index`` and ask the questions."""
    from bertknn_search.ingest.pipeline import ingest
    from bertknn_search.query.search import Searcher
    from bertknn_search.records import Question
    from bertknn_search.session import resolve_config

    files = prepare_demo(out)
    index = out / "index"
    if (index / "index.sqlite").exists():
        # The demo owns this index and builds it in a second: start clean, so an index left by an older
        # version (another schema) never stops the demo.
        shutil.rmtree(index)
    # The tiny random model's distances are ~100x smaller than BERT-base's; l=1 plays the role l=6
    # plays there (the nearest context dominates). A real model uses the paper's l=6.
    flags = {"model": str(files.model), "index": index, "device": "cpu", "max_length": 64, "temperature": 1.0}
    config = resolve_config(flags).config
    summary = ingest(files.corpus, config, progress=progress)
    searcher = Searcher.open(config)
    try:
        answers = searcher.answer_batch([Question(q, s) for q, s in files.questions])
    finally:
        searcher.close()
    return DemoRun(summary, answers, config)
