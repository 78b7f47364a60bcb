"""SeenIds: the article ids of one input seen so far, in 8 bytes each, to count ids that come again."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

_MASK = (1 << 64) - 1
_MERGE_AT = 65_536  # recent ids kept in a set before they are merged into the sorted array


class SeenIds:
    """Set membership for millions of ids in little memory (a whole Wikipedia dump: about 60 MB).

    Ids are kept as 64-bit hashes: a sorted array plus a small set of recent ones. Two distinct ids of
    a 7-million-article dump share a hash with probability about 1e-6, so counts are exact in practice.
    """

    def __init__(self) -> None:
        self._merged = np.empty(0, dtype=np.uint64)
        self._recent: set[int] = set()

    def add(self, ids: Iterable[str]) -> list[bool]:
        """Add distinct ``ids``; for each, whether it had been added before."""
        hashes = [hash(i) & _MASK for i in ids]
        known = np.zeros(len(hashes), dtype=bool)
        if self._merged.size and hashes:
            wanted = np.array(hashes, dtype=np.uint64)
            at = np.minimum(np.searchsorted(self._merged, wanted), self._merged.size - 1)
            known = self._merged[at] == wanted
        again = []
        for h, old in zip(hashes, known.tolist()):
            again.append(old or h in self._recent)
            self._recent.add(h)
        if len(self._recent) >= _MERGE_AT:
            self._merged = np.union1d(self._merged, np.fromiter(self._recent, dtype=np.uint64))
            self._recent.clear()
        return again
