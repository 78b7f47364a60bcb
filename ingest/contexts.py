"""Contexts: sentences -> masked rows -> (key vector, value token) blocks, one per article."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bertknn_search.config import Config
from bertknn_search.encoding.encoder import Encoder
from bertknn_search.ingest.prepare import article_fingerprint, fingerprint_settings
from bertknn_search.records import Article, ContextBlock, EncodedArticle
from bertknn_search.stopwords import STOPWORDS, is_punctuation
from bertknn_search.values import MAX_PIECES, whole_words, word_value


@dataclass(frozen=True)
class MaskedRow:
    """One model input: a sentence (or a window of it) with one word replaced by the mask token."""

    article: int  # index into the batch of articles being encoded
    sentence: int
    input_ids: list[int]
    mask_position: int
    token_id: int  # the value (``values.word_value``): the wordpiece's id, or a word's hash
    start: int
    end: int
    windowed: bool = False  # the sentence is longer than the model takes: this row is a window of it


def fingerprint(article: Article, config: Config) -> str:
    """Hash of what decides an article's contexts: equal fingerprints mean nothing to redo."""
    settings = fingerprint_settings(config.model, config.layer, config.mask_policy, config.max_length)
    return article_fingerprint(article, settings)


def maskable(word: str, policy: str) -> bool:
    """Whether a word (one the policy's piece rule admits) gets a context under ``policy``.

    Punctuation is never stored: it can never be an answer and only crowds out words among the k
    neighbours. The reference also skipped stopwords; that halves the store and is a policy option.
    """
    if is_punctuation(word):
        return False
    return not (policy.endswith("-no-stopwords") and word.lower() in STOPWORDS)


TOKENIZE_SENTENCES = 512  # sentences tokenised at once by make_row_table


@dataclass(frozen=True)
class RowTable:
    """Every masked row of some articles, kept as where each mask goes rather than as model inputs.

    A long article has a few hundred thousand rows; as model inputs (a window of its sentence each) they
    would take gigabytes, so inputs are made only for the rows about to be encoded (``rows``). The
    columns are parallel, one entry per row, in article, sentence, position order.
    """

    tokens: list[np.ndarray]  # per sentence (all articles' in order), its token ids
    sentence_index: np.ndarray  # row -> index into ``tokens``
    article: np.ndarray
    sentence: np.ndarray  # within its article
    position: np.ndarray  # of the word's first wordpiece within its sentence's tokens
    length: np.ndarray  # the word's wordpieces, all replaced by one [MASK]
    token_id: np.ndarray  # the value: ``values.word_value`` of the word's pieces
    start: np.ndarray
    end: np.ndarray
    specials: tuple[int, int, int]  # cls, sep, mask
    width: int  # tokens a window holds (the model's limit less [CLS] and [SEP])

    def __len__(self) -> int:
        return int(self.token_id.shape[0])

    def rows(self, index: Sequence[int] | np.ndarray) -> list[MaskedRow]:
        """The model inputs of rows ``index``: a window of the sentence with the word masked."""
        cls_id, sep_id, mask_id = self.specials
        width = self.width
        out = []
        for i in np.asarray(index, dtype=np.int64).tolist():
            ids = self.tokens[self.sentence_index[i]]
            pos, span = int(self.position[i]), int(self.length[i])
            if span > 1:  # one [MASK] for the whole word, the form a question has
                ids = np.concatenate([ids[:pos], ids[pos : pos + 1], ids[pos + span :]])
            lo = 0 if len(ids) <= width else min(max(pos - width // 2, 0), len(ids) - width)
            window = ids[lo : lo + width].tolist()
            window[pos - lo] = mask_id
            out.append(
                MaskedRow(
                    int(self.article[i]),
                    int(self.sentence[i]),
                    [cls_id, *window, sep_id],
                    pos - lo + 1,
                    int(self.token_id[i]),
                    int(self.start[i]),
                    int(self.end[i]),
                    len(ids) > width,
                )
            )
        return out


def make_rows(
    sentences: Sequence[Sequence[str]], encoder: Encoder, policy: str, max_length: int
) -> list[MaskedRow]:
    """Every maskable word occurrence of every sentence, as a masked model input.

    The single-wordpiece policies take the words that are one wordpiece (the paper's datastore); the
    whole-word policies take every word, its wordpieces replaced by one [MASK].

    Args:
        sentences: per article, its sentences.
        encoder: gives the tokenizer and the special token ids.
        policy: the mask policy (``Config.mask_policy``).
        max_length: model input limit; longer sentences are windowed around each mask
            ([mask − w/2, mask + w/2), shifted to stay inside the sentence), as the reference does.

    Returns:
        Rows in article, sentence, position order.
    """
    table = make_row_table(sentences, encoder, policy, max_length)
    return table.rows(np.arange(len(table)))


def make_row_table(
    sentences: Sequence[Sequence[str]], encoder: Encoder, policy: str, max_length: int
) -> RowTable:
    """``make_rows``' rows as a ``RowTable``: the same rows, in the same order, without their inputs."""
    tok = encoder.tokenizer
    whole = whole_words(policy)
    flat = [(a, s, text) for a, sents in enumerate(sentences) for s, text in enumerate(sents)]
    tokens: list[np.ndarray] = []
    parts: list[np.ndarray] = []
    # Tokenised a slice at a time: the tokenizer's output for a whole long article is most of its cost
    # in memory, and only the token ids and the rows' columns are kept.
    for lo in range(0, len(flat), TOKENIZE_SENTENCES):
        piece = flat[lo : lo + TOKENIZE_SENTENCES]
        enc = tok([t for _, _, t in piece], add_special_tokens=False, return_offsets_mapping=True)
        found: list[tuple[int, ...]] = []
        for i, (a, s, text) in enumerate(piece):
            ids: list[int] = enc["input_ids"][i]
            tokens.append(np.asarray(ids, dtype=np.int32))
            offsets = enc["offset_mapping"][i]
            for pos, span in word_spans(enc.word_ids(i)):
                pieces = ids[pos : pos + span]
                if (span > 1 and (not whole or span > MAX_PIECES)) or tok.unk_token_id in pieces:
                    continue
                start, end = offsets[pos][0], offsets[pos + span - 1][1]
                if maskable(text[start:end], policy):
                    found.append((lo + i, a, s, pos, span, word_value(pieces), start, end))
        parts.append(np.asarray(found, dtype=np.int64).reshape(-1, 8))
    columns = (np.concatenate(parts) if parts else np.zeros((0, 8), np.int64)).astype(np.int32)
    return RowTable(
        tokens=tokens,
        sentence_index=columns[:, 0].copy(),
        article=columns[:, 1].copy(),
        sentence=columns[:, 2].copy(),
        position=columns[:, 3].copy(),
        length=columns[:, 4].copy(),
        token_id=columns[:, 5].copy(),
        start=columns[:, 6].copy(),
        end=columns[:, 7].copy(),
        specials=(tok.cls_token_id, tok.sep_token_id, tok.mask_token_id),
        width=max_length - 2,
    )


def word_spans(word_ids: Sequence[int | None]) -> list[tuple[int, int]]:
    """(first position, wordpieces) of each word (the tokenizer's pre-token) of a tokenised sentence."""
    out: list[tuple[int, int]] = []
    previous = None
    for pos, w in enumerate(word_ids):
        if w is None:
            previous = None
        elif w == previous:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((pos, 1))
            previous = w
    return out


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
