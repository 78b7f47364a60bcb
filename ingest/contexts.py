"""Contexts: sentences -> masked rows -> (key vector, value token) blocks, one per article."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bertknn_search.config import Config
from bertknn_search.encoder import Encoder
from bertknn_search.ingest.prepare import article_fingerprint, fingerprint_settings
from bertknn_search.records import Article, ContextBlock, EncodedArticle
from bertknn_search.stopwords import STOPWORDS, is_punctuation


@dataclass(frozen=True)
class MaskedRow:
    """One model input: a sentence (or a window of it) with one word replaced by the mask token."""

    article: int  # index into the batch of articles being encoded
    sentence: int
    input_ids: list[int]
    mask_position: int
    token_id: int
    start: int
    end: int
    windowed: bool = False  # the sentence is longer than the model takes: this row is a window of it


def fingerprint(article: Article, config: Config) -> str:
    """Hash of what decides an article's contexts: equal fingerprints mean nothing to redo."""
    settings = fingerprint_settings(config.model, config.layer, config.mask_policy, config.max_length)
    return article_fingerprint(article, settings)


def maskable(word: str, policy: str) -> bool:
    """Whether a single-wordpiece word gets a context under ``policy``.

    Punctuation is never stored: it can never be an answer and only crowds out words among the k
    neighbours. The reference also skipped stopwords; that halves the store and is a policy option.
    """
    if is_punctuation(word):
        return False
    return not (policy == "single-wordpiece-no-stopwords" and word.lower() in STOPWORDS)


def make_rows(
    sentences: Sequence[Sequence[str]], encoder: Encoder, policy: str, max_length: int
) -> list[MaskedRow]:
    """Every maskable single-wordpiece word occurrence of every sentence, as a masked model input.

    Args:
        sentences: per article, its sentences.
        encoder: gives the tokenizer and the special token ids.
        policy: the mask policy (``Config.mask_policy``).
        max_length: model input limit; longer sentences are windowed around each mask
            ([mask − w/2, mask + w/2), shifted to stay inside the sentence), as the reference does.

    Returns:
        Rows in article, sentence, position order.
    """
    tok = encoder.tokenizer
    cls_id, sep_id, mask_id, unk_id = tok.cls_token_id, tok.sep_token_id, tok.mask_token_id, tok.unk_token_id
    width = max_length - 2
    flat = [(a, s, text) for a, sents in enumerate(sentences) for s, text in enumerate(sents)]
    if not flat:
        return []
    enc = tok([t for _, _, t in flat], add_special_tokens=False, return_offsets_mapping=True)
    rows: list[MaskedRow] = []
    for i, (a, s, text) in enumerate(flat):
        ids: list[int] = enc["input_ids"][i]
        offsets = enc["offset_mapping"][i]
        word_ids = enc.word_ids(i)
        counts: dict[int, int] = {}
        for w in word_ids:
            if w is not None:
                counts[w] = counts.get(w, 0) + 1
        for pos, (tid, w) in enumerate(zip(ids, word_ids)):
            if w is None or counts[w] != 1 or tid == unk_id:
                continue
            start, end = offsets[pos]
            if not maskable(text[start:end], policy):
                continue
            lo = 0 if len(ids) <= width else min(max(pos - width // 2, 0), len(ids) - width)
            window = ids[lo : lo + width]
            window = [*window[: pos - lo], mask_id, *window[pos - lo + 1 :]]
            windowed = len(ids) > width
            rows.append(MaskedRow(a, s, [cls_id, *window, sep_id], pos - lo + 1, tid, start, end, windowed))
    return rows


def encode_rows(
    rows: Sequence[MaskedRow],
    encoder: Encoder,
    batch_size: int,
    on_batch: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Key vectors for ``rows``, batched across sentences by length to keep padding small.

    Args:
        rows: the masked rows to encode.
        encoder: the model.
        batch_size: rows per forward pass.
        on_batch: called with each finished batch's row count (progress within a chunk).

    Returns:
        (len(rows), dim) float16, in the order of ``rows``.
    """
    out = np.zeros((len(rows), encoder.dim), dtype=np.float16)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].input_ids))
    slices = [order[lo : lo + batch_size] for lo in range(0, len(order), batch_size)]
    batches = (([rows[i].input_ids for i in idx], [rows[i].mask_position for i in idx]) for idx in slices)
    for idx, states in zip(slices, encoder.key_states_many(batches)):
        out[idx] = states
        if on_batch is not None:
            on_batch(len(idx))
    return out


def build_blocks(
    articles: Sequence[Article],
    sentences: Sequence[list[str]],
    rows: Sequence[MaskedRow],
    vectors: np.ndarray,
    config: Config,
) -> list[EncodedArticle]:
    """Group encoded rows back into one ContextBlock per article."""
    owner = np.array([r.article for r in rows], dtype=np.int64)
    column = {
        "token_ids": np.array([r.token_id for r in rows], dtype=np.int32),
        "sentence_ids": np.array([r.sentence for r in rows], dtype=np.int32),
        "starts": np.array([r.start for r in rows], dtype=np.int32),
        "ends": np.array([r.end for r in rows], dtype=np.int32),
    }
    out = []
    for a, article in enumerate(articles):
        sel = np.flatnonzero(owner == a)
        block = ContextBlock(
            sentences=list(sentences[a]),
            vectors=vectors[sel],
            token_ids=column["token_ids"][sel],
            sentence_ids=column["sentence_ids"][sel],
            starts=column["starts"][sel],
            ends=column["ends"][sel],
        )
        out.append(EncodedArticle(article, block, fingerprint(article, config)))
    return out
