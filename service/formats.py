"""The shapes of names the service accepts, shared by everything that checks them: CIDs,
tenant names, tool names, days and day files, control characters. Only ``re``: any module may import it."""
from __future__ import annotations

import re

# Used with fullmatch ('$' would also accept a trailing newline).
CID_RE = re.compile(r"[0-9a-f]{12}")
TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
DAY_FILE_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})\.db$")
DAY_RE = re.compile(r"\d{4}-\d{2}-\d{2}")          # a day's name (fullmatch)
TOOL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")     # unreserved URI characters only (uris.py)
# Control characters: C0, DEL and C1 (what a unit's source may not hold, docs/design.md §3) ...
CONTROL_CHARS_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# ... and C0 and DEL only (what a context://search/{query} URI's query may not hold).
ASCII_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def is_cid(value) -> bool:
    """12 lowercase hex digits, and a string."""
    return isinstance(value, str) and CID_RE.fullmatch(value) is not None


def is_tool_name(value) -> bool:
    """A registered tool's name, and a string."""
    return isinstance(value, str) and TOOL_NAME_RE.fullmatch(value) is not None
