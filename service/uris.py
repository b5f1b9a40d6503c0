"""Resource URIs (docs/design.md §7): ``context://units/{cid}``, ``context://search/{query}`` and
``context://tools/{name}`` (the tool registry).

Parsing is deliberately strict: a URI is accepted only in the exact form the server itself
builds, so no spelling (dot segments, encoded slashes, double encoding, case games, query
strings, fragments) can reach a different unit or turn into an empty success. ``{query}``
is one path segment expanded as RFC 6570 ``{var}``: every byte outside the unreserved set
is percent-encoded with upper-case hex, so a space is ``%20`` and never ``+``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote_to_bytes

from .formats import ASCII_CONTROL_RE, is_cid, is_tool_name

SCHEME = "context://"
UNITS_PREFIX = SCHEME + "units/"
SEARCH_PREFIX = SCHEME + "search/"
TOOLS_PREFIX = SCHEME + "tools/"
UNIT_TEMPLATE = UNITS_PREFIX + "{cid}"
STATS_URI = SCHEME + "stats"        # what the memory holds (service/mcp/manage.py)
SEARCH_TEMPLATE = SEARCH_PREFIX + "{query}"
TOOL_TEMPLATE = TOOLS_PREFIX + "{name}"

MAX_URI_CHARS = 2048
MAX_URI_QUERY_CHARS = 512     # a search URI's query (a search request's own limit is far larger)
# What RFC 6570 simple expansion may leave in a segment: unreserved characters and %XX.
_SEGMENT_RE = re.compile(r"(?:[A-Za-z0-9\-._~]|%[0-9A-F]{2})+")
_ESCAPE_RE = re.compile(r"%[0-9A-Fa-f]{2}")


class BadUri(ValueError):
    """The URI names no resource of this server (the message is safe to show)."""


@dataclass(frozen=True)
class UnitUri:
    cid: str


@dataclass(frozen=True)
class SearchUri:
    query: str


@dataclass(frozen=True)
class ToolUri:
    name: str


def unit_uri(cid: str) -> str:
    return UNITS_PREFIX + cid


def search_uri(query: str) -> str:
    return SEARCH_PREFIX + quote(query, safe="")


def tool_uri(name: str) -> str:
    return TOOLS_PREFIX + name       # tool names are unreserved URI characters only (formats.TOOL_NAME_RE)


def parse(uri: str) -> UnitUri | SearchUri | ToolUri:
    """Parse a resource URI or raise BadUri."""
    if not isinstance(uri, str) or not uri:
        raise BadUri("The resource URI is empty.")
    if len(uri) > MAX_URI_CHARS:
        raise BadUri(f"The resource URI is longer than {MAX_URI_CHARS} characters.")
    if "?" in uri or "#" in uri:
        raise BadUri("Resource URIs take no query string or fragment.")
    if uri.startswith(UNITS_PREFIX):
        cid = uri[len(UNITS_PREFIX):]
        if not is_cid(cid):
            raise BadUri("A unit URI is context://units/ followed by exactly 12 lowercase hex digits.")
        return UnitUri(cid)
    if uri.startswith(SEARCH_PREFIX):
        return SearchUri(_query(uri[len(SEARCH_PREFIX):]))
    if uri.startswith(TOOLS_PREFIX):
        name = uri[len(TOOLS_PREFIX):]
        if not is_tool_name(name):
            raise BadUri("A tool URI is context://tools/ followed by the tool's name (letters, digits, '_', '-', "
                         "'.'; at most 128, starting with a letter or digit).")
        return ToolUri(name)
    raise BadUri("Unknown resource URI: this server serves context://units/{cid}, context://search/{query} "
                 "and context://tools/{name}.")


def _query(segment: str) -> str:
    if not segment:
        raise BadUri("A search URI needs a non-empty query segment.")
    if not _SEGMENT_RE.fullmatch(segment):
        raise BadUri("The search query must be one path segment, percent-encoded as RFC 6570 {query} "
                     "(space is %20, '/' is %2F, hex digits upper-case).")
    raw = unquote_to_bytes(segment)
    try:
        query = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadUri("The decoded search query is not valid UTF-8.") from None
    if search_uri(query) != SEARCH_PREFIX + segment:
        # Non-canonical spelling, e.g. an unreserved character written as %2E.
        raise BadUri("The search query is not in canonical percent-encoding (encode only what RFC 6570 encodes).")
    if _ESCAPE_RE.search(query):
        raise BadUri("The search query looks double percent-encoded.")
    if ASCII_CONTROL_RE.search(query):
        raise BadUri("The search query contains control characters.")
    if not any(ch.isalnum() for ch in query):
        # A query with no letters or digits ("../", "%2F") could only ever be an empty success.
        raise BadUri("The search query has no letters or digits to search for.")
    if len(query) > MAX_URI_QUERY_CHARS:
        raise BadUri(f"The search query is longer than {MAX_URI_QUERY_CHARS} characters.")
    return query
