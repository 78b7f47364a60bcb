"""What the server and its client (``query --server``) share, in the standard library alone.

The client imports this and not the request schemas (pydantic) or the app (FastAPI): asking a server
must cost a fraction of a second, not the imports of the stack that answers.
"""

from __future__ import annotations

from pathlib import Path

MAX_QUESTIONS = 1024  # per request; more are sent in several requests (query --server does)


def read_token(path: Path) -> str:
    """The token: the file's first line, which must not be empty (``serve`` and ``query --server``).

    Raises:
        ConfigError: unreadable or empty.
    """
    from bertknn_search.errors import ConfigError

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read --token-file {path}: {exc}") from exc
    return token_of(text, path)


def token_of(text: str, path: Path) -> str:
    """A token file's first line, stripped.

    Raises:
        ConfigError: it is empty.
    """
    from bertknn_search.errors import ConfigError

    lines = text.splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise ConfigError(f"--token-file {path} is empty; write the token on its first line")
    return token
