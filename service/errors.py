"""One error tree and one error body (docs/design.md §4): {"error", "code", "field"?}."""
from __future__ import annotations

import errno
import json
import logging
import math
import sqlite3

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


def encodable(text: str | None) -> str | None:
    """``text`` as UTF-8 can carry it: a lone surrogate (a name the client sent, echoed in a message or as
    the ``field``) becomes its ``\\udXXX`` escape instead of failing the answer's encoding (a 500)."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


class ApiError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, code: str | None = None, field: str | None = None,
                 status: int | None = None, headers: dict | None = None):
        message, field = encodable(message), encodable(field)
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        if status:
            self.status = status
        self.field = field
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.code, self.field)


class BadRequest(ApiError):
    status, code = 400, "invalid_field"


class Unauthorized(ApiError):
    status, code = 401, "unauthorized"


class Forbidden(ApiError):
    status, code = 403, "forbidden"


class NotFound(ApiError):
    status, code = 404, "not_found"


class Conflict(ApiError):
    status, code = 409, "cid_collision"


class Unprocessable(ApiError):
    status, code = 422, "unprocessable"


class TooCostly(Unprocessable):
    """A search that did more work on the primary files than one request may."""
    code = "query_too_expensive"


class StorageUnavailable(ApiError):
    """Storage cannot take writes (read-only, full, locked too long): retry later."""
    status, code = 503, "storage_unavailable"

    def __init__(self, message: str = "Storage is unavailable; retry later.", **kw):
        kw.setdefault("headers", {"Retry-After": "5"})
        super().__init__(message, **kw)


class Busy(ApiError):
    """Every search slot of this worker is taken: retry shortly."""
    status, code = 503, "search_busy"

    def __init__(self, message: str = "Too many searches at once; retry shortly.", **kw):
        kw.setdefault("headers", {"Retry-After": "1"})
        super().__init__(message, **kw)


def retry_after(seconds: float) -> dict:
    """A ``Retry-After`` header for a wait of ``seconds`` (whole seconds, at least one)."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


class TooManySearches(ApiError):
    """This key's or tenant's share of a worker's searches (its slots, or its CPU while others search) is in use:
    refused at once, never waited for in a thread (service/shares/searches.py)."""
    status, code = 429, "too_many_searches"

    def __init__(self, message: str, wait_s: float = 1.0, **kw):
        kw.setdefault("headers", retry_after(wait_s))
        super().__init__(message, **kw)


class ThreadsBusy(ApiError):
    """This key (or tenant) already has its share of a worker's threads busy, and its request waited for one
    (without a thread) as long as it may (service/shares/admission.py ``Admission``)."""
    status, code = 429, "too_many_requests"

    def __init__(self, message: str, **kw):
        kw.setdefault("headers", {"Retry-After": "1"})
        super().__init__(message, **kw)


def invalid_json(exc: BaseException) -> BadRequest:
    """The 400 for a body that does not decode: the decoder's syntax message and position, a number
    too long to convert said as such, never Python internals."""
    if isinstance(exc, RecursionError):
        return BadRequest("The request body is nested too deeply.", code="invalid_json")
    if "integer string conversion" in str(exc):      # Python's int() guard (sys.int_info.default_max_str_digits)
        return BadRequest("The request body holds an integer longer than 4300 digits; send such a number as a "
                          "string.", code="invalid_number")
    detail = f": {exc.msg} at char {exc.pos}" if isinstance(exc, json.JSONDecodeError) else ""
    return BadRequest(f"The request body is not valid UTF-8 JSON{detail}.", code="invalid_json")


# SQLite failures that mean the storage itself is unavailable (full, read-only, missing, locked, damaged).
_STORAGE_MESSAGES = ("disk is full", "readonly database", "unable to open database", "disk i/o error",
                     "database is locked", "no such table", "file is not a database",
                     "database disk image is malformed")
_STORAGE_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EIO)


def storage_error(exc: BaseException) -> ApiError | None:
    """The ApiError an exception stands for: itself, 503 + Retry-After for a storage failure
    (sqlite3 errors by message, OSError by errno), else None."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, sqlite3.OperationalError | sqlite3.DatabaseError):
        msg = str(exc).lower()
        if any(m in msg for m in _STORAGE_MESSAGES):
            log.error("storage unavailable: %s", exc)
            return StorageUnavailable(f"Storage is unavailable ({exc}); retry later.")
    if isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
        log.error("storage unavailable: %s", exc)
        return StorageUnavailable(f"Storage is unavailable ({exc.strerror}); retry later.")
    return None


def error_body(message: str, code: str, field: str | None = None) -> dict:
    body = {"error": message, "code": code}
    if field is not None:
        body["field"] = field
    return body


# werkzeug's HTTPException names mapped to our machine codes.
_HTTP_CODES = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 408: "request_timeout", 411: "length_required",
    413: "payload_too_large", 414: "uri_too_long", 415: "unsupported_media_type",
    429: "rate_limited", 431: "headers_too_large",
}


# Error codes in a JSON-RPC body for failures the /mcp door answers before JSON-RPC starts.
_RPC_CODES = {401: -32010, 403: -32011}
# Dify's suggested codes (service/adapters/dify.py) for the same failures on /retrieval.
_DIFY_CODES = {400: 3001, 401: 1002, 403: 1002, 404: 2001, 413: 3002, 415: 3001, 429: 3003}


def door() -> str:
    """Which front door the current request came through: 'mcp', 'dify' or 'rest'."""
    path = request.path
    if path == "/mcp":
        return "mcp"
    if path in ("/retrieval", "//retrieval"):
        return "dify"
    return "rest"


def respond(status: int, code: str, message: str, field: str | None = None, headers: dict | None = None):
    """One error response in the shape of the door it answers: JSON-RPC for /mcp, Dify's for
    /retrieval, {"error", "code", "field"?} (docs/design.md §4) everywhere else."""
    which = door()
    if which == "mcp":
        body = {"jsonrpc": "2.0", "id": None,
                "error": {"code": _RPC_CODES.get(status, -32600 if status < 500 else -32603), "message": message,
                          "data": {"code": code}}}
    elif which == "dify":
        body = {"error_code": _DIFY_CODES.get(status, 3001 if status < 500 else 5001), "error_msg": message}
    else:
        body = error_body(message, code, field)
    rv = jsonify(body)
    rv.status_code = status
    rv.headers.update(headers or {})
    return rv


# Answers that tell a client to come back later; the rate limit adds Retry-After to every response of a
# limited route (the time until its window resets), which on a 200 reads as "you are being throttled".
_RETRY_STATUSES = (429, 503)


def init_app(app: Flask) -> None:
    @app.after_request
    def _retry_after_only_when_retrying(response):
        # Registered first, so it runs after every other after_request (the limiter's included).
        # (``in`` first: popping a missing header raises and catches a KeyError, a cost on every answer)
        if response.status_code not in _RETRY_STATUSES and "Retry-After" in response.headers:
            del response.headers["Retry-After"]
        return response

    @app.errorhandler(ApiError)
    def _api_error(e: ApiError):
        return respond(e.status, e.code, e.message, e.field, e.headers)

    @app.errorhandler(HTTPException)
    def _http_error(e: HTTPException):
        status = e.code or 500
        code = _HTTP_CODES.get(status, "http_error")
        message = {
            404: "No such route.",
            405: "Method not allowed for this route.",
            413: "Request body too large.",
            429: f"Rate limit exceeded ({e.description}); retry after the Retry-After interval.",
        }.get(status, e.name)
        headers = {}
        if status == 405 and getattr(e, "valid_methods", None):
            headers["Allow"] = ", ".join(e.valid_methods)
        return respond(status, code, message, headers=headers)

    @app.errorhandler(Exception)
    def _unexpected(e: Exception):
        mapped = storage_error(e)
        if mapped is not None:
            return _api_error(mapped)
        log.exception("unhandled error")
        return respond(500, "internal_error", "Internal server error.")
