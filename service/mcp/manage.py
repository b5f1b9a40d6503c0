"""Managing the memory over MCP: the ``context_forget`` tool and ``context://stats``.

``context_forget`` is the REST bulk forget (``POST /mcp/forget``) as a tool: called without
``confirm`` it forgets nothing and answers the count, a sample and a confirmation; called again with
the same arguments and that confirmation it forgets at most what the dry run counted. It needs the
``admin`` scope. ``context://stats`` is ``GET /mcp/stats`` as a JSON resource (listed among the
resource templates: it is one fixed URI, not a unit, so ``resources/list`` keeps listing units only).
"""
from __future__ import annotations

import json

import mcp_types as types

from ..api.manage import MAX_CIDS, forget_units
from ..units import CID_SCHEMA
from .. import uris
from . import resources, tools
from .context import Call

STATS_TTL_MS = 5_000
STATS_TEMPLATE = types.ResourceTemplate(
    name="context-stats", title="Context stats", uri_template=uris.STATS_URI, mime_type="application/json",
    description="What the memory holds: live units and content bytes per type and per day, oldest and newest, "
                "units waiting for indexing, read-index lag, days stored. One fixed URI (no parameters).")

_CID = {"type": "string", "pattern": CID_SCHEMA["pattern"]}


def forget_input(config) -> dict:
    return {
        "type": "object",
        "properties": {
            "cid": dict(_CID, description="Forget this one unit."),
            "cids": {"type": "array", "items": _CID, "minItems": 1, "maxItems": MAX_CIDS,
                     "description": "Forget these units."},
            "types": {"type": "array", "items": {"type": "string", "enum": list(config.types)}},
            "source": {"type": "string", "description": "Exact source, or a prefix ending in '*'."},
            "since": {"type": "integer", "minimum": 0, "description": "Unix seconds, inclusive."},
            "until": {"type": "integer", "minimum": 0, "description": "Unix seconds, inclusive."},
            "parent_cid": dict(_CID, description="Only direct children of this unit."),
            "query": {"type": "string", "description": "Only units holding these words."},
            "operator": {"type": "string", "enum": ["and", "or"], "default": "and",
                         "description": "'and': units holding every query word (default); 'or': any."},
            "confirm": {"type": "string", "description": "The 'confirm' value of a dry run with the same "
                                                         "arguments: forget what it counted."},
        },
        "additionalProperties": False,
    }


def forget_output(config) -> dict:
    return FORGET_OUTPUT


FORGET_OUTPUT = {
    "type": "object",
    "properties": {
        "dry_run": {"type": "boolean"},
        "count": {"type": "integer", "description": "Units the dry run counted."},
        "confirm": {"type": "string"}, "confirm_expires_at": {"type": "integer"},
        "sample": {"type": "array", "items": {"type": "object", "properties": {
            "uri": {"type": "string"}, "cid": _CID, "type": {"type": "string"}, "source": {"type": "string"},
            "timestamp": {"type": "integer"}}}},
        "forgotten": {"type": "integer", "description": "Units forgotten (after the confirmation)."},
    },
    "required": ["dry_run", "count"],
}


def _forget(call: Call, args: dict):
    body = dict(args)
    cid = body.pop("cid", None)
    if cid is not None:
        body["cids"] = [*(body.get("cids") or []), cid]
    result = forget_units(call.tenant, body)
    for item in result.get("sample", []):
        item["uri"] = uris.unit_uri(item["cid"])
    return tools._ok(result)


FORGET = tools.ToolSpec(
    "context_forget", "Forget stored context",
    "Forget stored context units by CID or by filter (types, source, time, parent, query words). First "
    "call it without 'confirm': nothing is forgotten, it answers how many units match, a sample and a "
    "'confirm' value. Call it again with the same arguments plus that 'confirm' to forget them (never more "
    "than counted). Needs an admin key; cannot be undone.",
    "admin", forget_input, forget_output,
    types.ToolAnnotations(title="Forget stored context", read_only_hint=False, destructive_hint=True,
                          idempotent_hint=True, open_world_hint=False),
    _forget)


def read_stats(call: Call) -> types.ReadResourceResult:
    """context://stats: GET /mcp/stats as JSON."""
    body = {"tenant": call.tenant, **call.store.stats(call.tenant)}
    text = json.dumps(body, ensure_ascii=False, allow_nan=False, indent=1)
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=uris.STATS_URI, mime_type="application/json", text=text)],
        ttl_ms=STATS_TTL_MS, cache_scope="private")


def register() -> None:
    """Add the tool and the stats template to the MCP tables (idempotent)."""
    tools.TOOLS.setdefault(FORGET.name, FORGET)
    resources.FIXED_READERS[uris.STATS_URI] = read_stats
    if STATS_TEMPLATE not in resources.TEMPLATES:
        resources.TEMPLATES.append(STATS_TEMPLATE)
