"""Thin REST blueprints (docs/design.md §4): parse, call the store, shape the answer."""
from __future__ import annotations

import json
import re

from flask import current_app, request

from werkzeug.exceptions import ClientDisconnected

from ..errors import ApiError, BadRequest


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def parse_json(raw: bytes):
    """Strict JSON from request bytes: UTF-8 only, no NaN/Infinity.
    Raises ValueError (incl. UnicodeDecodeError) or RecursionError; callers map them to their door's error."""
    return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)


_WS = re.compile(r"[ \t\n\r]*")
_BATCH_START = re.compile(r'[ \t\n\r]*(?:(\[)|\{[ \t\n\r]*"units"[ \t\n\r]*:[ \t\n\r]*\[)')


def parse_batch(text: str, limit: int):
    """Decode a push body so that a batch stops at ``limit`` + 1 items:
    a 32 MiB ``[{},{},...]`` costs ~1 GB as Python objects, its first thousand items almost nothing.
    ``[...]`` and ``{"units": [...]}`` are read item by item; anything else is decoded whole."""
    m = _BATCH_START.match(text)
    if not m:
        return json.loads(text, parse_constant=_reject_constant)
    bare = m.group(1) is not None
    decoder = json.JSONDecoder(parse_constant=_reject_constant)
    items: list = []
    i = _WS.match(text, m.end()).end()
    if text.startswith("]", i):
        i += 1
    else:
        while True:
            item, i = decoder.raw_decode(text, i)
            items.append(item)
            if len(items) > limit:
                raise BadRequest(f"A batch holds at most {limit} units.", code="batch_too_large", field="units")
            i = _WS.match(text, i).end()
            if text.startswith(",", i):
                i = _WS.match(text, i + 1).end()
                continue
            if text.startswith("]", i):
                i += 1
                break
            raise ValueError(f"expected ',' or ']' at char {i}")
    i = _WS.match(text, i).end()
    if not bare:
        if not text.startswith("}", i):
            raise BadRequest('A batch body is {"units": [...]} with no other field.', code="unknown_field",
                             field="units")
        i = _WS.match(text, i + 1).end()
    if i != len(text):
        raise ValueError(f"extra data at char {i}")
    return items if bare else {"units": items}


def json_body(batch_limit: int | None = None):
    """The request body as JSON (any Content-Type); 400 ``invalid_json`` when it does not parse.
    With ``batch_limit``, a batch longer than that is refused before the rest of it is decoded."""
    try:
        raw = request.get_data(cache=True)
    except (OSError, ClientDisconnected):
        # The client stopped sending (read timeout, see service/gunicorn_conf.py): free the worker thread.
        raise ApiError("The request body did not arrive in time.", code="request_timeout", status=408) from None
    if not raw.strip():
        raise BadRequest("The request body is empty; send a JSON document.", code="invalid_json")
    try:
        if batch_limit is not None:
            return parse_batch(raw.decode("utf-8"), batch_limit)
        return parse_json(raw)
    except RecursionError:
        raise BadRequest("The request body is nested too deeply.", code="invalid_json") from None
    except ValueError as e:
        # json's messages name a position, never Python internals (e.g. int-digit limits become this too).
        detail = f": {e.msg} at char {e.pos}" if isinstance(e, json.JSONDecodeError) else ""
        raise BadRequest(f"The request body is not valid UTF-8 JSON{detail}.", code="invalid_json") from None


def store():
    return current_app.extensions["context_store"]


def config():
    return current_app.config["CONTEXT"]
