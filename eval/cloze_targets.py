"""Cloze targets: word occurrences of an index's own sentences, drawn by the text and the tokenizer alone.

Drawn with a seed, never by the index's mask policy, so that indexes of one corpus under different
policies are asked the same questions (see ``eval.cloze``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bertknn_search.backends.base import Backend
from bertknn_search.encoding.encoder import MASK
from bertknn_search.ingest.contexts import word_spans
from bertknn_search.query.search import Searcher
from bertknn_search.stopwords import STOPWORDS, is_punctuation
from bertknn_search.values import MAX_PIECES

KINDS = ("single", "multi")  # the target word is one wordpiece, or several
SENTENCE_READ = 64  # sentences asked of the store at a time while an article's are listed


@dataclass(frozen=True)
class Target:
    """One word occurrence to mask: where it is and what it is."""

    article_id: str
    title: str
    sentence_id: int
    sentence: str
    start: int  # character span of the word in its sentence
    end: int
    pieces: int  # its wordpieces

    @property
    def word(self) -> str:
        return self.sentence[self.start : self.end]

    @property
    def kind(self) -> str:
        return KINDS[0] if self.pieces == 1 else KINDS[1]

    @property
    def stopword(self) -> bool:
        return self.word.lower() in STOPWORDS

    @property
    def question(self) -> str:
        return f"{self.sentence[: self.start]}{MASK}{self.sentence[self.end :]}"


@dataclass(frozen=True)
class Sample:
    """The targets drawn, and what the drawing looked at."""

    targets: list[Target]
    articles: int  # articles whose sentences were read
    sentences: int
    too_long: int  # word occurrences left out: their question is longer than the model takes


def article_sentences(backend: Backend, article_id: str) -> list[str]:
    """Every stored sentence of one article, in order (the store answers "" past the last)."""
    out: list[str] = []
    while True:
        got = backend.sentences([(article_id, i) for i in range(len(out), len(out) + SENTENCE_READ)])
        ended = next((i for i, text in enumerate(got) if not text), len(got))
        out.extend(got[:ended])
        if ended < len(got):
            return out


def draw_targets(
    searcher: Searcher,
    articles: Sequence[tuple[str, str]],
    per_kind: int,
    seed: int,
    per_article: int,
    progress: Callable[[int], None] | None = None,
) -> Sample:
    """Draw up to ``per_kind`` single- and ``per_kind`` multi-wordpiece targets from ``articles``.

    Articles are visited in an order shuffled by ``seed``; each gives at most ``per_article`` targets of
    each kind, drawn at random from its words that are not punctuation, have no [UNK] and at most
    ``values.MAX_PIECES`` wordpieces, and whose question fits the model. A lazy index encodes each
    visited article whole first (its sentences are stored then), so that the answers are exact.

    Args:
        articles: (id, title) of the articles to draw from.
        progress: told how many articles were visited after each.
    """
    rng = random.Random(seed)
    order = list(articles)
    rng.shuffle(order)
    tok = searcher.encoder.tokenizer
    limit = searcher.encoder.max_length
    chosen: dict[str, list[Target]] = {kind: [] for kind in KINDS}
    visited = sentences = too_long = 0
    for article_id, title in order:
        if all(len(chosen[kind]) >= per_kind for kind in KINDS):
            break
        searcher.backend.ensure_contexts([article_id])
        texts = article_sentences(searcher.backend, article_id)
        visited += 1
        sentences += len(texts)
        found: dict[str, list[Target]] = {kind: [] for kind in KINDS}
        enc = tok(texts or [""], add_special_tokens=False, return_offsets_mapping=True)
        for s, text in enumerate(texts):
            ids: list[int] = enc["input_ids"][s]
            offsets = enc["offset_mapping"][s]
            for pos, span in word_spans(enc.word_ids(s)):
                pieces = ids[pos : pos + span]
                start, end = offsets[pos][0], offsets[pos + span - 1][1]
                if span > MAX_PIECES or tok.unk_token_id in pieces or is_punctuation(text[start:end]):
                    continue
                if len(ids) - span + 3 > limit:  # [CLS] question [SEP], the word one [MASK]
                    too_long += 1
                    continue
                target = Target(article_id, title, s, text, start, end, span)
                found[target.kind].append(target)
        for kind in KINDS:
            rng.shuffle(found[kind])
            room = min(per_article, per_kind - len(chosen[kind]))
            chosen[kind].extend(found[kind][: max(room, 0)])
        if progress is not None:
            progress(visited)
    return Sample([t for kind in KINDS for t in chosen[kind]], visited, sentences, too_long)
