"""Contexts: which words get masked, windowing of long sentences, grouping into blocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertknn_search.config import Config
from bertknn_search.demo import vocabulary
from bertknn_search.encoding.encoder import Encoder
from bertknn_search.ingest.contexts import build_blocks, encode_rows, fingerprint, make_rows
from bertknn_search.records import Article


@pytest.fixture(scope="module")
def encoder(tiny_model: Path) -> Encoder:
    return Encoder(str(tiny_model), layer=11, device="cpu", max_length=64)


def words_of(rows: list, text: str) -> list[str]:
    return [text[r.start : r.end] for r in rows]


def test_masks_single_wordpiece_words_but_not_punctuation_or_split_words(encoder: Encoder) -> None:
    text = "Zorblat, unknown poet, was born in Quenton."
    rows = make_rows([[text]], encoder, "single-wordpiece", 64)
    assert words_of(rows, text) == ["Zorblat", "poet", "was", "born", "in", "Quenton"]
    mask = encoder.tokenizer.mask_token_id
    for r in rows:
        assert r.input_ids.count(mask) == 1 and r.input_ids[r.mask_position] == mask
        assert encoder.single_token_id(text[r.start : r.end]) == r.token_id


def test_stopword_policy_skips_stopwords(encoder: Encoder) -> None:
    text = "Zorblat was born in Quenton."
    rows = make_rows([[text]], encoder, "single-wordpiece-no-stopwords", 64)
    assert words_of(rows, text) == ["Zorblat", "born", "Quenton"]


def test_unknown_words_are_not_contexts(encoder: Encoder) -> None:
    text = "Zorblat met Xyzzq."  # "met" and "xyzzq" are [UNK] in the tiny vocabulary
    assert words_of(make_rows([[text]], encoder, "single-wordpiece", 64), text) == ["Zorblat"]


def test_long_sentences_are_windowed_not_dropped(encoder: Encoder) -> None:
    words = [f"{w}" for w in (["quenton", "farrowby", "poet", "river"] * 40)]
    text = " ".join(words)
    rows = make_rows([[text]], encoder, "single-wordpiece", 16)
    assert len(rows) == len(words)
    ids = encoder.tokenizer(text, add_special_tokens=False)["input_ids"]
    for pos, r in enumerate(rows):
        assert len(r.input_ids) <= 16
        assert r.token_id == ids[pos]
        # The window is the sentence's tokens around the mask, in order.
        lo = pos - (r.mask_position - 1)
        window = ids[lo : lo + len(r.input_ids) - 2]
        expected = [
            *window[: r.mask_position - 1],
            encoder.tokenizer.mask_token_id,
            *window[r.mask_position :],
        ]
        assert r.input_ids[1:-1] == expected


def test_blocks_group_rows_per_article(encoder: Encoder, base_config: Config) -> None:
    arts = [
        Article("1", "A", "Zorblat was born in Quenton."),
        Article("2", "B", "poet"),
        Article("3", "C", "..."),
    ]
    sentences = [["Zorblat was born in Quenton."], ["poet"], ["..."]]
    rows = make_rows(sentences, encoder, "single-wordpiece", 64)
    vectors = encode_rows(rows, encoder, batch_size=2)
    blocks = build_blocks(arts, sentences, rows, vectors, base_config)
    assert [len(b.contexts) for b in blocks] == [5, 1, 0]
    assert blocks[0].contexts.vectors.shape == (5, encoder.dim)
    assert blocks[0].contexts.sentence_ids.tolist() == [0] * 5
    assert blocks[2].contexts.vectors.shape == (0, encoder.dim)


def test_encoding_order_does_not_depend_on_batching(encoder: Encoder) -> None:
    sents = [["Zorblat was born in Quenton.", "The poet lived near the river north of Farrowby."]]
    rows = make_rows(sents, encoder, "single-wordpiece", 64)
    a = encode_rows(rows, encoder, batch_size=1)
    b = encode_rows(rows, encoder, batch_size=64)
    np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), atol=2e-3)


def test_fingerprint_tracks_text_and_encoding_settings(base_config: Config) -> None:
    art = Article("1", "A", "text")
    assert fingerprint(art, base_config) == fingerprint(Article("1", "A", "text"), base_config)
    assert fingerprint(art, base_config) != fingerprint(Article("1", "A", "text!"), base_config)
    assert fingerprint(art, base_config) != fingerprint(art, base_config.replace(layer=10))


WORDS = [w for w in vocabulary() if not w.startswith("[") and not w.startswith("##")] + [
    "xyzzq",
    "über",
    "東京",
]


@pytest.mark.reliability
@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(WORDS), min_size=0, max_size=60), st.integers(min_value=8, max_value=64))
def test_rows_are_well_formed_for_any_text(tiny_model: Path, words: list[str], max_length: int) -> None:
    encoder = _cached_encoder(str(tiny_model))
    text = " ".join(words)
    rows = make_rows([[text]], encoder, "single-wordpiece", max_length)
    mask = encoder.tokenizer.mask_token_id
    for r in rows:
        assert len(r.input_ids) <= max_length
        assert r.input_ids.count(mask) == 1 and r.input_ids[r.mask_position] == mask
        assert encoder.single_token_id(text[r.start : r.end]) == r.token_id


_ENCODERS: dict[str, Encoder] = {}


def _cached_encoder(path: str) -> Encoder:
    # hypothesis forbids function-scoped fixtures; the tokenizer load is the expensive part.
    return _ENCODERS.setdefault(path, Encoder(path, layer=11, device="cpu", max_length=64))
