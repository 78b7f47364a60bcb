"""Words no answer can be: in the searched sentences, the word where the question has [MASK], when the
model's vocabulary splits it into several wordpieces.

The question's words beside [MASK] (two before it, or two after it when it comes first) are looked for in
the sentences of the nearest neighbours; the word that stands in the [MASK]'s place there is what the
question reads as asking for. "Albert Einstein was born in [MASK]." finds "Einstein was born in Ulm", and
"Ulm" is ``ul ##m`` in BERT's uncased vocabulary: no context of it was stored and no ranking can hold it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from bertknn_search.records import SplitWord

CUE_WORDS = 2  # question words beside [MASK] that a sentence must share: one ("in") matches nearly anything
MAX_WORDS = 3  # words reported per answer
_WORD = re.compile(r"\w+")


def cue(question: str, mask: str = "[MASK]") -> tuple[list[str], bool] | None:
    """The question's words beside [MASK], and whether they come before it; None without any."""
    before, _, after = question.partition(mask)
    left, right = _WORD.findall(before), _WORD.findall(after)
    if left:
        return left[-CUE_WORDS:], True
    if right:
        return right[:CUE_WORDS], False
    return None


def slot_words(question: str, sentence: str, mask: str = "[MASK]") -> list[str]:
    """The words of ``sentence`` that stand where ``question`` has [MASK], matched by the words beside it
    (case and punctuation between words ignored)."""
    found = cue(question, mask)
    if found is None:
        return []
    words, before = found
    joined = r"\W+".join(re.escape(w) for w in words)
    pattern = rf"\b{joined}\W+(\w+)" if before else rf"(\w+)\W+{joined}\b"
    return [m.group(1) for m in re.finditer(pattern, sentence, re.IGNORECASE)]


def split_words(
    question: str,
    sentences: Sequence[tuple[str, str, str]],
    tokenize: Callable[[str], list[str]],
    mask: str = "[MASK]",
) -> list[SplitWord]:
    """The words at [MASK]'s place in ``sentences`` that ``tokenize`` splits in several pieces.

    Args:
        question: the question, with ``mask`` once.
        sentences: (sentence, article id, title), nearest first.
        tokenize: the model's tokenizer (a word -> its wordpieces).

    Returns:
        At most ``MAX_WORDS``, each once (case ignored), in the order of ``sentences``.
    """
    out: list[SplitWord] = []
    seen: set[str] = set()
    for sentence, article_id, title in sentences:
        for word in slot_words(question, sentence, mask):
            if word.lower() in seen:
                continue
            seen.add(word.lower())
            pieces = tokenize(word)
            if len(pieces) > 1:
                out.append(SplitWord(word, pieces, article_id, title))
                if len(out) == MAX_WORDS:
                    return out
    return out
