"""Errors the library raises; each message is one line saying what went wrong and what to do."""

from __future__ import annotations


class BertKnnError(Exception):
    """Base class: the CLI turns these into a one-line message and exit code 1."""


class ConfigError(BertKnnError):
    """A setting is out of range or contradicts another."""


class QuestionError(BertKnnError):
    """A question cannot be answered as asked (no [MASK], several, empty)."""


class IndexNotFoundError(BertKnnError):
    """No index exists where one was expected."""


class IndexCorruptError(BertKnnError):
    """The index exists but cannot be read."""


class IndexMismatchError(BertKnnError):
    """The index was built with another model, layer or dimension than the one asked for."""


class InputFormatError(BertKnnError):
    """A corpus or dataset file cannot be read: unknown format, truncated, not UTF-8."""


class ModelLoadError(BertKnnError):
    """The masked language model or its tokenizer cannot be loaded."""


class BackendError(BertKnnError):
    """The storage backend failed (disk full, cluster unreachable after retries, bulk rejected)."""


class WordCollisionError(BertKnnError):
    """Two different words of several wordpieces have the same key: refused rather than merged."""


class LazyIndexError(BertKnnError):
    """An operation needs every context of the corpus, and a lazy index encodes them only on demand."""


class IndexIncompleteError(IndexNotFoundError):
    """An index whose creation was interrupted: it holds no data and ``ingest wiki`` creates it afresh."""


class StoreWriteError(BackendError):
    """One batch of articles could not be written; none of it was, and the index keeps what it held."""

    def __init__(self, location: str, reason: str, articles: int) -> None:
        self.location = location
        self.reason = reason
        self.articles = articles
        super().__init__(
            f"cannot write to index at {location}: {reason}; none of these {articles:,} articles was written"
        )


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interruption so that a command stops as cleanly as on Ctrl-C."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a run that writes; ``kept`` articles it wrote before stay written."""

    def __init__(self, kept: int, terminated: bool) -> None:
        super().__init__(kept)
        self.kept = kept
        self.terminated = terminated
