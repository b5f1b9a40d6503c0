"""Keys derived from a unit's metadata when it is pushed (docs/design.md §3), stored beside the unit so that
search filters on them (``service/store/filters.py``, the read index's fields) without reading metadata.

``project``: ``metadata.project`` when it is a string of 1 to ``MAX_PROJECT_CHARS`` characters with no
control character, else none. ``is_global``: ``metadata.global`` is JSON ``true``. A search with
``project`` sees the units of that project and the global ones (``service/params.py``).

Each key is a column of every table search filters (SQLite's day shards; PostgreSQL's ``units``,
``pending`` and ``unit_terms``) and a field of the read index, filled from ``derive`` on every push and
re-push (metadata is a mutable field, §3).
"""
from __future__ import annotations

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
