"""Building blocks of /openapi.json shared by openapi.py and openapi_manage.py (so neither imports the
other's module-level helpers: no import cycle, tests/test_code_shape.py)."""
from __future__ import annotations

from ..units import CID_SCHEMA

CID = CID_SCHEMA
ERRORS = {
    "400": "Invalid request (see `code` and `field`).",
    "401": "Missing or invalid API key.",
    "403": "The API key lacks the required scope.",
    "404": "No live unit with this CID.",
    "409": "CID collision: another unit already has this CID.",
    "422": "Already expired, or the parent unit does not exist.",
    "429": "Rate limited; retry after `Retry-After` seconds.",
    "503": "Storage unavailable; retry after `Retry-After` seconds.",
}


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def json_content(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def responses(ok: dict, *codes: str, errors: dict[str, str] = ERRORS) -> dict:
    """``ok`` as the 200 answer, and the error shape under each of ``codes`` (described from ``errors``)."""
    out = {"200": ok}
    for code in codes:
        out[code] = json_content(ref("Error"), errors.get(code, "Error."))
    return out
