"""Thin REST blueprints (docs/design.md §4): parse, call the store, shape the answer.

Modules: units.py (push, one unit, lineage, delete), search.py (search and packed context), manage.py (list,
stats, export, forget), stream.py (live context as Server-Sent Events), tools.py (the tool registry),
health.py (/healthz, /readyz)."""
from __future__ import annotations

from flask import current_app, request

from werkzeug.exceptions import ClientDisconnected

from ..errors import ApiError, BadRequest, invalid_json
from ..units import loads_strict
from ..state import app_state


def parse_json(raw: bytes):
    """Strict JSON from request bytes: UTF-8 only, no NaN/Infinity.
    Raises ValueError (incl. UnicodeDecodeError) or RecursionError; callers map them to their door's error."""
    return loads_strict(raw.decode("utf-8"))


def json_body(decode=parse_json):
    """The request body decoded by ``decode`` (strict JSON by default; any Content-Type); 400
    ``invalid_json`` when it does not parse."""
    try:
        raw = request.get_data(cache=True)
    except (OSError, ClientDisconnected):
        # The client stopped sending (read timeout, see service/gunicorn_conf.py): free the worker thread.
        raise ApiError("The request body did not arrive in time.", code="request_timeout", status=408) from None
    if not raw.strip():
        raise BadRequest("The request body is empty; send a JSON document.", code="invalid_json")
    try:
        return decode(raw)
    except (ValueError, RecursionError) as e:
        raise invalid_json(e) from None


def store():
    return app_state().store


def config():
    return current_app.config["CONTEXT"]
