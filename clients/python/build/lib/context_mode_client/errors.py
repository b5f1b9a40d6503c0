"""What the service answered when it refused, and whether trying again may help (the client and its live
streams raise it alike)."""
from __future__ import annotations

from typing import Any, Optional

import requests

# Worth retrying: the server is busy or storage is briefly unavailable. Every other 4xx is the
# caller's mistake and would fail again. Pushes are safe to repeat: the CID makes them idempotent.
RETRY_STATUSES = frozenset({429, 503})


class ContextModeError(Exception):
    """An error answer from the service (``code`` is its machine code) or a transport failure
    (``status`` None, ``code`` "connection_error")."""

    def __init__(self, message: str, *, status: Optional[int] = None, code: str = "http_error",
                 field: Optional[str] = None, body: Any = None):
        super().__init__(message)
        self.message, self.status, self.code, self.field, self.body = message, status, code, field, body

    def __str__(self) -> str:
        where = f" (field {self.field!r})" if self.field else ""
        status = f"HTTP {self.status} " if self.status is not None else ""
        return f"{status}{self.code}: {self.message}{where}"

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status in RETRY_STATUSES


def error_from(rv: requests.Response) -> ContextModeError:
    """The error an answer of 4xx or 5xx carries (the REST shape, the Dify endpoint's, or its text)."""
    try:
        body = rv.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "code" in body:
        return ContextModeError(str(body.get("error", "")), status=rv.status_code, code=str(body["code"]),
                                field=body.get("field"), body=body)
    if isinstance(body, dict) and "error_code" in body:   # the Dify endpoint's shape
        return ContextModeError(str(body.get("error_msg", "")), status=rv.status_code,
                                code=str(body["error_code"]), body=body)
    return ContextModeError(rv.text[:200] or rv.reason or "HTTP error", status=rv.status_code, body=body)
