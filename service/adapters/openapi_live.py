"""The OpenAPI description of live context and the tool registry: GET /mcp/stream and the tool registry (/mcp/tools).

Kept beside service/adapters/openapi.py, which merges these paths and schemas into /openapi.json.
Request bodies are flat and inline (Dify's importer reads only top-level properties).
"""
from __future__ import annotations

from functools import partial

from ..formats import TOOL_NAME_RE
from ..toolcheck import AUTH_TYPES, MAX_DESCRIPTION
from .openapi_parts import json_content as _json
from .openapi_parts import ref as _ref
from .openapi_parts import responses

NAME = {"type": "string", "pattern": f"^{TOOL_NAME_RE.pattern}$", "description": "The tool's name, unique per tenant.",
        "examples": ["get_weather"]}
ERRORS = {
    "400": "Invalid request (see `code` and `field`).",
    "401": "Missing or invalid API key.",
    "403": "The API key lacks the required scope.",
    "404": "No tool with this name.",
    "409": "A tool with this name is already registered.",
    "422": "A credential was found (`credential_not_allowed`), or the tenant has too many tools.",
    "429": "Rate limited, or too many open streams for this key or tenant; retry later.",
    "503": "Storage unavailable, or this server process has no stream left; retry after `Retry-After`.",
}

_responses = partial(responses, errors=ERRORS)


def _tool_body(config) -> dict:
    return {
        "type": "object", "required": ["name", "description", "input_schema"],
        "properties": {
            "name": NAME,
            "title": {"type": "string", "maxLength": 200, "description": "A display name."},
            "description": {"type": "string", "maxLength": MAX_DESCRIPTION,
                            "description": "What the tool does, in plain words: what tool search matches."},
            "endpoint": {"type": "string", "format": "uri",
                         "description": "Where the tool is called (http/https). Stored as text, never called; "
                                        "no credentials in it."},
            "auth_type": {"type": "string", "enum": list(AUTH_TYPES), "default": "none",
                          "description": "How the tool authenticates. The credential itself is never stored."},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "Lowercase tags for filters."},
            "metadata": {"type": "object", "description": "Any JSON object (at most 64 KiB); no credentials."},
            "input_schema": {"type": "object", "description": "JSON Schema 2020-12 of the arguments (type object)."},
            "output_schema": {"type": "object", "description": "JSON Schema 2020-12 of the result (type object)."},
        },
    }


def schemas() -> dict:
    return {
        "Tool": {"type": "object", "required": ["name", "uri", "description", "auth_type", "tags", "input_schema",
                                                "version"], "properties": {
            "name": NAME, "uri": {"type": "string", "description": "context://tools/{name} (MCP resource)."},
            "title": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "description": {"type": "string"},
            "endpoint": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "auth_type": {"type": "string", "enum": list(AUTH_TYPES)},
            "tags": {"type": "array", "items": {"type": "string"}},
            "metadata": {"anyOf": [{"type": "object"}, {"type": "null"}]},
            "input_schema": {"type": "object"}, "output_schema": {"anyOf": [{"type": "object"}, {"type": "null"}]},
            "version": {"type": "integer"}, "created_at": {"type": "integer"}, "updated_at": {"type": "integer"},
            "score": {"type": "number", "minimum": 0, "maximum": 1, "description": "Searches only (q)."},
            "bm25_score": {"type": "number", "description": "Searches only (q): raw BM25, higher is better."}}},
        "ToolList": {"type": "object", "required": ["tools"], "properties": {
            "tools": {"type": "array", "items": _ref("Tool")},
            "next_after": {"type": "string", "description": "Listing only: pass as `after` for the next page."}}},
    }


def paths(config) -> dict:
    types = list(config.types)
    name_param = {"name": "name", "in": "path", "required": True, "description": "The tool's name.", "schema": NAME}
    body = _tool_body(config)
    tool_ok = _json(_ref("Tool"), "The tool.")
    return {
        "/mcp/stream": {"get": {
            "operationId": "streamUnits", "summary": "Stream new context units (SSE)",
            "description": "Server-Sent Events of newly indexed units matching the filters, in seq order: "
                           "`id: <seq>`, `event: unit`, `data: <unit JSON>`. Reconnect with `Last-Event-ID` (the "
                           "last id) to resume without loss; without it the stream starts now. The server ends "
                           "it with `event: end` (shutdown, idle limit). Long-lived: not for tool-calling LLMs.",
            "x-streaming": True,
            "parameters": [
                {"name": "query", "in": "query", "required": False, "schema": {"type": "string"},
                 "description": "Plain text: only units with any (operator=and: all) of its words. None: every unit."},
                {"name": "types", "in": "query", "required": False, "schema": {"type": "string"},
                 "description": f"Comma-separated unit types ({', '.join(types)}), or the parameter repeated."},
                {"name": "source", "in": "query", "required": False, "schema": {"type": "string"},
                 "description": "Only this source; a trailing '*' matches a prefix."},
                {"name": "operator", "in": "query", "required": False,
                 "schema": {"type": "string", "enum": ["or", "and"]}, "description": "How query words combine."},
                {"name": "last_event_id", "in": "query", "required": False,
                 "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
                 "description": "Resume after this seq, as the Last-Event-ID header does (the header wins)."},
            ],
            "responses": {"200": {"description": "An SSE stream of units.",
                                  "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                          **{c: _json(_ref("Error"), ERRORS[c]) for c in ("400", "401", "403", "429", "503")}}}},
        "/mcp/tools": {
            "get": {"operationId": "findTools", "summary": "Search or list registered tools",
                    "description": "With `q`: the tools best matching that plain text (BM25 over names, "
                                   "descriptions and schema fields), each with its JSON Schemas, to pick a tool "
                                   "and build a valid call. Without `q`: every tool by name, `after` a name.",
                    "parameters": [
                        {"name": "q", "in": "query", "required": False, "schema": {"type": "string", "maxLength": 4096},
                         "description": "What the tool should do, in plain words."},
                        {"name": "top_k", "in": "query", "required": False,
                         "schema": {"type": "integer", "minimum": 1, "maximum": 50, "default": 5},
                         "description": "With q: how many tools."},
                        {"name": "tags", "in": "query", "required": False, "schema": {"type": "string"},
                         "description": "Comma-separated tags; only tools with all of them."},
                        {"name": "auth_type", "in": "query", "required": False,
                         "schema": {"type": "string", "enum": list(AUTH_TYPES)}, "description": "Only this auth type."},
                        {"name": "after", "in": "query", "required": False, "schema": {"type": "string"},
                         "description": "Listing: names after this one."},
                        {"name": "limit", "in": "query", "required": False,
                         "schema": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
                         "description": "Listing: page size."},
                    ],
                    "responses": _responses(_json(_ref("ToolList"), "Tools."), "400", "401", "403", "429")},
            "post": {"operationId": "registerTool", "summary": "Register a tool",
                     "description": "Describe a tool (admin scope): name, description, endpoint, auth_type, tags, "
                                    "metadata, JSON Schema 2020-12 input and output schemas. The endpoint is never "
                                    "called and credentials are refused.",
                     "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
                     "responses": _responses(_json(_ref("Tool"), "Registered."), "400", "401", "403", "409", "422",
                                             "429")}},
        "/mcp/tools/{name}": {
            "get": {"operationId": "getTool", "summary": "Read a registered tool",
                    "description": "One tool with its schemas.", "parameters": [name_param],
                    "responses": _responses(tool_ok, "401", "403", "404", "429")},
            "put": {"operationId": "updateTool", "summary": "Update a registered tool",
                    "description": "Replace a tool's description (admin scope); its version goes up.",
                    "parameters": [name_param],
                    "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
                    "responses": _responses(tool_ok, "400", "401", "403", "404", "422", "429")},
            "delete": {"operationId": "deleteTool", "summary": "Delete a registered tool",
                       "description": "Remove a tool from the registry (admin scope).", "parameters": [name_param],
                       "responses": _responses(_json({"type": "object", "properties": {
                           "status": {"type": "string"}, "name": NAME}}, "Deleted."), "401", "403", "404", "429")}},
    }
