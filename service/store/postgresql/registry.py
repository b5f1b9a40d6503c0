"""The tool registry on PostgreSQL (docs/design.md §13): the same answers as service/store/sqlite/registry.py,
every tenant's tools in one ``tools`` table that every node reads and writes.

A write and its change-log row (``context://tools/{name}``, service/store/postgresql/live.py) are one transaction;
listeners on every node are woken after it commits. Search scores the same candidates with the same
BM25 (``registry.bm25``: per token column, global statistics of the tenant's tools, WEIGHTS), so both
backends rank alike; candidates and document frequencies come from a GIN index over each tool's terms.
"""
from __future__ import annotations

import json

import psycopg

from ...errors import Conflict, Unprocessable
from ...ranking.tools import COLUMN_BYTES, MAX_CANDIDATES, WEIGHTS, bounded_candidates
from ...toolcheck import is_tool_name, not_found, tool_dict, validate_tool
from ...uris import tool_uri
from ..base import RegistryApi
from .live import record_changes, wake
from .queries import sql


class Registry(RegistryApi):
    """The registry over the ``tools`` table (one transaction per write)."""

    def _row(self, tenant: str, tool) -> dict:
        params = self._params(tool)
        params["tenant"] = tenant
        params["terms"] = sorted({t for col in WEIGHTS for t in params[f"t_{col}"].split()})
        return params

    def _write(self, tenant: str, name: str, kind: str, fn):
        """``fn(conn)`` and the change-log row in one transaction; then wake the listening nodes."""
        def tx(conn):
            row = fn(conn)
            record_changes(conn, tenant, [(tool_uri(name), kind)])
            return row
        row = self.store.db.write(tx)
        wake(self.store, tenant)
        return row

    def create(self, tenant: str, raw) -> dict:
        """Register a new tool: 409 ``tool_exists`` when the name is taken."""
        tool = validate_tool(raw, self.config)
        params = self._row(tenant, tool)
        cap = self.config.max_tools_per_tenant

        def insert(conn):
            if cap and conn.execute(sql("tool_count"), {"tenant": tenant}).fetchone()["n"] >= cap:
                raise Unprocessable(f"This tenant may register at most {cap} tools.", code="too_many_tools")
            row = conn.execute(sql("tool_insert"), params).fetchone()
            if row is None:
                raise Conflict(f"A tool named {tool.name!r} is already registered; update it with PUT.",
                               code="tool_exists", field="name")
            return row
        try:
            return tool_dict(self._write(tenant, tool.name, "changed", insert))
        except psycopg.errors.UniqueViolation:      # (ON CONFLICT covers it; a race is still a 409)
            raise Conflict(f"A tool named {tool.name!r} is already registered; update it with PUT.",
                           code="tool_exists", field="name") from None

    def replace(self, tenant: str, name: str, raw) -> dict:
        """Replace a registered tool's description (404 when there is none); its version goes up."""
        params = self._row(tenant, validate_tool(raw, self.config, name=name))

        def update(conn):
            row = conn.execute(sql("tool_update"), params).fetchone()
            if row is None:
                raise not_found(name)
            return row
        return tool_dict(self._write(tenant, name, "changed", update))

    def delete(self, tenant: str, name: str) -> dict:
        def remove(conn):
            if conn.execute(sql("tool_delete"), {"tenant": tenant, "name": name}).fetchone() is None:
                raise not_found(name)
        self._write(tenant, name, "deleted", remove)
        return {"status": "deleted", "name": name}

    def get(self, tenant: str, name: str) -> dict | None:
        if not is_tool_name(name):
            return None
        row = self.store.db.one("tool_get", {"tenant": tenant, "name": name})
        return tool_dict(row) if row is not None else None

    def list(self, tenant: str, *, after: str = "", limit: int = 50, tags=(), auth_type=None) -> list[dict]:
        """Tools by name, after ``after``, filtered by tags (all of them) and auth type."""
        rows = self.store.db.read(lambda c: c.execute(sql("tool_list"), {
            "tenant": tenant, "after": after, "limit": limit, "tags": json.dumps(list(tags)),
            "auth_type": auth_type}).fetchall())
        return [tool_dict(r) for r in rows]

    def _candidates(self, tenant: str, terms: list[str], tags, auth_type) -> tuple[list, tuple | None, dict]:
        args = {"tenant": tenant, "terms": terms, "limit": MAX_CANDIDATES, "tags": json.dumps(list(tags)),
                "auth_type": auth_type}

        def read(conn):
            ids = [r["id"] for r in conn.execute(sql("tool_candidate_ids"), args)]
            if not ids:
                return [], None, {}
            rows = bounded_candidates(ids, lambda page: {r["id"]: r for r in conn.execute(
                sql("tool_columns_by_names"), {"tenant": tenant, "names": page, "bytes": COLUMN_BYTES})},
                self.config.tool_search_bytes)
            s = conn.execute(sql("tool_stats"), args).fetchone()
            df = {r["term"]: r["doc"] for r in conn.execute(sql("tool_df"), args)}
            return rows, (s["n"], s["name"], s["text"], s["schema"]), df
        return self.store.db.read(read)

    def _rows(self, tenant: str, ids: list) -> dict:
        return {r["name"]: r for r in self.store.db.read(lambda c: c.execute(sql("tools_by_names"), {
            "tenant": tenant, "names": ids}).fetchall())}

    def close(self) -> None:
        pass
