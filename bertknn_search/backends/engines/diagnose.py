"""What is wrong with an engine URL or a refused request, said so that the fix follows from it.

Only used once something failed (or once per process and URL, for ``identify``): the happy path costs
nothing here. Probes send no credentials and follow no redirects.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from bertknn_search.backends.engines.urls import NodeURL, node_urls

PROBE_TIMEOUT_S = 2.0
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
DEFAULT_PORT = 9200  # what 'engine start' uses when no --port is given
# "index [bk-articles] blocked by: [FORBIDDEN/8/index write (api)]" and the cluster-wide ones
_BLOCK = re.compile(
    r"(?:index \[(?P<index>[^\]]+)\] )?blocked by: \[(?P<status>[A-Z_]+)/\d+/(?P<what>[^\]]+)\]"
)


@dataclass(frozen=True)
class Answered:
    """What answered ``GET /`` at a URL: ``product`` is "opensearch", "elasticsearch", "serve" or ""."""

    product: str
    said: str  # for messages: "Elasticsearch 8.19.21", "a bertknn-search server (serve)", ...


def is_local(node: NodeURL) -> bool:
    return node.host in LOCAL_HOSTS or node.host.startswith("127.")


def first_node(url: str) -> NodeURL | None:
    try:
        return node_urls(url, "")[0]
    except Exception:  # a URL is checked before any request; this only serves messages
        return None


def start_hint(name: str, node: NodeURL) -> str:
    """``bertknn-search engine start NAME`` with the port the URL names, for a local URL."""
    port = node.port or (443 if node.scheme == "https" else 80)
    flag = "" if port == DEFAULT_PORT else f" --port {port}"
    return f"'bertknn-search engine start {name}{flag}'"


def speaks_tls(node: NodeURL) -> bool | None:
    """Whether the node completes a TLS handshake (None: nothing answered at all)."""
    port = node.port or (443 if node.scheme == "https" else 80)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # a probe of the protocol, not of trust: it sends nothing
    try:
        with (
            socket.create_connection((node.host, port), timeout=PROBE_TIMEOUT_S) as sock,
            context.wrap_socket(sock, server_hostname=node.host),
        ):
            return True
    except ssl.SSLError:
        return False
    except OSError:
        return None


def probe(node: NodeURL) -> Answered | None:
    """``GET /`` at a node, without credentials and without following a redirect (None: no HTTP answer)."""
    port = node.port or (443 if node.scheme == "https" else 80)
    if node.scheme == "https":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # naming what answered; nothing secret is sent
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            node.host, port, timeout=PROBE_TIMEOUT_S, context=context
        )
    else:
        conn = http.client.HTTPConnection(node.host, port, timeout=PROBE_TIMEOUT_S)
    try:
        conn.request("GET", urlsplit(node.shown).path + "/", headers={"Accept": "application/json"})
        response = conn.getresponse()
        body = response.read(65536)
        server = response.getheader("server") or ""
        status = response.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    return identify(status, body, server)


def identify(status: int, body: bytes | str | dict, server: str = "") -> Answered:
    """Name what answered ``GET /`` from its status, body and Server header."""
    info = body if isinstance(body, dict) else None
    text = body if isinstance(body, str) else "" if info is not None else body.decode("utf-8", "replace")
    if info is None:
        try:
            loaded = json.loads(text)
            info = loaded if isinstance(loaded, dict) else None
        except ValueError:
            info = None
    version = (info or {}).get("version")
    if isinstance(version, dict) and isinstance(version.get("number"), str):
        if version.get("distribution") == "opensearch":
            return Answered("opensearch", f"OpenSearch {version['number']}")
        if (info or {}).get("tagline") == "You Know, for Search" or "build_flavor" in version:
            return Answered("elasticsearch", f"Elasticsearch {version['number']}")
    if "bertknn-search" in text or "bertknn" in server:
        return Answered("serve", "a bertknn-search server ('bertknn-search serve'), not an engine")
    kind = "JSON" if info is not None else ("an HTML page" if "<html" in text.lower() else "text")
    by = f" from {server!r}" if server else ""
    return Answered("", f"an HTTP server that is no search engine (HTTP {status}, {kind}{by})")


def wrong_product(name: str, title: str, env: str, answered: Answered, url: str) -> str:
    """The advice for a URL whose answer is not the engine ``name``."""
    if answered.product == "serve":
        return (
            f"{url} is {answered.said}: give {env}_URL the engine's URL (the one 'serve' was started"
            f" with), or ask that server with 'bertknn-search query --server {url}'"
        )
    if answered.product in ("opensearch", "elasticsearch"):
        return (
            f"{url} is {answered.said}, not {title}: use --backend {answered.product}"
            f" ({answered.product.upper()}_URL / --{answered.product}-url)"
        )
    return f"{url} answered as {answered.said}; check {env}_URL: it must name a {title} node"


def connection_hint(name: str, title: str, env: str, url: str, ssl_error: bool, reason: str) -> str:
    """The advice for a URL where no request ever got an answer."""
    node = first_node(url)
    if node is None:
        return f"check that the cluster is up and {env}_URL is right"
    if node.scheme == "https" and ssl_error and "wrong version number" in reason.lower():
        plain = node.shown.replace("https://", "http://", 1)
        return f"the node answers plain http, not https: use {plain} (or turn TLS on in the node)"
    if node.scheme == "https" and ssl_error:
        return f"check {env}_CA (or --insecure for a test cluster with a self-signed certificate)"
    if node.scheme == "http" and "refused" not in reason.lower() and speaks_tls(node):
        secure = node.shown.replace("http://", "https://", 1)
        return (
            f"the node speaks https: use {secure} (with {env}_CA, or --insecure for a self-signed test node)"
        )
    if "refused" in reason.lower() and is_local(node):
        return (
            f"nothing listens there: start a local node with {start_hint(name, node)}"
            f" (or point {env}_URL at a running {title})"
        )
    return f"check that the cluster is up and {env}_URL is right"


DISK_FULL = "the engine's disk is full"
_NO_SPACE = ("No space left on device", "not enough disk space", "disk usage exceeded")


def is_disk_full(reason: str) -> bool:
    """Whether an engine's error says its disk is full: "No space left on device" from a write, or the
    block a disk past its flood-stage watermark puts on the node's indices."""
    return any(words in reason for words in _NO_SPACE)


def disk_full_hint(reason: str, url: str) -> str | None:
    """The advice for an error that says the engine's disk is full (None: it does not).

    A block from the flood stage gets ``block_hint``'s line (the block and the request that lifts it); a
    write that met a disk with no space left (no watermark stopped it) names what frees it and that the
    next run retries the shards that failed for it (``_cluster/reroute?retry_failed=true``) itself.
    """
    if not is_disk_full(reason):
        return None
    blocked = block_hint(reason, url)
    if blocked is not None:
        return blocked
    node = first_node(url)
    base = node.shown if node is not None else url
    return (
        f"{DISK_FULL} (no space left on its data folder's disk): free disk space there, then run the same"
        " command again; it retries the index's shards that failed for it itself (or: curl -X POST"
        f" '{base}/_cluster/reroute?retry_failed=true'); nothing already written was lost"
    )


def block_hint(reason: str, url: str) -> str | None:
    """What a cluster or index block is and the request that lifts it; None when ``reason`` is no block."""
    found = _BLOCK.search(reason)
    if found is None:
        return None
    what, index = found["what"].lower(), found["index"]
    node = first_node(url)
    base = node.shown if node is not None else url
    if "create-index" in what:
        setting, where = "cluster.blocks.create_index", "the cluster refuses to create indices"
    elif what.startswith("cluster read-only / allow delete"):
        setting, where = "cluster.blocks.read_only_allow_delete", "the cluster refuses writes"
    elif what.startswith("cluster read-only"):
        setting, where = "cluster.blocks.read_only", "the cluster refuses writes (read-only)"
    elif "flood-stage" in what or "allow delete" in what:
        setting = "index.blocks.read_only_allow_delete"
        where = f"{DISK_FULL}: index {index} refuses writes (its flood-stage block)"
    elif "read-only" in what:
        setting, where = "index.blocks.read_only", f"index {index} refuses writes (read-only)"
    elif "index write" in what:
        setting, where = "index.blocks.write", f"index {index} refuses writes"
    elif "metadata" in what:
        setting, where = "index.blocks.metadata", f"index {index} refuses changes to its settings"
    else:
        return f"a block ({found['what']}) refuses the request: lift it, then run the same command again"
    disk = (
        "free disk space first (a disk past its flood-stage watermark sets it; the node lifts it itself"
        " within seconds once the disk is below its high watermark); then "
        if "flood-stage" in what or "allow delete" in what or "create-index" in what
        else ""
    )
    body = json.dumps({"persistent": {setting: None}} if setting.startswith("cluster.") else {setting: None})
    path = "_cluster/settings" if setting.startswith("cluster.") else f"{index}/_settings"
    lift = f"curl -X PUT '{base}/{path}' -H 'Content-Type: application/json' -d '{body}'"
    return (
        f"{where} ({setting}; retrying cannot lift it): {disk}lift it with {lift},"
        " then run the same command again; nothing already written was lost"
    )
