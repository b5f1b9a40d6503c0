"""Keys derived from a unit's metadata when it is pushed (docs/design.md §3), stored beside the unit so that
search filters on them (``service/store/filters.py``, the read index's fields) without reading metadata; and
what a unit's fields say of its thread (``session_thread``, ``joined_by``; threads are assigned at push:
service/store/push.py).

``project``: ``metadata.project`` when it is a string of 1 to ``MAX_PROJECT_CHARS`` characters with no
control character, else none. ``is_global``: ``metadata.global`` is JSON ``true``. A search with
``project`` sees the units of that project and the global ones (``service/params.py``).

Each key is a column of every table search filters (SQLite's day shards; PostgreSQL's ``units``,
``pending`` and ``unit_terms``) and a field of the read index, filled from ``derive`` on every push and
re-push (metadata is a mutable field, §3).
"""
from __future__ import annotations

import hashlib
import json

from .formats import CONTROL_CHARS_RE

MAX_PROJECT_CHARS = 1024
COLUMNS = ("project", "is_global")      # in the order of every statement that writes them


def project_of(value) -> str | None:
    """``metadata.project`` as a filter key, or None when it is not one (the unit is then in no project)."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_PROJECT_CHARS or CONTROL_CHARS_RE.search(value):
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None                         # a lone surrogate: no store can hold it as a key
    return value


def derive(metadata: dict | None) -> dict:
    """The keys of a unit with this (decoded) metadata, by column name."""
    if not metadata:
        return {"project": None, "is_global": False}
    return {"project": project_of(metadata.get("project")), "is_global": metadata.get("global") is True}


def derive_text(metadata_text: str | None) -> dict:
    """``derive`` of metadata as stored (JSON text): for rows stored before the keys existed (upgrades)."""
    try:
        value = json.loads(metadata_text) if metadata_text else None
    except ValueError:
        value = None
    return derive(value if isinstance(value, dict) else None)


# --- threads (docs/design.md §3 "Threads") ----------------------------------------------------------
# How a unit joined its thread (the read index keeps it; ranking reads it): by time alone, or as its thread's
# first unit; by metadata.session; by its parent.
JOINED_BY_TIME, JOINED_BY_SESSION, JOINED_BY_PARENT = 0, 1, 2


def session_thread(metadata_text: str | None) -> str | None:
    """The thread ``metadata.session`` names (a string or an integer, tenant-wide), or None."""
    if not metadata_text or '"session"' not in metadata_text:
        return None
    value = json.loads(metadata_text).get("session")
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        return None
    return hashlib.sha256(b"session\0" + str(value).encode("utf-8")).hexdigest()[:12]


def joined_by(parent_cid: str | None, metadata_text: str | None) -> int:
    """How a stored unit joined its thread (``Threads.assign``'s rule that applied, read back from its fields)."""
    if parent_cid:
        return JOINED_BY_PARENT
    return JOINED_BY_SESSION if session_thread(metadata_text) else JOINED_BY_TIME
