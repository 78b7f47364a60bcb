"""A full disk on an engine (issue 51.5): the watermarks stay on, sized to the data folder; a write that
meets a full disk or the flood-stage block says "the engine's disk is full" with the block and the
command that lifts it, at once (no per-document 429 retries); shards that failed for it are allocated
again by the next run itself."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from bertknn_search.backends.engines.backend import EngineBackend
from bertknn_search.backends.engines.heal import retry_failed_shards
from bertknn_search.config import Config
from bertknn_search.errors import BackendError
from bertknn_search.ingest.pipeline import add_articles, ingest
from bertknn_search.nodes.launch import WATERMARK_CEILING, WATERMARK_FLOOR, disk_watermarks
from tests.test_engine_backend import ARTICLES, NO_WAIT, mocked  # noqa: F401  (the fixture)

FLOOD_BLOCK = {
    "status": 429,
    "error": {
        "type": "cluster_block_exception",
        "reason": "index [bk-contexts] blocked by: [TOO_MANY_REQUESTS/12/disk usage exceeded flood-stage"
        " watermark, index has read-only-allow-delete block];",
    },
}
NO_SPACE = {
    "status": 500,
    "error": {
        "type": "translog_exception",
        "reason": "translog sync failed",
        "caused_by": {"type": "i_o_exception", "reason": "No space left on device"},
    },
}
THROTTLED = {"status": 429, "error": {"type": "es_rejected_execution_exception", "reason": "queue full"}}


@pytest.fixture(autouse=True)
def no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(EngineBackend, "retry", NO_WAIT)


def replying(*errors: dict[str, Any]) -> Any:
    """A bulk that answers each document with the next of ``errors`` (one reply each), then 201s."""
    left = list(errors)

    def bulk(body: str, **kwargs: Any) -> dict[str, Any]:
        lines = body.strip().split("\n")[::2]
        if left:
            error = left.pop(0)
            return {"errors": True, "items": [{"index": {"_id": "x", **error}} for _ in lines]}
        return {"errors": False, "items": [{"index": {"status": 201}} for _ in lines]}

    return bulk


def ready(backend: EngineBackend) -> None:
    backend.client.indices.get_settings.return_value = {}
    backend.client.search.return_value = {"hits": {"hits": []}}


# -- the watermarks -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("total", "flood"),
    [(300 * 10**6, WATERMARK_FLOOR), (10 * 10**9, 500 * 10**6), (250 * 10**9, WATERMARK_CEILING)],
)
def test_the_watermarks_are_on_and_sized_to_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, total: int, flood: int
) -> None:
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(total, 0, total))  # type: ignore[attr-defined]
    found = disk_watermarks(tmp_path / "not-yet" / "made")
    prefix = "cluster.routing.allocation.disk"
    assert found[f"{prefix}.threshold_enabled"] == "true"
    assert found[f"{prefix}.watermark.flood_stage"] == f"{flood}b"
    low, high = (int(found[f"{prefix}.watermark.{w}"][:-1]) for w in ("low", "high"))
    assert low > high > flood  # free bytes: the low watermark is met first


# -- the messages and their promptness (a mocked client) ----------------------------------------------
@pytest.mark.reliability
def test_a_flood_stage_block_in_a_bulk_is_said_at_once(mocked: EngineBackend) -> None:  # noqa: F811
    ready(mocked)
    mocked.client.bulk.side_effect = replying(*[FLOOD_BLOCK] * 10)
    started = time.monotonic()
    with pytest.raises(BackendError) as refused:
        mocked.add_articles([ARTICLES[0]])
    line = str(refused.value)
    assert mocked.client.bulk.call_count == 1 and time.monotonic() - started < 1  # no 429 retries
    assert "the engine's disk is full" in line and "index.blocks.read_only_allow_delete" in line, line
    assert "curl -X PUT 'https://search.example.org:9200/bk-contexts/_settings'" in line, line
    assert "fix the input" not in line and "\n" not in line


@pytest.mark.reliability
def test_no_space_left_on_device_is_a_full_disk_not_bad_input(mocked: EngineBackend) -> None:  # noqa: F811
    ready(mocked)
    mocked.client.bulk.side_effect = replying(*[NO_SPACE] * 10)
    with pytest.raises(BackendError) as refused:
        mocked.add_articles([ARTICLES[0]])
    line = str(refused.value)
    assert "the engine's disk is full" in line and "free disk space" in line, line
    assert "_cluster/reroute?retry_failed=true" in line and "fix the input" not in line, line
    assert mocked.client.bulk.call_count == 1  # not sent again as if a shard were lost


@pytest.mark.reliability
def test_a_429_that_is_no_block_sends_the_batch_again(mocked: EngineBackend) -> None:  # noqa: F811
    ready(mocked)
    mocked.client.bulk.side_effect = replying(THROTTLED)
    mocked.add_articles([ARTICLES[0]])  # the second try got through
    sent = [call.kwargs["body"] for call in mocked.client.bulk.call_args_list]
    assert sent[0] == sent[1]
    mocked.client.bulk.reset_mock()
    mocked.client.bulk.side_effect = replying(*[THROTTLED] * 10)
    with pytest.raises(BackendError, match="overloaded"):
        mocked.add_articles([ARTICLES[1]])
    assert mocked.client.bulk.call_count == 3  # NO_WAIT's attempts


def test_a_delete_of_a_doc_already_gone_is_no_failure(mocked: EngineBackend) -> None:  # noqa: F811
    ready(mocked)
    mocked.client.search.return_value = {"hits": {"hits": [{"_id": "c1"}, {"_id": "c2"}]}}
    mocked.client.bulk.side_effect = lambda body, **kw: {
        "errors": True,
        "items": [
            {"delete": {"_id": "c1", "status": 404, "result": "not_found"}},
            {"delete": {"status": 200}},
        ],
    }
    mocked._delete_where("delete old contexts", "bk-contexts", {"query": {"match_all": {}}})
    assert mocked.client.bulk.call_count == 1  # not sent again, and no error


# -- failed shards allocated again ------------------------------------------------------------------------
def test_shards_failed_for_a_full_disk_are_allocated_again_and_the_read_tried_once_more(
    mocked: EngineBackend,  # noqa: F811
) -> None:
    partial = {"_shards": {"total": 2, "successful": 1, "failed": 1, "failures": [{"reason": {"type": "x"}}]}}
    whole = {"_shards": {"total": 2, "successful": 2, "failed": 0}, "hits": {"hits": []}}
    answers = [partial] * 3 + [whole]  # NO_WAIT's 3 attempts, then the shards are back
    mocked.client.search.side_effect = lambda **kw: answers.pop(0)
    mocked.client.cat.shards.return_value = [
        {
            "index": "bk-articles",
            "shard": "0",
            "state": "UNASSIGNED",
            "unassigned.reason": "ALLOCATION_FAILED",
        },
        {"index": "bk-articles", "shard": "1", "state": "STARTED", "unassigned.reason": None},
    ]
    assert mocked.search_articles("Quimby", 3) == []
    mocked.client.cluster.reroute.assert_called_once_with(retry_failed=True)
    assert mocked.client.cluster.health.call_args.kwargs["wait_for_status"] == "yellow"


def test_nothing_is_rerouted_for_shards_missing_for_another_reason() -> None:
    client = mock.MagicMock()
    client.cat.shards.return_value = [
        {"index": "bk-articles", "shard": "0", "state": "UNASSIGNED", "unassigned.reason": "NODE_LEFT"}
    ]
    assert not retry_failed_shards(client, "bk-*")
    client.cluster.reroute.assert_not_called()


# -- real nodes ---------------------------------------------------------------------------------------------
def http(url: str, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


@pytest.mark.slow
@pytest.mark.reliability
def test_the_engines_flood_stage_block_on_real_nodes(
    cluster_config: Config, corpus: Path, tmp_path: Path, engine_name: str
) -> None:
    """The node keeps its watermarks; with the block a flood stage sets on the index, an add fails at once
    with the full disk named; once the block is lifted (as the node does when space is back) the same
    add completes."""
    url = getattr(cluster_config, f"{engine_name}_url")
    ingest(corpus, cluster_config, progress=False)
    nodes = http(url, "GET", "/_nodes/settings?flat_settings=true")["nodes"]
    for node in nodes.values():
        settings = node["settings"]
        if "cluster.routing.allocation.disk.threshold_enabled" in settings:  # a node 'engine start' started
            assert settings["cluster.routing.allocation.disk.threshold_enabled"] == "true"
            assert settings["cluster.routing.allocation.disk.watermark.flood_stage"].endswith("b")
    prefix = cluster_config.opensearch_prefix
    indices = f"{prefix}-articles,{prefix}-contexts"
    new = tmp_path / "new.jsonl"
    new.write_text(
        json.dumps({"id": "d1", "title": "Oskavel", "text": "Oskavel is a town. It is old."}) + "\n"
    )
    block = {"index.blocks.read_only_allow_delete": True}
    assert http(url, "PUT", f"/{indices}/_settings", block).get("acknowledged")
    waits: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:  # the retries' backoff, whichever library waits
        if seconds >= 0.25:
            waits.append(seconds)
        real_sleep(seconds)

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(time, "sleep", sleep)
            with pytest.raises(BackendError) as refused:
                add_articles(new, cluster_config, progress=False)
        line = str(refused.value)
        assert "the engine's disk is full" in line and "read_only_allow_delete" in line, line
        assert "curl -X PUT" in line and "fix the input" not in line and "\n" not in line, line
        assert sum(waits) < 1, waits  # said at once: not 7.5 s of 429 retries (a load-free measure)
    finally:
        http(url, "PUT", f"/{indices}/_settings", {"index.blocks.read_only_allow_delete": None})
    assert add_articles(new, cluster_config, progress=False).articles == 1
