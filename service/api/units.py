"""POST /mcp/push and /mcp/units/<cid> (docs/design.md §4)."""
from __future__ import annotations

from flask import Blueprint, jsonify

from ..auth import require
from ..errors import BadRequest
from ..formats import is_cid
from ..units import decode_push
from . import config, json_body, store

bp = Blueprint("units", __name__)


@bp.post("/mcp/push")
@require("push")
def push(tenant):
    """Store one unit, or a batch ({"units": [...]} or a JSON array); ack after it is durable.
    The body is decoded and checked one unit at a time, each held to a raw-text cap (decode_push)."""
    body, batch = json_body(lambda raw: decode_push(raw, config()))
    if batch:
        if not body:
            raise BadRequest("A batch must hold at least one unit.", code="empty_batch", field="units")
        return jsonify({"results": store().push_batch(tenant, body)})
    return jsonify(store().push_one(tenant, body))


def _checked(cid: str) -> str:
    """A path segment that is no CID is 400 invalid_cid, as a malformed parent_cid is; echo only a short
    prefix of it."""
    if not is_cid(cid):
        shown = cid[:24] + ("…" if len(cid) > 24 else "")
        raise BadRequest(f"{shown!r} is not a CID: a CID is 12 lowercase hex digits.", code="invalid_cid",
                         field="cid")
    return cid


@bp.get("/mcp/units/<cid>")
@require("search")
def get_unit(tenant, cid):
    """One live unit by CID."""
    return jsonify(store().require(tenant, _checked(cid)))


@bp.get("/mcp/units/<cid>/lineage")
@require("search")
def lineage(tenant, cid):
    """Ancestors (root last) and children of a unit, at most max_lineage_bytes of content (``truncated``)."""
    return jsonify(store().lineage(tenant, _checked(cid), max_bytes=config().max_lineage_bytes))


@bp.delete("/mcp/units/<cid>")
@require("admin")
def delete_unit(tenant, cid):
    """Remove a unit everywhere."""
    return jsonify(store().delete(tenant, _checked(cid)))
