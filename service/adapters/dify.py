"""POST /retrieval: Dify's External Knowledge API (docs/design.md §8).

Dify posts ``{"knowledge_id", "query", "retrieval_setting": {"top_k", "score_threshold"},
"metadata_condition"}`` with ``Authorization: Bearer <key>``; errors use Dify's own shape
``{"error_code", "error_msg"}``, never ours. Registering an endpoint, Dify posts to it with
no body at all (api/services/external_knowledge_service.py, check_endpoint_and_api_key) and
fails the registration only on 403, 404 or 502: that probe gets an empty record list.
"""
from __future__ import annotations

from flask import Blueprint, current_app, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from ..api import parse_json
from ..auth import DEFAULT_TENANT, bearer_token
from ..errors import ApiError, invalid_json
from ..packing import unrepeated, window_text
from ..params import MAX_QUERY_CHARS, parse_search
from .conditions import UNIT_FIELDS, ConditionError, parse_metadata_condition
from ..state import app_state

bp = Blueprint("dify", __name__)

DEFAULT_TOP_K = 10
MAX_TOP_K = 100
# Dify's suggested codes (1001, 1002, 2001) plus ours for bodies Dify itself never sends.
MALFORMED_AUTH, AUTH_FAILED, UNKNOWN_KNOWLEDGE = 1001, 1002, 2001
INVALID_REQUEST, BODY_TOO_LARGE, UNAVAILABLE = 3001, 3002, 5001


class DifyError(Exception):
    def __init__(self, status: int, error_code: int, error_msg: str, headers: dict | None = None):
        super().__init__(error_msg)
        self.status, self.error_code, self.error_msg = status, error_code, error_msg
        self.headers = headers or {}


@bp.errorhandler(DifyError)
def _dify_error(e: DifyError):
    rv = jsonify({"error_code": e.error_code, "error_msg": e.error_msg})
    rv.status_code = e.status
    rv.headers.update(e.headers)
    return rv


def _tenant() -> str:
    """The caller's tenant; 401 (never 403: Dify reads 403 as "wrong key" at registration) otherwise."""
    ring = app_state().keys
    if ring.open:
        return DEFAULT_TENANT
    token, problem = bearer_token(request.headers.get("Authorization"))
    if problem:
        raise DifyError(401, MALFORMED_AUTH,
                        "Invalid Authorization header format. Expected 'Bearer <api-key>' format.")
    principal = ring.authenticate(token)
    if principal is None:
        raise DifyError(401, AUTH_FAILED, "Authorization failed: unknown API key.")
    if "search" not in principal.scopes:
        raise DifyError(401, AUTH_FAILED, "Authorization failed: this API key lacks the 'search' scope.")
    return principal.tenant


_PROBE = object()


def _body():
    """The parsed JSON body, or _PROBE when there is no body at all."""
    try:
        raw = request.get_data(cache=True)
    except RequestEntityTooLarge:
        raise DifyError(413, BODY_TOO_LARGE, "Request body too large.") from None
    if not raw.strip():
        return _PROBE
    try:
        return parse_json(raw)       # the strict decoder of every door: UTF-8, no NaN/Infinity
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise DifyError(400, INVALID_REQUEST, invalid_json(e).message) from None


def _bad(msg: str) -> DifyError:
    return DifyError(400, INVALID_REQUEST, msg)


def _retrieval_setting(raw) -> tuple[int, float]:
    if raw is None:
        return DEFAULT_TOP_K, 0.0
    if not isinstance(raw, dict):
        raise _bad("'retrieval_setting' must be an object.")
    top_k = raw.get("top_k")
    if top_k is None:
        top_k = DEFAULT_TOP_K
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise _bad("'retrieval_setting.top_k' must be a positive integer or null.")
    threshold = raw.get("score_threshold")
    if threshold is None:
        threshold = 0.0
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise _bad("'retrieval_setting.score_threshold' must be a number between 0 and 1.")
    return min(top_k, MAX_TOP_K), float(threshold)


def record(unit: dict) -> dict:
    """One search result as a Dify record; ``metadata`` is always an object (null breaks Dify)."""
    meta = {k: v for k, v in (unit.get("metadata") or {}).items()}
    meta.update({k: unit[k] for k in UNIT_FIELDS}, bm25_score=unit["bm25_score"])
    return {"content": window_text(unit), "score": unit["score"],
            "title": f"{unit['type']} {unit['cid']} ({unit['source']})", "metadata": meta}


def _retrieve():
    tenant = _tenant()
    body = _body()
    if body is _PROBE:
        return jsonify({"records": []})   # Dify's registration probe
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.")
    knowledge_id = body.get("knowledge_id")
    if knowledge_id is None:
        knowledge_id = ""
    if not isinstance(knowledge_id, str):
        raise _bad("'knowledge_id' must be a string.")
    # A knowledge base is a tenant; another tenant's name is as unknown as a made-up one.
    if knowledge_id.strip() not in ("", tenant):
        raise DifyError(404, UNKNOWN_KNOWLEDGE, "The knowledge base does not exist.")
    query = body.get("query")
    if not isinstance(query, str):
        raise _bad("'query' is required and must be a string.")
    top_k, threshold = _retrieval_setting(body.get("retrieval_setting"))
    try:
        condition = parse_metadata_condition(body.get("metadata_condition"))
    except ConditionError as e:
        raise _bad(str(e)) from None
    if not query.strip():
        return jsonify({"records": []})
    config = current_app.config["CONTEXT"]
    store = app_state().store
    # Metadata filters run on results: fetch the most candidates search allows, then cut to top_k.
    params = {"query": query[:MAX_QUERY_CHARS], "top_k": MAX_TOP_K if condition else top_k,
              "min_score": threshold, "neighbors": config.dify_neighbors}
    try:
        found = store.search(tenant, parse_search(params, config))
    except ApiError as e:
        if e.status >= 500:
            raise DifyError(503, UNAVAILABLE, e.message, headers=e.headers) from None
        raise _bad(e.message) from None
    results = [r for r in found["results"] if r["score"] >= threshold]
    if condition:
        results = [r for r in results if condition.matches(r)]
    return jsonify({"records": [record(r) for r in unrepeated(results[:top_k])]})


@bp.post("/retrieval")
def retrieval():
    """Dify External Knowledge retrieval: BM25 search of the key's tenant."""
    return _retrieve()


# Dify appends "/retrieval" to the registered endpoint, so "http://host/" becomes "//retrieval".
bp.add_url_rule("//retrieval", "retrieval_double_slash", _retrieve, methods=["POST"], merge_slashes=False)
