"""See and manage the memory: GET /mcp/units, GET /mcp/stats, GET /mcp/export,
POST /mcp/forget. Tenant-scoped like every view; filters are the search filters (``parse_search``)."""
from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator

from flask import Blueprint, Response, jsonify, request

from .. import tokens
from ..auth import require
from ..errors import ApiError, BadRequest, Conflict
from ..formats import is_cid
from ..shares.answers import released_when_sent, take_answer_slot
from ..params import SearchParams, parse_search, query_list, query_value
from ..store.base import LIST_MAX, SAMPLE
from . import config, json_body, store
from ..state import app_state

bp = Blueprint("manage", __name__)

LIST_FIELDS = ("types", "source", "since", "until", "parent_cid")
FORGET_FIELDS = LIST_FIELDS + ("query", "operator", "cids", "confirm")
DEFAULT_LIMIT = 50
MAX_CIDS = 1000
CONFIRM_SECONDS = 600


def parse_filters(body: dict, *, query: str = "", operator: str = "or") -> SearchParams:
    """The list filters of ``body``, validated exactly as /mcp/search validates them."""
    fields = {k: body[k] for k in LIST_FIELDS if k in body}
    return parse_search({**fields, "query": query, "operator": operator}, config())


def _fingerprint(p: SearchParams, **extra) -> str:
    return tokens.digest({"types": sorted(p.types or ()), "source": p.source, "since": p.since, "until": p.until,
                          "parent_cid": p.parent_cid, **extra})


def _query_args(allowed: tuple[str, ...]) -> dict:
    """Query-string parameters as a body: integers, comma-separated types; unknown names are 400."""
    body: dict = {}
    for name in request.args:
        if name not in allowed:
            raise BadRequest(f"Unknown parameter {name!r}; known: {', '.join(allowed)}.", code="unknown_field",
                             field=name)
        if name == "types":
            body[name] = query_list(request.args, name)
            continue
        value = query_value(request.args, name)
        if name in ("since", "until", "limit"):
            try:
                body[name] = int(value)
            except ValueError:
                raise BadRequest(f"Parameter {name!r} must be an integer.", field=name) from None
        else:
            body[name] = value
    return body


@bp.get("/mcp/units")
@require("search")
def list_units(tenant):
    """Live units, latest stored first, with the search filters; ``cursor`` from ``next_cursor`` pages on."""
    args = _query_args(LIST_FIELDS + ("limit", "cursor"))
    p = parse_filters(args)
    limit = args.get("limit", DEFAULT_LIMIT)
    if not 1 <= limit <= LIST_MAX:
        raise BadRequest(f"Parameter 'limit' must be between 1 and {LIST_MAX}.", field="limit")
    fingerprint = _fingerprint(p)
    before = None
    if "cursor" in args:
        data = tokens.unseal("units", tenant, args["cursor"], field="cursor", code="invalid_cursor")
        if data.get("f") != fingerprint or not isinstance(data.get("b"), int):
            raise BadRequest("This cursor belongs to a listing with other filters; start again without it.",
                             code="invalid_cursor", field="cursor")
        before = data["b"]
    units, next_before = store().list_units(tenant, p, limit, before)
    cursor = tokens.seal("units", tenant, {"b": next_before, "f": fingerprint}) if next_before is not None else None
    return jsonify({"units": units, "next_cursor": cursor})


@bp.get("/mcp/stats")
@require("search")
def stats(tenant):
    """Units and bytes per type and per day, oldest and newest, index backlog, replica lag, days stored, and the
    tenant's live streams (open over every worker, and the bounds they meet)."""
    _query_args(())
    streams = app_state().hub.streams(tenant)
    return jsonify({"tenant": tenant, **store().stats(tenant), "streams": streams})


@bp.get("/mcp/export")
@require("search")
def export(tenant):
    """Every live unit (optionally filtered) as JSONL, oldest first: `context-mode import` takes it back."""
    p = parse_filters(_query_args(LIST_FIELDS))
    units = store().export_units(tenant, p)
    chunks = _jsonl(units)
    headers = {"Content-Disposition": f'attachment; filename="context-mode-{tenant}.jsonl"',
               "Cache-Control": "no-store"}
    # Read up to the large-answer threshold first: a small export is one answer, a large one takes a slot
    # while its thread streams it (service/shares/answers.py), or is refused before anything is sent.
    head, size = [], 0
    for chunk in chunks:
        head.append(chunk)
        size += len(chunk.encode("utf-8"))
        if size > config().large_answer_bytes:
            break
    else:
        return Response("".join(head), mimetype="application/x-ndjson", headers=headers)
    try:
        release = take_answer_slot()
    except ApiError:
        chunks.close()
        getattr(units, "close", lambda: None)()      # the store's read ends now, not when collected
        raise
    return Response(released_when_sent(itertools.chain(head, chunks), release), mimetype="application/x-ndjson",
                    headers=headers)


def _jsonl(units) -> Iterator[str]:
    """Export lines in pieces of about 64 KiB."""
    chunk: list[str] = []
    size = 0
    for unit in units:
        line = json.dumps(unit, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"
        chunk.append(line)
        size += len(line)
        if size >= 65536:
            yield "".join(chunk)
            chunk, size = [], 0
    if chunk:
        yield "".join(chunk)


def parse_forget(body) -> tuple[SearchParams, list[str] | None, str | None]:
    if not isinstance(body, dict):
        raise BadRequest("The forget body must be a JSON object.", code="invalid_body")
    unknown = sorted(set(body) - set(FORGET_FIELDS))
    if unknown:
        raise BadRequest(f"Unknown field {unknown[0]!r}.", code="unknown_field", field=unknown[0])
    cids = body.get("cids")
    if cids is not None:
        if not isinstance(cids, list) or not cids or len(cids) > MAX_CIDS or not all(is_cid(c) for c in cids):
            raise BadRequest(f"Field 'cids' must be a list of 1 to {MAX_CIDS} CIDs (12 lowercase hex digits).",
                             code="invalid_cid", field="cids")
        cids = sorted(set(cids))
    query = body.get("query")
    p = parse_filters(body, query="" if query is None else query, operator=body.get("operator") or "and")
    confirm = body.get("confirm")
    if confirm is not None and not isinstance(confirm, str):
        raise BadRequest("Field 'confirm' must be the string a dry run returned.", code="invalid_confirm",
                         field="confirm")
    return p, cids, confirm


def forget_units(tenant: str, body) -> dict:
    """A dry run (no ``confirm``): how many units match, a sample, and a token; with that token and the
    same filters: forget them. Never more than the dry run counted, never a unit pushed after it."""
    p, cids, confirm = parse_forget(body)
    fingerprint = _fingerprint(p, query=p.query, operator=p.operator, cids=cids)
    s = store()
    if confirm is None:
        max_seq = s.max_seq(tenant)
        found = s.matches(tenant, p, cids=cids, max_seq=max_seq)
        expires_at = int(time.time()) + CONFIRM_SECONDS
        token = tokens.seal("forget", tenant, {"f": fingerprint, "s": max_seq, "n": len(found), "x": expires_at})
        sample = [{k: r[k] for k in ("cid", "type", "source", "timestamp")} for r in found[:SAMPLE]]
        return {"dry_run": True, "count": len(found), "confirm": token, "confirm_expires_at": expires_at,
                "sample": sample}
    data = tokens.unseal("forget", tenant, confirm, field="confirm", code="invalid_confirm")
    if data.get("f") != fingerprint:
        raise BadRequest("This confirmation belongs to a dry run with other filters; send the same filters, "
                         "or run the dry run again.", code="invalid_confirm", field="confirm")
    if not isinstance(data.get("x"), int) or data["x"] < time.time():
        raise BadRequest("This confirmation has expired; run the dry run again.", code="confirm_expired",
                         field="confirm")
    found = s.matches(tenant, p, cids=cids, max_seq=data["s"])
    if len(found) > data["n"]:
        raise Conflict(f"{len(found)} units match now, more than the {data['n']} the dry run counted; "
                       "run the dry run again.", code="forget_changed", field="confirm")
    by_day: dict[str, list[str]] = {}
    for r in found:
        by_day.setdefault(r["day"], []).append(r["cid"])
    removed = s.remove(tenant, by_day)
    return {"dry_run": False, "forgotten": removed, "count": data["n"]}


@bp.post("/mcp/forget")
@require("admin")
def forget(tenant):
    """Bulk forget by the list filters, a query and/or CIDs: a dry run first, then the confirmation."""
    return jsonify(forget_units(tenant, json_body()))
