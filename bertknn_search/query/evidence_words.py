"""The words a question asks the evidence of (``evidence_for``): their bounds and their check.

Standard library only: ``query --server --evidence-for`` checks them without importing numpy.
"""

from __future__ import annotations

from collections.abc import Sequence

from bertknn_search.errors import QuestionError

# Words one question may ask evidence for, and their length: each costs a few sentence reads and, for
# diverse evidence, its neighbours encoded again (at most k of them), as a top answer does.
MAX_EVIDENCE_FOR = 10
MAX_EVIDENCE_WORD = 100


def checked_words(words: Sequence[str]) -> tuple[str, ...]:
    """``words`` for ``evidence_for``: stripped, blanks and repeats dropped, in order.

    Raises:
        QuestionError: more than ``MAX_EVIDENCE_FOR`` words, or one longer than ``MAX_EVIDENCE_WORD``.
    """
    out = tuple(dict.fromkeys(w.strip() for w in words if w.strip()))
    if len(out) > MAX_EVIDENCE_FOR:
        raise QuestionError(
            f"evidence is shown for at most {MAX_EVIDENCE_FOR} words per question, {len(out)} were asked"
        )
    long = next((w for w in out if len(w) > MAX_EVIDENCE_WORD), None)
    if long is not None:
        raise QuestionError(
            f"a word to show evidence for holds at most {MAX_EVIDENCE_WORD} characters, "
            f"{long[:20]!r}… holds {len(long)}"
        )
    return out
