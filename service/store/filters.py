"""A request's filters (types, source or prefix, time range, parent, project) as SQL conditions over a units
table (alias ``u``), for both stores' statements: fixed text, every value a bound parameter (``:name``;
PostgreSQL's ``%(name)s`` via ``pg_filters``), so listing, exporting and forgetting select exactly what search
filters. A project reads the columns derived at push time (service/unitkeys.py), never the metadata."""
from __future__ import annotations

import re

from ..params import SearchParams
from ..unitkeys import derive


def filters(p: SearchParams, args: dict) -> list[str]:
    """SQL conditions for the request's filters; every value is a bound parameter."""
    where = ["u.expires_at > :now"]
    if p.types:
        names = []
        for i, t in enumerate(p.types):
            args[f"type{i}"] = t
            names.append(f":type{i}")
        where.append(f"u.type IN ({', '.join(names)})")
    if p.source:
        if p.source.endswith("*"):
            args["source"] = p.source[:-1]
            where.append("substr(u.source, 1, length(:source)) = :source")
        else:
            args["source"] = p.source
            where.append("u.source = :source")
    if p.since is not None:
        args["since"] = p.since
        where.append("u.timestamp >= :since")
    if p.until is not None:
        args["until"] = p.until
        where.append("u.timestamp <= :until")
    if p.parent_cid:
        args["parent"] = p.parent_cid
        where.append("u.parent_cid = :parent")
    if p.project is not None:
        args["project"] = p.project
        # (is_global: 0/1 on SQLite, boolean on PostgreSQL; both read it as a condition)
        where.append("(u.project = :project OR u.is_global)")
    return where


def _kind_passes(unit, p: SearchParams) -> bool:
    """The request's ``types`` and ``source`` (or prefix) on a unit."""
    if p.types and unit["type"] not in p.types:
        return False
    if p.source:
        return unit["source"].startswith(p.source[:-1]) if p.source.endswith("*") else unit["source"] == p.source
    return True


def passes(unit, p: SearchParams, now: int) -> bool:
    """``filters`` on a unit in Python (a row or dict with the units columns), for units scored outside SQL."""
    if unit["expires_at"] <= now or not _kind_passes(unit, p):
        return False
    if (p.since is not None and unit["timestamp"] < p.since) or (p.until is not None and unit["timestamp"] > p.until):
        return False
    if p.project is not None and not (unit["is_global"] or unit["project"] == p.project):
        return False
    return not p.parent_cid or unit["parent_cid"] == p.parent_cid


def in_scope(unit: dict, p: SearchParams) -> bool:
    """A unit (the public shape) within the request's ``types``, ``source`` and ``project`` (its metadata's, as a
    push derives it): what a result's neighbor window may show (issue 50, L1: a thread that crossed projects
    showed a project-scoped search the other project's units). Time and parent filters choose results, not the
    thread around them."""
    if not _kind_passes(unit, p):
        return False
    if p.project is None:
        return True
    keys = derive(unit["metadata"] if isinstance(unit["metadata"], dict) else None)
    return keys["is_global"] or keys["project"] == p.project


def pg_filters(p: SearchParams, args: dict) -> list[str]:
    """``filters`` in psycopg's placeholders (``%(name)s`` for ``:name``)."""
    return [re.sub(r":(\w+)", r"%(\1)s", c) for c in filters(p, args)]
