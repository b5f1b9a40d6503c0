"""POST/GET /mcp/search and POST /mcp/context (docs/design.md §4)."""
from __future__ import annotations

from flask import Blueprint, jsonify, request

from ..auth import require
from ..packing import pack
from ..params import from_query_string, parse_context, parse_search
from . import config, json_body, store

bp = Blueprint("search", __name__)


@bp.route("/mcp/search", methods=["GET", "POST"])
@require("search")
def search(tenant):
    """BM25-ranked search over the tenant's live units."""
    body = from_query_string(request.args) if request.method == "GET" else json_body()
    return jsonify(store().search(tenant, parse_search(body, config())))


@bp.post("/mcp/context")
@require("search")
def context(tenant):
    """Search, then pack the best results into a prompt-ready block under a token budget."""
    params, budget, max_chars = parse_context(json_body(), config())
    found = store().search(tenant, params)
    packed = pack(found["results"], budget, max_chars)
    packed["freshness"] = found["freshness"]
    return jsonify(packed)
