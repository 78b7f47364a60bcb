"""An eager ingest writes a chunk in groups of about COMMIT_S of encoding: a stop loses at most one group."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertknn_search.config import Config
from bertknn_search.errors import Interrupted
from tests.test_reliability import counts, write_big_corpus

ARTICLES = 60  # one chunk (CHUNK_ARTICLES is 64): before groups, a stop inside it kept nothing


@pytest.fixture()
def one_chunk(tmp_path: Path) -> Path:
    path = tmp_path / "one-chunk.jsonl"
    write_big_corpus(path, ARTICLES)
    return path


def test_a_stop_inside_a_chunk_keeps_the_groups_written_before_it(
    one_chunk: Path, base_config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bertknn_search.ingest import pipeline

    clean = tmp_path / "clean"
    pipeline.ingest(one_chunk, base_config.replace(index=clean), progress=False)

    # No rate is known before the first group: each group is then a batch's worth of rows, and with a
    # commit interval of 0 every later one too, so the chunk is written in many small groups.
    monkeypatch.setattr(pipeline, "COMMIT_S", 0.0)
    real = pipeline.encode_rows
    calls = []

    def stopped_after_three(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pipeline, "encode_rows", stopped_after_three)
    index = tmp_path / "index"
    config = base_config.replace(index=index, batch_size=8)
    with pytest.raises(Interrupted):
        pipeline.ingest(one_chunk, config, progress=False)
    kept = counts(index)[0]
    assert 0 < kept < ARTICLES

    monkeypatch.setattr(pipeline, "encode_rows", real)
    summary = pipeline.ingest(one_chunk, config, progress=False)
    assert summary.already_stored == kept  # the groups written before the stop are reused
    assert counts(index) == counts(clean)


def test_groups_hold_whole_articles_and_follow_the_measured_rate() -> None:
    from bertknn_search.ingest.pipeline import COMMIT_S, _Pace

    owners = [a for a in range(10) for _ in range(5)]  # 10 articles of 5 rows
    pace = _Pace()
    assert list(pace.groups(owners, 10, batch_size=10)) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    pace.told(rows=20, seconds=COMMIT_S * 2)  # 1 row/s: groups of COMMIT_S rows, whole articles
    groups = list(pace.groups(owners, 10, batch_size=1))
    assert groups[0] == (0, 2) and groups[-1][1] == 10
    assert all(end > first for first, end in groups)
    # An article longer than a group is a group of its own, never split.
    assert list(_Pace().groups([0] * 30 + [1], 2, batch_size=4)) == [(0, 1), (1, 2)]
