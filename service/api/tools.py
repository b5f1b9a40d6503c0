"""The tool registry over REST: /mcp/tools. ``admin`` writes, ``search`` reads."""
from __future__ import annotations

from flask import Blueprint, jsonify, request

from ..auth import require
from ..errors import BadRequest, NotFound
from ..params import plain_text
from ..toolcheck import AUTH_TYPES, is_tool_name, parse_tags, parse_tool_search
from . import json_body
from ..state import app_state

bp = Blueprint("tools", __name__)

LIST_ARGS = {"q", "top_k", "tags", "auth_type", "after", "limit"}


def registry():
    return app_state().registry


def _name(name: str) -> str:
    """A path segment that is no tool name names no tool; echo only a short prefix of it."""
    if not is_tool_name(name):
        shown = name[:24] + ("…" if len(name) > 24 else "")
        raise NotFound(f"No tool named {shown!r} is registered.", field="name")
    return name


def _int_arg(name: str, lo: int, hi: int, default: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"Parameter {name!r} must be an integer.", field=name) from None
    if not lo <= value <= hi:
        raise BadRequest(f"Parameter {name!r} must be between {lo} and {hi}.", field=name)
    return value


@bp.post("/mcp/tools")
@require("admin")
def register(tenant):
    """Register a tool (409 when its name is taken)."""
    return jsonify(registry().create(tenant, json_body()))


@bp.get("/mcp/tools")
@require("search")
def list_or_search(tenant):
    """With ``q``: the best tools for that text (BM25). Without: every tool by name, ``after`` a name."""
    unknown = sorted(set(request.args) - LIST_ARGS)
    if unknown:
        raise BadRequest(f"Unknown parameter {unknown[0]!r}.", code="unknown_field", field=unknown[0])
    auth_type = request.args.get("auth_type")
    if auth_type is not None and auth_type not in AUTH_TYPES:
        raise BadRequest(f"Parameter 'auth_type' must be one of: {', '.join(AUTH_TYPES)}.",
                         code="invalid_auth_type", field="auth_type")
    tags = parse_tags(request.args.get("tags"))
    if "q" in request.args:
        found = parse_tool_search({"query": request.args["q"], "top_k": _int_arg("top_k", 1, 50, 5),
                              "tags": list(tags), "auth_type": auth_type})
        return jsonify({"tools": registry().search(tenant, found["query"], top_k=found["top_k"], tags=found["tags"],
                                                    auth_type=found["auth_type"])})
    limit = _int_arg("limit", 1, 200, 50)
    after = plain_text(request.args.get("after", ""), "after")
    tools = registry().list(tenant, after=after, limit=limit, tags=tags, auth_type=auth_type)
    body = {"tools": tools}
    if len(tools) == limit:
        body["next_after"] = tools[-1]["name"]
    return jsonify(body)


@bp.get("/mcp/tools/<name>")
@require("search")
def get_tool(tenant, name):
    """One registered tool with its schemas."""
    return jsonify(registry().require(tenant, _name(name)))


@bp.put("/mcp/tools/<name>")
@require("admin")
def update_tool(tenant, name):
    """Replace a registered tool's description (404 when there is none)."""
    return jsonify(registry().replace(tenant, _name(name), json_body()))


@bp.delete("/mcp/tools/<name>")
@require("admin")
def delete_tool(tenant, name):
    """Remove a tool from the registry."""
    return jsonify(registry().delete(tenant, _name(name)))
