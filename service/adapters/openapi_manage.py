"""The OpenAPI operations that see and manage the memory (list, stats, export, forget), merged into /openapi.json's paths.

Parameters reuse the search's field declarations (``params.properties``), so the filters are
described once; request bodies stay inline and flat for Dify's importer.
"""
from __future__ import annotations

from ..api.manage import CONFIRM_SECONDS, DEFAULT_LIMIT, MAX_CIDS
from ..params import properties
from ..store.base import LIST_MAX
from ..units import nullable as _nullable
from .openapi_parts import CID
from .openapi_parts import json_content as _json
from .openapi_parts import ref as _ref
from .openapi_parts import responses as _responses


def _filter_params(props: dict) -> list[dict]:
    params = [{"name": "types", "in": "query", "required": False,
               "description": "Comma-separated type names, or the parameter repeated (types=a&types=b).",
               "schema": {"type": "string"}}]
    for name in ("source", "since", "until", "parent_cid"):
        params.append({"name": name, "in": "query", "required": False, "description": props[name]["description"],
                       "schema": props[name]})
    return params


def paths(config) -> dict:
    props = properties("search", config)
    filters = _filter_params(props)
    unit_list = {"type": "object", "required": ["units", "next_cursor"], "properties": {
        "units": {"type": "array", "items": _ref("Unit")},
        "next_cursor": _nullable({"type": "string"}, "Pass as `cursor` for the next (older) page; null at the end.")}}
    counts = {"type": "object", "properties": {"units": {"type": "integer"}, "bytes": {"type": "integer"}}}
    stats = {"type": "object", "required": ["tenant", "units", "bytes", "types", "days"], "properties": {
        "tenant": {"type": "string"}, "units": {"type": "integer", "description": "Live units."},
        "bytes": {"type": "integer", "description": "UTF-8 bytes of their content."},
        "types": {"type": "object", "additionalProperties": counts, "description": "Per type."},
        "days": {"type": "array", "description": "Per day (the units' own UTC day), oldest first.",
                 "items": {"type": "object", "properties": {
                     "day": {"type": "string"}, "units": {"type": "integer"}, "bytes": {"type": "integer"},
                     "types": {"type": "object", "additionalProperties": {"type": "integer"}}}}},
        "oldest": _nullable({"type": "integer"}, "Oldest live unit's timestamp."),
        "newest": _nullable({"type": "integer"}, "Newest live unit's timestamp."),
        "index_pending": {"type": "integer", "description": "Units stored but not yet indexed."},
        "read_index": {"type": "object"}, "replica_lag_ms": {"type": "integer"},
        "day_files": {"type": "object", "description": "Days stored (SQLite: its day files; PostgreSQL: days "
                                                       "holding rows): count, bytes on disk, first, last."},
        "generated_at": {"type": "integer"},
        "streams": _nullable({"type": "object", "properties": {
            "open": {"type": "integer", "description": "The tenant's live streams open now, over every worker."},
            "tenant_limit": {"type": "integer", "description": "The most it may hold (CONTEXT_MAX_LISTENERS_PER_TENANT)."},
            "per_worker": {"type": "integer", "description": "One worker's stream slots."},
            "tenant_share_per_worker": {"type": "integer", "description": "The tenant's share of them."}}},
            "Live streams (null where the live hub is off).")}}
    forget_body = {"type": "object", "properties": {
        **{k: props[k] for k in ("types", "source", "since", "until", "parent_cid")},
        "query": {"type": "string", "description": "Only units holding these words (plain text, never syntax)."},
        "operator": {"type": "string", "enum": ["and", "or"], "default": "and",
                     "description": "With a query: units holding every word (and, the default) or any (or)."},
        "cids": {"type": "array", "items": CID, "minItems": 1, "maxItems": MAX_CIDS,
                 "description": "Only these units."},
        "confirm": {"type": "string", "description": "Omit for the dry run; then send the dry run's `confirm` "
                                                     "with the same filters to forget what it counted."}}}
    forget_answer = {"type": "object", "required": ["dry_run", "count"], "properties": {
        "dry_run": {"type": "boolean"}, "count": {"type": "integer", "description": "Units the dry run counted."},
        "confirm": {"type": "string", "description": f"Valid for {CONFIRM_SECONDS} s, for these filters only."},
        "confirm_expires_at": {"type": "integer"},
        "sample": {"type": "array", "items": {"type": "object"}, "description": "The first matching units."},
        "forgotten": {"type": "integer", "description": "Units forgotten (confirmation only)."}}}
    return {
        "/mcp/units": {"get": {
            "operationId": "listUnits", "summary": "List context units",
            "description": "Live context units, latest stored first, with the search filters; page on with `cursor`. "
                           "A page may be short when few units match or its units are large (a page ends once its "
                           "contents pass 8 MiB): follow `next_cursor` until it is null.",
            "parameters": filters + [
                {"name": "limit", "in": "query", "required": False, "description": f"Units per page (default "
                 f"{DEFAULT_LIMIT}).", "schema": {"type": "integer", "minimum": 1, "maximum": LIST_MAX}},
                {"name": "cursor", "in": "query", "required": False, "description": "`next_cursor` of the "
                 "previous page (opaque).", "schema": {"type": "string"}}],
            "responses": _responses(_json(unit_list, "A page of units."), "400", "401", "403", "429")}},
        "/mcp/stats": {"get": {
            "operationId": "getStats", "summary": "What the memory holds",
            "description": "Live units and content bytes per type and per day, oldest and newest, units waiting "
                           "for indexing, read-index lag and days stored.",
            "responses": _responses(_json(stats, "Statistics of the caller's tenant."), "400", "401", "403", "429")}},
        "/mcp/export": {"get": {
            "operationId": "exportUnits", "summary": "Export context units (JSONL)",
            "description": "Every live unit (optionally filtered) as JSON Lines, oldest first, with the fields a "
                           "push takes: `context-mode import` restores them with the same CIDs.",
            "parameters": filters,
            "responses": {"200": {"description": "One unit per line.", "content": {
                "application/x-ndjson": {"schema": {"type": "string"}}}},
                **{c: _json(_ref("Error"), "Error.") for c in ("400", "401", "403", "429")}}}},
        "/mcp/forget": {"post": {
            "operationId": "forgetUnits", "summary": "Forget context units (dry run, then confirm)",
            "description": "Bulk forget by the list filters, a query and/or CIDs (admin scope). Without "
                           "`confirm`: a dry run that forgets nothing and answers the count and a confirmation. "
                           "With it and the same filters: forget at most that many; they leave search at once.",
            "requestBody": {"required": True, "content": {"application/json": {"schema": forget_body}}},
            "responses": _responses(_json(forget_answer, "The dry run, or what was forgotten."),
                                    "400", "401", "403", "409", "429")}},
    }
