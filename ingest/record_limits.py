"""What every backend can store of an article: one check before any write, the same on every backend.

OpenSearch and Elasticsearch refuse a document id over 512 bytes (a context's id is the article's with its
fingerprint and row added) and a keyword term over 32,766 bytes (the title's exact-match sub-field), and
one such document made the engine refuse its whole bulk request, on every re-run. The embedded store
takes both, but an index must not hold an article one backend has and another has not: such an article
is skipped on every backend alike, with one warning line naming it, and counted in the run's summary
(``unstorable``). A re-run skips it again and gets past it.
"""

from __future__ import annotations

from bertknn_search.records import Article

# A context's engine id is "<article id>:<fingerprint, 20 characters>:<row>": 512 bytes, less 22 for the
# fingerprint and separators, less 10 digits for a row number.
MAX_ID_BYTES = 480
# The title's keyword sub-field takes 32,766 bytes after lowercasing and folding, which can make a
# character's UTF-8 form up to half as long again: half the term limit is safe (Wikipedia's own
# titles stop at 255 bytes).
MAX_TITLE_BYTES = 16_383
SHOWN = 60  # characters of an id or title shown in a warning


def unstorable(article: Article) -> str | None:
    """Why ``article`` cannot be stored on every backend, or None when it can."""
    id_bytes = len(article.id.encode("utf-8", "surrogatepass"))
    if id_bytes > MAX_ID_BYTES:
        return (
            f"its id holds {id_bytes:,} bytes, more than the {MAX_ID_BYTES} an article id may"
            " (a search engine's document ids hold 512, with the fingerprint and row added)"
        )
    title_bytes = len(article.title.encode("utf-8", "surrogatepass"))
    if title_bytes > MAX_TITLE_BYTES:
        return (
            f"its title holds {title_bytes:,} bytes, more than the {MAX_TITLE_BYTES:,} a title may"
            " (a search engine indexes a title as one term of at most 32,766 bytes)"
        )
    return None


def warning(where: str, article: Article, why: str) -> str:
    """The one line said about a skipped article (its id and title cut short; ``warn`` adds "warning: ")."""
    return f"{where}: article {_short(article.id)!r} ({_short(article.title)!r}): {why}: skipped"


def _short(text: str) -> str:
    return text if len(text) <= SHOWN else text[: SHOWN - 1] + "…"
