"""One input check on every backend: an id or title some backend cannot store is skipped alike everywhere,
with one warning line naming it, and counted; a run and its re-run get past it.

On OpenSearch and Elasticsearch one such article made the engine refuse its whole bulk request (0 of 5
articles written) and every re-run stopped at it again; the embedded store took it. Run on the embedded
backend and on both real engines.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bertknn_search.backends import open_backend
from bertknn_search.backends.engines.dialect import MAX_ARTICLE_BYTES
from bertknn_search.config import Config
from bertknn_search.errors import ConfigError
from bertknn_search.ingest.pipeline import ingest
from bertknn_search.ingest.record_limits import MAX_ID_BYTES, MAX_TITLE_BYTES
from tests.conftest import drop_indices, engine_config

pytestmark = pytest.mark.reliability

ARTICLES = [
    {"id": "ok-1", "title": "Quorn Vell", "text": "Quorn Vell was born in Ostria. Quorn Vell was a baker."},
    {"id": "x" * 600, "title": "Long Id", "text": "Long Id was born in Pell. Long Id was a miner."},
    {"id": "ok-2", "title": "Pira Sut", "text": "Pira Sut was born in Dramen. Pira Sut was a poet."},
    {"id": "long-title", "title": "T" * 50_000, "text": "This article has a title of 50,000 bytes."},
    {"id": "ok-3", "title": "Dav Orun", "text": "Dav Orun was born in Kell. Dav Orun was a smith."},
]


@pytest.fixture(params=["embedded", "opensearch", "elasticsearch"])
def where(request: pytest.FixtureRequest, base_config: Config, tmp_path: Path) -> Iterator[Config]:
    config = base_config.replace(contexts="lazy", index=tmp_path / "index")
    if request.param == "embedded":
        yield config
        return
    engines = request.getfixturevalue("engines")
    made = engine_config(config, engines, request.param, f"bertknn-test-{uuid.uuid4().hex[:10]}")
    yield made
    drop_indices(made)


def test_an_unstorable_id_or_title_is_skipped_alike_on_every_backend(
    where: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "input.jsonl"
    source.write_text("".join(json.dumps(a) + "\n" for a in ARTICLES))
    for run in ("first", "again"):
        summary = ingest(source, where, progress=False)
        warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
        assert summary.unstorable == 2, (run, summary)
        assert summary.duplicates == 0, (run, summary)  # each skipped article counted once, by its reason
        stored = summary.articles + summary.already_stored
        assert stored == 3, (run, summary)
        assert len(warnings) == 2, warnings
        assert f"more than the {MAX_ID_BYTES} an article id may" in warnings[0], warnings
        assert f"more than the {MAX_TITLE_BYTES:,} a title may" in warnings[1], warnings
        assert all(len(line) < 400 for line in warnings), warnings  # the id and title are cut short
    backend = open_backend(where)
    try:
        assert backend.stats().articles == 3
        assert [h.id for h in backend.find_titles("Pira Sut", 1)] == ["ok-2"]
    finally:
        backend.close()


def test_each_skipped_article_is_counted_once_under_its_reason(where: Config, tmp_path: Path) -> None:
    big = {"id": "big", "title": "Big", "text": "Big was born in Ost. " * 4_000}  # over the byte limit
    twice = {"id": "ok-1", "title": "Quorn Vell", "text": "Quorn Vell was a baker in Ostria."}
    source = tmp_path / "input.jsonl"
    source.write_text("".join(json.dumps(a) + "\n" for a in [*ARTICLES, big, twice]))
    summary = ingest(source, where.replace(max_article_bytes=70_000), progress=False)
    counts = (summary.too_large, summary.unstorable, summary.duplicates, summary.articles)
    assert counts == (1, 2, 1, 3), summary  # ok-1 comes twice: the later text is stored, once


@pytest.mark.parametrize("name", ["opensearch", "elasticsearch"])
def test_max_article_bytes_says_what_an_engine_can_hold(name: str) -> None:
    """A limit past what one request to an engine can carry is refused before anything is read (a 60 MB
    article was sent, and refused with HTTP 413 and the advice to check the index version)."""
    config = Config(backend=name, max_article_bytes=60_000_000, **{f"{name}_url": "http://127.0.0.1:9"})
    with pytest.raises(ConfigError) as refused:
        open_backend(config)
    line = str(refused.value)
    assert f"at most {MAX_ARTICLE_BYTES:,} bytes" in line and "\n" not in line, line
    assert f"give --max-article-bytes {MAX_ARTICLE_BYTES} or less" in line, line


def test_the_summary_says_them() -> None:
    from bertknn_search.ingest.pipeline import IngestSummary
    from bertknn_search.output import render_summary

    line = render_summary(IngestSummary(3, 0, 0, 6, 9, 1.0, unstorable=2), "ingested")
    assert "; 2 with an id or title too long to store skipped (named above)" in line
