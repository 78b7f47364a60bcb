"""A re-run of ``ingest wiki`` says at once that it resumes, and one over a complete index whose input has
not changed (same size and modification time, same settings) ends without reading it (issue 52)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bertknn_search.backends import open_backend
from bertknn_search.config import Config
from bertknn_search.ingest import input_stamp, pipeline

ROWS = [{"id": f"a{i}", "title": f"Vell {i}", "text": f"Vell {i} was born in Ostria."} for i in range(30)]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "input.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


@pytest.fixture
def config(base_config: Config, tmp_path: Path) -> Config:
    return base_config.replace(index=tmp_path / "index", contexts="lazy")


def never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the input was read")

    monkeypatch.setattr(pipeline, "read_records", refuse)


def test_a_rerun_over_an_unchanged_input_ends_without_reading_it(
    config: Config, source: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    first = pipeline.ingest(source, config, progress=False)
    assert first.articles == 30 and (config.index / input_stamp.FILE).exists()
    capsys.readouterr()
    with monkeypatch.context() as patch:
        never_read(patch)
        again = pipeline.ingest(source, config, progress=True)
    assert (again.articles, again.already_stored) == (0, 30)
    assert f"{source} is unchanged since this index was built from it in full" in capsys.readouterr().err


def test_a_changed_input_or_index_is_read_again_and_the_run_says_it_resumes(
    config: Config, source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline.ingest(source, config, progress=False)
    info = source.stat()
    os.utime(source, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))  # touched
    capsys.readouterr()
    again = pipeline.ingest(source, config, progress=True)
    assert (again.articles, again.already_stored) == (0, 30)
    err = capsys.readouterr().err.splitlines()
    said = [line for line in err if line.startswith("resuming: ")]
    assert said == [f"resuming: 30 articles already stored in {config.index}; unchanged ones are skipped"]
    assert err.index(said[0]) <= 2, err  # said at once, before the input is read
    # An article deleted since: the index no longer holds what the stamp says, so the input is read.
    backend = open_backend(config, for_writing=True)
    try:
        backend.delete_articles(["a3"])
    finally:
        backend.close()
    restored = pipeline.ingest(source, config, progress=False)
    assert (restored.articles, restored.already_stored) == (1, 29)


def test_a_run_with_a_limit_or_other_settings_keeps_no_stamp_that_matches(
    config: Config, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline.ingest(source, config, limit=10, progress=False)
    assert not (config.index / input_stamp.FILE).exists()  # not read to the end: nothing to trust
    pipeline.ingest(source, config, progress=False)
    assert not input_stamp.unchanged(source, config.replace(max_article_bytes=9_999), None, 30)
    assert not input_stamp.unchanged(source, config, "jsonl", 30)
    assert input_stamp.unchanged(source, config, None, 30)
