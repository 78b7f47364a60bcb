"""Text that UTF-8 cannot encode: lone surrogates, from bad JSON escapes or undecodable argument bytes."""

from __future__ import annotations


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
