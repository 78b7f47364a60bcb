"""SeenIds: which ids of an input came before, across merges of its compact store."""

from __future__ import annotations

import pytest

from bertknn_search.ingest import seen_ids
from bertknn_search.ingest.seen_ids import SeenIds


@pytest.mark.parametrize("merge_at", [2, 65_536])
def test_ids_seen_before_are_reported_across_merges(monkeypatch: pytest.MonkeyPatch, merge_at: int) -> None:
    monkeypatch.setattr(seen_ids, "_MERGE_AT", merge_at)
    seen = SeenIds()
    assert seen.add(["a", "b", "c"]) == [False, False, False]
    assert seen.add(["d", "a"]) == [False, True]
    assert seen.add(["e", "c", "b"]) == [False, True, True]
    assert seen.add([]) == []
    assert seen.add([str(i) for i in range(1000)]) == [False] * 1000
    assert seen.add(["999", "1000", "d"]) == [True, False, True]
