"""How common an answer word is in English, on the Zipf scale (log10 of its count per billion words).

A fact's answer is mostly a name ('glasgow' 4.2, 'ibm' 3.9), and a wrong kNN answer is often a common
word of the sentence ('based' 5.5, 'born' 5.1, 'studied' 4.5). A model with an MLM head knows this
(``log_bert_ratio``); without one (all-MiniLM-L6-v2) nothing else in an answer's signals does, so its
confidence reads how far the word is above ``COMMON`` (issue 49; docs/evaluation.md#confidence).

The frequencies are wordfreq's (Speer et al.: Wikipedia, subtitles, news, books and the web merged, so
no one corpus's habits decide), its "small" English list, which holds words down to Zipf 3 (below, a
word reads 0; only words above ``COMMON`` move ``p``). The list is read here from wordfreq's own data
file, whose format its README documents: wordfreq's ``zipf_frequency`` first imports ftfy and langcodes
for tokenizing, about 0.3 s of a process's first answer, and a single word needs none of it (the tests
check that every word of BERT's vocabulary reads as ``zipf_frequency`` reads it). Words are English: a
multilingual index's answers in other languages read as rare (0), which the fit takes as a name.
"""

from __future__ import annotations

import gzip
import importlib.util
from functools import cache
from pathlib import Path

import msgpack

LANGUAGE = "en"
WORDLIST = "small"
# Zipf 5 is 100 per million words: names of places and companies sit under it, the common words a
# sentence holds around a fact above it. Chosen on kinds left out among 4, 4.5, 5 and 5.5 (the most
# kinds with AUROC >= 0.75 and ECE within chance), then checked on held-out facts.
COMMON = 5.0


@cache
def _table() -> dict[str, float]:
    """wordfreq's list as word -> Zipf: its "cB" format is a header, then one list of words per
    centibel of frequency below 1 (the i-th list: frequency 10 ** (-i / 100), Zipf 9 - i / 100)."""
    spec = importlib.util.find_spec("wordfreq")  # found, not imported (see the module's docstring)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("wordfreq is not installed: run `make setup`")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / f"{WORDLIST}_{LANGUAGE}.msgpack.gz"
    header, *bins = msgpack.unpackb(gzip.decompress(path.read_bytes()), raw=False)
    if header.get("format") != "cB":
        raise ValueError(f"{path}: not wordfreq's cB format ({header})")
    table: dict[str, float] = {}
    for i, words in enumerate(bins):
        for word in words:
            table.setdefault(word, round(9 - i / 100, 2))
    return table


def zipf(word: str) -> float | None:
    """``word``'s Zipf frequency in English (0: rarer than the list holds); None for what is no word
    to look up: a continuation wordpiece (``##s``), nothing, or digits (wordfreq spreads numbers over
    bins of digits; a number's kind is ``answer_kinds``' business)."""
    text = word.strip()
    if not text or text.startswith("##") or any(c.isdigit() for c in text):
        return None
    return _table().get(text.casefold(), 0.0)


def above_common(value: float | None) -> float | None:
    """How far a Zipf frequency is above ``COMMON`` (0 under it); None where it is not known."""
    return None if value is None else max(value - COMMON, 0.0)
