"""POST/GET /mcp/search and POST /mcp/context (DESIGN.md section 4)."""
from __future__ import annotations

from flask import Blueprint, jsonify, request

from ..auth import require
from ..errors import BadRequest
from ..packing import pack, parse_context
from ..search import SEARCH_FIELDS, parse_search
from . import config, json_body, store

bp = Blueprint("search", __name__)

_INT_ARGS = ("top_k", "since", "until", "after_seq")
_BOOL_ARGS = ("highlight", "explain")


def _query_args() -> dict:
    """GET /mcp/search?q=...: the same fields as the JSON body, from the query string."""
    args = request.args
    body: dict = {}
    for key in args:
        name = "query" if key == "q" else key
        if name not in SEARCH_FIELDS:
            raise BadRequest(f"Unknown parameter {key!r}.", code="unknown_field", field=key)
        value = args.get(key)
        if name in _INT_ARGS:
            try:
                body[name] = int(value)
            except ValueError:
                raise BadRequest(f"Parameter {key!r} must be an integer.", field=name) from None
        elif name == "min_score":
            try:
                body[name] = float(value)
            except ValueError:
                raise BadRequest("Parameter 'min_score' must be a number.", field=name) from None
        elif name in _BOOL_ARGS:
            body[name] = value.lower() in ("1", "true", "yes", "on")
        elif name == "types":
            body[name] = [x for x in value.split(",") if x]
        else:
            body[name] = value
    return body


@bp.route("/mcp/search", methods=["GET", "POST"])
@require("search")
def search(tenant):
    """BM25-ranked search over the tenant's live units."""
    body = _query_args() if request.method == "GET" else json_body()
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
