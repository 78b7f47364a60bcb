"""Engine node URLs: a comma list checked before any request, and the form that may be shown.

A URL is refused in one line, before a client is made, unless it is ``http`` or ``https`` with a
well-formed host and, where it has one, a numeric port: a client given ``:notaport`` or ``http://[::1``
raised a traceback on its first request, and one given another scheme waited for an answer that never came.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

from bertknn_search.errors import ConfigError

# A DNS name: dot-separated labels of letters, digits, hyphens (and underscores, which container
# networks use in service names), none starting or ending with a hyphen.
_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")
_CREDENTIALS = re.compile(r"(//)[^/@]*@")


@dataclass(frozen=True)
class NodeURL:
    """One node's URL, split: ``shown`` carries no credentials and is the only form ever printed."""

    shown: str
    host: str
    port: int | None
    scheme: str
    user: str | None
    password: str | None


def hide_credentials(text: str) -> str:
    """``text`` with every ``user:password@`` part of a URL in it removed (for messages about bad URLs)."""
    return _CREDENTIALS.sub(r"\1", text)


def node_urls(text: str, what: str) -> list[NodeURL]:
    """The node URLs of ``text``: one URL or a comma-separated list of them.

    Args:
        text: the setting as given (``OPENSEARCH_URL`` or ``--opensearch-url``).
        what: names the setting in messages (``OPENSEARCH_URL / --opensearch-url``).

    Raises:
        ConfigError: an empty list or entry, a scheme other than http(s), a malformed host or a port
            that is not a number from 1 to 65535; one line naming the entry (without credentials).
    """
    entries = [entry.strip() for entry in text.split(",")]
    if not any(entries):
        raise ConfigError(f"{what} is empty; give a node URL such as http://127.0.0.1:9200")
    return [_node_url(entry, what, len(entries) > 1) for entry in entries]


def _node_url(entry: str, what: str, listed: bool) -> NodeURL:
    example = "http(s)://host:port, e.g. http://127.0.0.1:9200"
    if listed:
        example += " (several nodes: separated by commas, http://127.0.0.1:9200,http://127.0.0.1:9201)"
    shown = hide_credentials(entry)

    def bad(why: str) -> ConfigError:
        return ConfigError(f"{what}: {shown!r} is not a node URL ({why}); give {example}")

    if not entry:
        raise bad("an empty entry in the list")
    try:
        parts = urlsplit(entry)
        port = parts.port
    except ValueError as exc:  # "Port could not be cast to integer value", "Invalid IPv6 URL"
        raise bad(str(exc).rstrip(".").lower()) from None
    if parts.scheme not in ("http", "https"):
        found = f"the scheme {parts.scheme!r}" if "://" in entry else "no http:// or https://"
        raise bad(f"{found}; only http and https are spoken")
    host = parts.hostname or ""
    if not _well_formed_host(host, bracketed="[" in parts.netloc):
        raise bad(f"the host {host!r} is not a host name or an IP address" if host else "no host")
    if port == 0:
        raise bad("port 0")
    if parts.query or parts.fragment:
        raise bad("a query or fragment; a node URL ends at its path")
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    public = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return NodeURL(public, host, port, parts.scheme, user, password)


def _well_formed_host(host: str, bracketed: bool) -> bool:
    if bracketed or ":" in host:
        try:
            return ipaddress.ip_address(host).version == 6
        except ValueError:
            return False
    labels = host.rstrip(".").split(".")
    return bool(host) and len(host) <= 253 and all(_LABEL.fullmatch(label) for label in labels)


def public_urls(text: str) -> str:
    """``text`` (one URL or a comma list) as it may be shown: each URL without credentials.

    Never raises: a URL that cannot be parsed is shown with its credentials cut out.
    """
    shown = []
    for entry in text.split(","):
        try:
            shown.append(node_urls(entry, "")[0].shown)
        except ConfigError:
            shown.append(hide_credentials(entry.strip()))
    return ",".join(shown)
