"""The embedded store's stored texts: the zstd codec and its dictionary, and texts and sentence lists read
back and checked against their article's row before anyone uses them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from bertknn_search.backends.base import text_fits_fingerprint
from bertknn_search.backends.embedded.schema import (
    DICTIONARY_KEY,
    SENTENCES_BYTES_PER_CHAR,
    SENTENCES_SLACK,
    UTF8_BYTES_PER_CHAR,
)
from bertknn_search.backends.embedded.text_codec import TextCodec, train
from bertknn_search.errors import IndexCorruptError
from bertknn_search.records import Article, IndexMeta


class TextStoreSide:
    """The stored-text methods of ``EmbeddedBackend``, over the file and codec it provides."""

    # Provided by EmbeddedBackend.
    path: Path
    _codec: TextCodec
    _meta: IndexMeta

    def _text_codec(self, cur: sqlite3.Cursor) -> TextCodec:
        """The codec with the index's dictionary, once one is stored (it never changes after)."""
        if self._codec.dictionary is None:
            row = cur.execute("SELECT value FROM meta WHERE key = ?", (DICTIONARY_KEY,)).fetchone()
            if row is not None and isinstance(row[0], bytes):
                self._codec = TextCodec(row[0])
        return self._codec

    def _train_codec(self, cur: sqlite3.Cursor, texts: list[str]) -> None:
        """Train and store the index's dictionary on the first write with enough texts to train on."""
        if self._text_codec(cur).dictionary is not None:
            return
        dictionary = train(texts)
        if dictionary is not None:
            cur.execute("INSERT INTO meta VALUES (?, ?)", (DICTIONARY_KEY, dictionary))
            self._codec = TextCodec(dictionary)

    def _unpack(self, stored: str | bytes, what: str, max_bytes: int | None = None) -> str:
        """A stored text or sentence list of at most ``max_bytes`` bytes (``TextCodec.unpack``); ``what``
        names it in the error ("text of article 'x' is")."""
        try:
            return self._codec.unpack(stored, max_bytes)
        except ValueError as exc:
            raise self._damaged(what, str(exc)) from exc

    def _damaged(self, what: str, why: str) -> IndexCorruptError:
        return IndexCorruptError(
            f"index at {self.path}: the stored {what} damaged ({why}); add that article again or rebuild"
            " the index with ingest"
        )

    def _article_text(
        self,
        article_id: str,
        title: str,
        stored: str | bytes,
        n_chars: int,
        fingerprint: str,
        popularity: float | None,
    ) -> str:
        """An article's stored text, checked against its row in ``articles``.

        Decompressed only up to the bytes its recorded length (``n_chars``) allows, it must have that
        many characters, and, where the article's fingerprint is one ingest computed (20 hex digits of
        ``article_fingerprint``), give that fingerprint again with the index's settings, its title and
        popularity: a frame or text of another article (or an integer, which SQLite gives back as text)
        is an IndexCorruptError naming the article, never another article's text.
        """
        what = f"text of article {article_id!r} is"
        text = self._unpack(stored, what, UTF8_BYTES_PER_CHAR * max(n_chars, 0))
        if len(text) != n_chars:
            raise self._damaged(what, f"{len(text):,} characters where the article records {n_chars:,}")
        if not text_fits_fingerprint(Article(article_id, title, text, popularity), fingerprint, self._meta):
            raise self._damaged(what, "not the text its article's fingerprint was made from")
        return text

    def _sentence_list(self, article_id: str, stored: str | bytes, n_chars: int | None = None) -> list[str]:
        """An article's stored sentence list; decompressed only up to what ``n_chars`` characters allow."""
        bound = None if n_chars is None else SENTENCES_BYTES_PER_CHAR * max(n_chars, 0) + SENTENCES_SLACK
        try:
            value = json.loads(self._unpack(stored, f"sentences of article {article_id!r} are", bound))
        except (TypeError, ValueError) as exc:
            value = exc
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise IndexCorruptError(
                f"index at {self.path}: the stored sentences of article {article_id!r} are damaged"
                f" ({value if isinstance(value, Exception) else 'not a list of strings'});"
                " add that article again or rebuild the index with ingest"
            )
        return value
