"""Warm: encode ahead of time the contexts that questions or titles will need (lazy indexes)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from tqdm import tqdm

from bertknn_search import progress_lines
from bertknn_search.query.search import Searcher
from bertknn_search.records import Question

WARM_CHUNK = 256  # articles per encoder pass: enough rows to fill GPU batches of 1,024


# tqdm's own rate turns into seconds per unit below one a second, glued to the unit ("6.66s/ articles"):
# the rate as units per second always reads right, and warm's articles are often slower than one a second.
WARM_BAR = (
    "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} articles [{elapsed}<{remaining}, {rate_noinv_fmt}"
    "{postfix}]"
)


@dataclass(frozen=True)
class WarmSummary:
    """What a warm run did."""

    articles: int  # distinct articles the input needs
    encoded_articles: int  # of them, without contexts before this run
    contexts: int  # contexts encoded by this run
    seconds: float
    location: str
    index_contexts: int  # contexts the index holds afterwards
    estimated_contexts: int  # contexts an eager index of the same articles would hold

    @property
    def contexts_per_second(self) -> float:
        return self.contexts / self.seconds if self.seconds > 0 else 0.0


def needed_articles(searcher: Searcher, questions: Sequence[Question]) -> list[str]:
    """The ids of every article the IR step picks for ``questions``, in first-needed order."""
    ids: dict[str, None] = {}
    for q in questions:
        ids.update(dict.fromkeys(h.id for h in searcher.retrieve(q)))
    return list(ids)


def warm(searcher: Searcher, article_ids: Sequence[str], progress: bool = True) -> WarmSummary:
    """Encode and store the contexts of ``article_ids`` that have none, in large batches.

    On an eager index every context is stored already and this encodes nothing.
    """
    started = time.perf_counter()
    ids = list(dict.fromkeys(article_ids))
    before = searcher.backend.stats()
    contexts = 0
    bar_args = {
        "unit": " articles",
        "bar_format": WARM_BAR,
        "dynamic_ncols": True,
        "file": progress_lines.stream(),
    }
    with tqdm(total=len(ids), desc="warm", disable=not progress, **bar_args) as bar:
        for lo in range(0, len(ids), WARM_CHUNK):
            chunk = ids[lo : lo + WARM_CHUNK]
            contexts += searcher.backend.ensure_contexts(chunk)
            bar.update(len(chunk))
            bar.set_postfix(contexts=f"{contexts:,}")
    after = searcher.backend.stats()
    return WarmSummary(
        articles=len(ids),
        encoded_articles=max(after.encoded_articles - before.encoded_articles, 0),
        contexts=contexts,
        seconds=time.perf_counter() - started,
        location=searcher.backend.location,
        index_contexts=after.contexts,
        estimated_contexts=after.estimated_contexts,
    )
