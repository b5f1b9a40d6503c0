"""The tool registry on SQLite (docs/design.md §13): each tenant's tools in ``tenants/<t>/tools.db``, searched
through one FTS5 table of three token columns (service/ranking/tools.py ranks the candidates). Changes go to
the tenant's change log (service/store/sqlite/live.py), so listeners of ``context://tools/{name}`` hear them.
"""
from __future__ import annotations

import json
import logging

from ...errors import Conflict, Unprocessable
from ...ranking.tools import COLUMN_BYTES, MAX_CANDIDATES, bounded_candidates
from ...toolcheck import is_tool_name, not_found, tool_dict, validate_tool
from ...uris import tool_uri
from ..base import RegistryApi
from .fts import fts_query
from .connections import TenantDbs
from .queries import sql

log = logging.getLogger(__name__)


class Registry(RegistryApi):
    """Every tenant's tools.db in this process; writes are one transaction each."""

    def __init__(self, store, changes):
        super().__init__(store, changes)
        self.db = TenantDbs(store, "tools.db", "registry_schema.sql", cache_size_kib=1024)

    def create(self, tenant: str, raw) -> dict:
        """Register a new tool: 409 ``tool_exists`` when the name is taken."""
        tool = validate_tool(raw, self.config)
        params = self._params(tool)
        cap = self.config.max_tools_per_tenant

        def tx(conn):
            if conn.execute(sql("tool_get"), {"name": tool.name}).fetchone() is not None:
                raise Conflict(f"A tool named {tool.name!r} is already registered; update it with PUT.",
                               code="tool_exists", field="name")
            if cap and conn.execute(sql("tool_count")).fetchone()[0] >= cap:
                raise Unprocessable(f"This tenant may register at most {cap} tools.", code="too_many_tools")
            params["id"] = conn.execute(sql("tool_insert"), params).lastrowid
            conn.execute(sql("tool_fts_insert"), params)
            return conn.execute(sql("tool_get"), {"name": tool.name}).fetchone()
        row = self.db(tenant).write(tx)
        self._changed(tenant, tool.name, "changed")
        return tool_dict(row)

    def replace(self, tenant: str, name: str, raw) -> dict:
        """Replace a registered tool's description (404 when there is none); its version goes up."""
        tool = validate_tool(raw, self.config, name=name)
        params = self._params(tool)

        def tx(conn):
            params["id"] = _unindex(conn, name)
            conn.execute(sql("tool_update"), params)
            conn.execute(sql("tool_fts_insert"), params)
            return conn.execute(sql("tool_get"), {"name": name}).fetchone()
        row = self.db(tenant).write(tx)
        self._changed(tenant, name, "changed")
        return tool_dict(row)

    def delete(self, tenant: str, name: str) -> dict:
        def tx(conn):
            conn.execute(sql("tool_delete"), {"id": _unindex(conn, name)})
        self.db(tenant).write(tx)
        self._changed(tenant, name, "deleted")
        return {"status": "deleted", "name": name}

    def get(self, tenant: str, name: str) -> dict | None:
        if not is_tool_name(name):
            return None
        row = self.db(tenant).read(lambda c: c.execute(sql("tool_get"), {"name": name}).fetchone())
        return tool_dict(row) if row is not None else None

    def list(self, tenant: str, *, after: str = "", limit: int = 50, tags=(), auth_type=None) -> list[dict]:
        """Tools by name, after ``after``, filtered by tags (all of them) and auth type."""
        rows = self.db(tenant).read(lambda c: c.execute(sql("tool_list"), {
            "after": after, "limit": limit, "tags": json.dumps(list(tags)), "auth_type": auth_type}).fetchall())
        return [tool_dict(r) for r in rows]

    def _candidates(self, tenant: str, terms: list[str], tags, auth_type) -> tuple[list, tuple | None, dict]:
        def read(conn):
            ids = [r[0] for r in conn.execute(sql("tool_candidate_ids"), {
                "match": fts_query(terms, "or"), "limit": MAX_CANDIDATES, "tags": json.dumps(list(tags)),
                "auth_type": auth_type})]
            if not ids:
                return [], None, {}
            rows = bounded_candidates(ids, lambda page: {r["id"]: r for r in conn.execute(
                sql("tool_columns_by_ids"), {"ids": json.dumps(page), "bytes": COLUMN_BYTES})},
                self.config.tool_search_bytes)
            stats = conn.execute(sql("tool_stats")).fetchone()
            df = dict(conn.execute(sql("tool_df"), {"terms": json.dumps(terms)}).fetchall())
            return rows, stats, df
        return self.db(tenant).read(read)

    def _rows(self, tenant: str, ids: list) -> dict:
        return {r["id"]: r for r in self.db(tenant).read(lambda c: c.execute(sql("tools_by_ids"),
                                                                              {"ids": json.dumps(ids)}).fetchall())}

    def _changed(self, tenant: str, name: str, kind: str) -> None:
        try:
            self.changes.record(tenant, [(tool_uri(name), kind)])
        except Exception:  # noqa: BLE001 - the registry write is durable; listeners miss this one change
            log.exception("could not record a tool change for listeners")

    def close(self) -> None:
        self.db.close()


def _unindex(conn, name: str) -> int:
    """Take a registered tool out of the search index (404 when there is none); its row id."""
    old = conn.execute(sql("tool_get"), {"name": name}).fetchone()
    if old is None:
        raise not_found(name)
    conn.execute(sql("tool_fts_delete"), {"id": old["id"], "t_name": old["t_name"], "t_text": old["t_text"],
                                          "t_schema": old["t_schema"]})
    return old["id"]
