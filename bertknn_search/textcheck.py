"""Checks of text that need no model: text UTF-8 cannot encode (lone surrogates, from bad JSON escapes or
undecodable argument bytes), and the shape of a cloze question."""

from __future__ import annotations

import re

from bertknn_search.errors import QuestionError

MASK = "[MASK]"
_MASK_ANY_CASE = re.compile(re.escape(MASK), re.IGNORECASE)
_OTHER_MASKS = re.compile(r"<mask>|\{mask\}|\[blank\]|_{3,}", re.IGNORECASE)  # RoBERTa's, templates'


def check_question(question: str) -> str:
    """``question`` stripped, when it is text with exactly one [MASK]; checked before any model loads.

    Raises:
        QuestionError: undecodable text, empty, no [MASK] (naming a [mask] in another case), or several.
    """
    text = question.strip()
    bad = first_unencodable(text)
    if bad is not None:
        raise QuestionError(
            f"the question is not valid text: {describe_unencodable(text, bad, from_bytes=True)}"
        )
    if not text:
        raise QuestionError("the question is empty; write a sentence with one [MASK]")
    count = text.count(MASK)
    if count == 0 and _MASK_ANY_CASE.search(text):
        found = _MASK_ANY_CASE.search(text)
        assert found is not None
        raise QuestionError(f"the question has {found[0]!r}: did you mean {MASK} (upper case)? {text!r}")
    if count == 0 and _OTHER_MASKS.search(text):
        found = _OTHER_MASKS.search(text)
        assert found is not None
        raise QuestionError(f"the question has {found[0]!r}: did you mean {MASK} (BERT's mask)? {text!r}")
    if count != 1:
        raise QuestionError(f"the question must contain exactly one {MASK}, found {count}: {text!r}")
    return text


def first_unencodable(text: str) -> int | None:
    """Index of the first character of ``text`` that UTF-8 cannot encode, or None when there is none."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def describe_unencodable(text: str, index: int, from_bytes: bool = False) -> str:
    """Name the character at ``index`` for an error message.

    Args:
        text: the text.
        index: where ``first_unencodable`` found the character.
        from_bytes: ``text`` was decoded by Python from bytes (a command-line argument), which keeps
            bytes that are not UTF-8 as surrogates U+DC80–U+DCFF (PEP 383): name the byte instead.
    """
    code = ord(text[index])
    if from_bytes and 0xDC80 <= code <= 0xDCFF:
        return f"byte 0x{code - 0xDC00:02x} at character {index + 1} is not UTF-8"
    return f"character {index + 1} is a lone surrogate (U+{code:04X}), not text"
