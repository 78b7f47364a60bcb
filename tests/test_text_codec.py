"""Text codec: stored texts round-trip, plain rows read as they are, damage is a ValueError naming why."""

from __future__ import annotations

import random

import pytest
import zstandard

from bertknn_search.backends.embedded import text_codec
from bertknn_search.backends.embedded.text_codec import TextCodec, stored_size, train

LONG = "Zorblat was born in Quenton, a town on the river Farrow. " * 40
TEXTS = [
    "",
    "a",
    LONG,
    "Zürich, São Paulo, Kraków and Þingvellir; 東京 is 東京都; Ελλάδα; emoji 🦉 and a lone é. " * 20,
    "line one\nline two\ttabbed\x00nul " * 30,
]


def corpus(n: int, seed: int = 0) -> list[str]:
    """Texts that share a vocabulary, as a corpus's articles do (what a dictionary learns)."""
    rng = random.Random(seed)
    words = [f"{w}{i}" for i, w in enumerate(["quenton", "farrow", "zorblat", "mirvane", "poet"] * 60)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(40, 200))) + "." for _ in range(n)]


@pytest.fixture(scope="module")
def dictionary() -> bytes:
    trained = train(corpus(text_codec.TRAIN_MIN_ARTICLES))
    assert trained is not None
    return trained


@pytest.mark.parametrize("with_dictionary", [False, True])
def test_texts_round_trip(with_dictionary: bool, dictionary: bytes) -> None:
    codec = TextCodec(dictionary if with_dictionary else None)
    for text in [*TEXTS, *corpus(20, seed=1)]:
        stored = codec.pack(text)
        assert codec.unpack(stored) == text
        assert stored_size(stored) <= len(text.encode("utf-8"))


def test_a_text_zstd_cannot_shrink_is_stored_as_it_is_and_a_long_one_compressed() -> None:
    codec = TextCodec()
    assert codec.pack("") == "" and codec.pack("a short one") == "a short one"
    packed = codec.pack(LONG)
    assert isinstance(packed, bytes) and len(packed) < len(LONG) / 10


def test_a_dictionary_makes_short_texts_smaller(dictionary: bytes) -> None:
    texts = corpus(50, seed=2)
    plain = sum(stored_size(TextCodec().pack(t)) for t in texts)
    trained = sum(stored_size(TextCodec(dictionary).pack(t)) for t in texts)
    assert trained < 0.9 * plain


def test_too_few_texts_train_no_dictionary() -> None:
    assert train(corpus(text_codec.TRAIN_MIN_ARTICLES - 1)) is None


def test_rows_stored_before_compression_read_as_they_are(dictionary: bytes) -> None:
    assert (
        TextCodec(dictionary).unpack("plain text from a version 4 index")
        == "plain text from a version 4 index"
    )
    # Rows compressed before the index had a dictionary are read once it has one.
    before = TextCodec().pack(LONG)
    assert TextCodec(dictionary).unpack(before) == LONG


def test_damaged_values_are_value_errors_that_say_why(dictionary: bytes) -> None:
    packed = TextCodec().pack(LONG)
    assert isinstance(packed, bytes)
    flipped = bytearray(packed)
    flipped[len(flipped) // 2] ^= 0xFF
    for damaged in (packed[: len(packed) // 2], bytes(flipped), b"\x00\x01\x02", b""):
        with pytest.raises(ValueError, match="not a zstd frame of UTF-8 text"):
            TextCodec().unpack(damaged)
    not_utf8 = zstandard.ZstdCompressor().compress(b"caf\xe9" * 10)
    with pytest.raises(ValueError, match="not a zstd frame of UTF-8 text: 'utf-8' codec"):
        TextCodec().unpack(not_utf8)
    with pytest.raises(ValueError, match="a int where text was stored"):
        TextCodec().unpack(42)  # type: ignore[arg-type]


def test_a_frame_of_another_dictionary_is_refused_by_name(dictionary: bytes) -> None:
    packed = TextCodec(dictionary).pack(corpus(1, seed=3)[0])
    assert isinstance(packed, bytes)
    wanted = zstandard.ZstdCompressionDict(dictionary).dict_id()
    with pytest.raises(ValueError, match=f"needs zstd dictionary {wanted}, which the index does not hold"):
        TextCodec().unpack(packed)
