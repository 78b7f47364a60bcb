"""Text codec: an article's stored text (or its sentences' JSON) <-> a zstd frame, with a trained dictionary.

Each text is compressed on its own, so articles are still added, replaced and read one by one; a
dictionary trained once per index on its first large write (``train``) gives short articles the
vocabulary a whole corpus shares. A stored value is either ``bytes`` (a zstd frame, checksummed, naming
its dictionary by id) or ``str`` (the text itself: rows written before compression, and texts that zstd
would not make smaller), so old rows and new ones mix in one column.

Measured by ``benchmarks/bench_text.py`` (docs/performance.md, "Text store"): level 3 with a 110 KB
dictionary stores real Wikipedia text of Wikipedia's article lengths in 0.39 of its bytes (0.47 without a
dictionary; levels 9 and 19 store 7% and 12% less at 5 and 30 times the compression time; level 1 saves
no time at these sizes) and decompresses an article in about 7 microseconds.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import zstandard

LEVEL = 3
DICTIONARY_BYTES = 112_640  # zstd's default dictionary size (110 KB)
TRAIN_MIN_ARTICLES = 512  # the fewest texts one write needs to train the index's dictionary
TRAIN_MAX_ARTICLES = 4_000  # a sample of the write, spread over it, is enough (and trains in < 1 s)
TRAIN_MAX_CHARS = 16_000_000
# No stored value decompresses to more than this, whatever length its row records (a forged n_chars
# must not make a reader allocate hundreds of MiB): 64 times Wikipedia's page limit.
MAX_FRAME_BYTES = 128 * 1024 * 1024


class TextCodec:
    """Packs and unpacks texts with one index's dictionary (or none); safe to share between threads."""

    def __init__(self, dictionary: bytes | None = None) -> None:
        self.dictionary = dictionary
        self._dict = None if dictionary is None else zstandard.ZstdCompressionDict(dictionary)
        self.dict_id = 0 if self._dict is None else self._dict.dict_id()
        self._local = threading.local()  # zstd contexts are not safe to use from two threads at once

    def _contexts(self) -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
        held = getattr(self._local, "contexts", None)
        if held is None:
            compressor = zstandard.ZstdCompressor(level=LEVEL, dict_data=self._dict, write_checksum=True)
            held = compressor, zstandard.ZstdDecompressor(dict_data=self._dict)
            self._local.contexts = held
        return held

    def pack(self, text: str) -> str | bytes:
        """What to store for ``text``: its zstd frame, or the text itself when that is no larger."""
        raw = text.encode("utf-8")
        packed = self._contexts()[0].compress(raw)
        return packed if len(packed) < len(raw) else text

    def unpack(self, stored: str | bytes, max_bytes: int | None = None) -> str:
        """The text a stored value holds.

        Args:
            stored: a value ``pack`` made (or a plain text row).
            max_bytes: the most UTF-8 bytes the text may hold (what its recorded length allows). A frame
                whose header says it holds more, or does not say, is refused before anything is
                decompressed; zstd writes no more than a frame's header says (a frame that holds more
                is an error), so decompression never goes past the bound. None: only the absolute bound,
                ``MAX_FRAME_BYTES``, which holds for every value.

        Raises:
            ValueError: the value is damaged, larger than ``max_bytes``, not text, or was compressed with
                a dictionary this codec lacks.
        """
        if isinstance(stored, str):
            return stored
        if not isinstance(stored, bytes):
            raise ValueError(f"a {type(stored).__name__} where text was stored")
        try:
            frame = zstandard.get_frame_parameters(stored)
            if frame.dict_id and frame.dict_id != self.dict_id:
                raise ValueError(f"it needs zstd dictionary {frame.dict_id}, which the index does not hold")
            size = frame.content_size
            if max_bytes is not None and size == zstandard.CONTENTSIZE_UNKNOWN:  # all of ``pack``'s say it
                raise ValueError("not a zstd frame of UTF-8 text: its header does not say its size")
            if max_bytes is not None and size > max_bytes:
                raise ValueError(
                    f"its zstd frame holds {size:,} bytes, more than the {max_bytes:,} its recorded length"
                    " allows"
                )
            if size != zstandard.CONTENTSIZE_UNKNOWN and size > MAX_FRAME_BYTES:
                raise ValueError(
                    f"its zstd frame holds {size:,} bytes, more than the {MAX_FRAME_BYTES:,} any stored text"
                    " may hold"
                )
            # A frame that does not say its size is decompressed only up to the absolute bound.
            return self._contexts()[1].decompress(stored, max_output_size=MAX_FRAME_BYTES).decode("utf-8")
        except (zstandard.ZstdError, UnicodeDecodeError) as exc:
            raise ValueError(f"not a zstd frame of UTF-8 text: {exc}") from exc


def stored_size(stored: str | bytes) -> int:
    """Bytes a stored value takes."""
    return len(stored) if isinstance(stored, bytes) else len(stored.encode("utf-8"))


def train(texts: Sequence[str]) -> bytes | None:
    """A dictionary trained on a sample of ``texts``; None when they are too few to train one."""
    if len(texts) < TRAIN_MIN_ARTICLES:
        return None
    step = max(1, len(texts) // TRAIN_MAX_ARTICLES)
    sample, chars = [], 0
    for text in texts[::step]:
        if chars >= TRAIN_MAX_CHARS:
            break
        sample.append(text.encode("utf-8"))
        chars += len(text)
    try:
        return zstandard.train_dictionary(DICTIONARY_BYTES, sample).as_bytes()
    except zstandard.ZstdError:  # texts too short or too alike to train on: compress without one
        return None
