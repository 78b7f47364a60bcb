"""Shards that failed for want of disk, allocated again once there is room, so a re-run needs no step.

A node whose disk filled fails the shards it was writing; the engine tries to allocate each again a few
times (``index.allocation.max_retries``, 5) and then leaves it unassigned, the index red, until someone
posts ``_cluster/reroute?retry_failed=true``: after space was freed, every later run failed with "a node
is down or recovering". A request of ours that finds shards missing (``PartialAnswer`` after its retries)
now looks once for shards of our indices left unassigned with ``ALLOCATION_FAILED``, asks for that
reroute, waits (bounded) for them to come back, and tries again.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("bertknn_search.engines")

WAIT_S = 30  # for the shards to be allocated again (a recovery from the local disk: seconds)


def failed_shards(client: Any, pattern: str) -> int:
    """How many shards of the indices matching ``pattern`` are unassigned because their allocation
    failed (what ``retry_failed`` retries); 0 when that cannot be read."""
    try:
        rows = client.cat.shards(index=pattern, format="json", h="index,shard,state,unassigned.reason")
    except Exception:  # looked at only to heal; the caller reports its own error
        return 0
    rows = getattr(rows, "body", rows)
    return sum(
        1
        for row in rows or []
        if isinstance(row, dict)
        and row.get("state") == "UNASSIGNED"
        and row.get("unassigned.reason") == "ALLOCATION_FAILED"
    )


def retry_failed_shards(client: Any, pattern: str) -> bool:
    """Allocate the failed shards of ``pattern``'s indices again and wait for them (at most ``WAIT_S``);
    whether any were found (and so whether the request is worth another try)."""
    failed = failed_shards(client, pattern)
    if not failed:
        return False
    log.warning(
        "%d shards of %s failed to allocate (a full disk?): retrying them"
        " (_cluster/reroute?retry_failed=true)",
        failed,
        pattern,
    )
    try:
        client.cluster.reroute(retry_failed=True)
        client.cluster.health(index=pattern, wait_for_status="yellow", timeout=f"{WAIT_S}s")
    except Exception:  # the request's own error is what is reported if this did not help
        return False
    return True
