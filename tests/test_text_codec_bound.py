"""No stored value decompresses past an absolute bound, whatever length its row records (issue 42: a
forged ``n_chars`` let a 256 MiB frame be decompressed before it was refused)."""

from __future__ import annotations

import pytest
import zstandard

from bertknn_search.backends.embedded import text_codec
from bertknn_search.backends.embedded.text_codec import TextCodec


def test_a_frame_past_the_absolute_bound_is_refused_whatever_the_recorded_length_allows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(text_codec, "MAX_FRAME_BYTES", 4096)
    codec = TextCodec()
    large = codec.pack("word " * 2000)  # 10,000 bytes of text
    assert isinstance(large, bytes)
    for allowed in (10**9, None):  # a forged length, or none at all
        with pytest.raises(
            ValueError, match="holds 10,000 bytes, more than the 4,096 any stored text may hold"
        ):
            codec.unpack(large, allowed)
    assert codec.unpack(codec.pack("word " * 800), 10**9) == "word " * 800  # under the bound: read


def test_a_frame_that_does_not_say_its_size_is_cut_at_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(text_codec, "MAX_FRAME_BYTES", 4096)
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(b"a" * 10_000)
    with pytest.raises(ValueError, match="not a zstd frame of UTF-8 text"):
        TextCodec().unpack(unsized)
