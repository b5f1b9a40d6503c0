"""What both storage backends answer the same way (DESIGN.md section 2; issue 18): the SQLite files
(service/store.py) and PostgreSQL (service/pg/store.py) implement a few methods each (``push_many``,
``get``, ``children``, ``_search``); push answers, lineage and the concurrent-search cap are built
on them here once, so the two cannot drift apart.
"""
from __future__ import annotations

import threading

from .config import Config
from .errors import ApiError, BadRequest, Busy, NotFound
from .units import Unit, validate_unit

MAX_LINEAGE_DEPTH = 1000


class StoreApi:
    """Base of both stores; subclasses call ``super().__init__(config)`` first."""

    def __init__(self, config: Config):
        self.config = config
        n = config.max_concurrent_searches
        self._search_slots = threading.BoundedSemaphore(n) if n > 0 else None

    # --- push ---------------------------------------------------------------------------------
    def push_one(self, tenant: str, raw) -> dict:
        result = self.push_many(tenant, [raw])[0]
        if isinstance(result, ApiError):
            raise result
        return result

    def push_batch(self, tenant: str, raws: list) -> list[dict]:
        """A batch push's answer, one item per unit in order: ``{"index", "status", "cid", "seq", ...}``
        or ``{"index", "status": "error", "error", "code", "field"?}``. Valid units are stored even when
        others fail; a storage failure (5xx) is raised for the whole batch."""
        items = []
        for i, r in enumerate(self.push_many(tenant, raws)):
            if isinstance(r, ApiError):
                if r.status >= 500:
                    raise r
                item = {"index": i, "status": "error", "error": r.message, "code": r.code}
                if r.field:
                    item["field"] = r.field
            else:
                item = {"index": i, **r}
            items.append(item)
        return items

    def push_many(self, tenant: str, raws: list) -> list[dict | ApiError]:
        raise NotImplementedError

    def validate(self, raws: list, now: float) -> tuple[list, list[tuple[int, Unit]]]:
        """(per item None or the ApiError that rejected it, the valid units with their index)."""
        results: list[dict | ApiError | None] = [None] * len(raws)
        valid: list[tuple[int, Unit]] = []
        for i, raw in enumerate(raws):
            try:
                valid.append((i, validate_unit(raw, self.config, now)))
            except ApiError as e:
                results[i] = e
        return results, valid

    def check_days_per_request(self, days) -> None:
        """One request may not touch hundreds of days (files on SQLite, partitions on PostgreSQL; issue 12,
        finding 4). Refused before anything is stored."""
        limit = self.config.max_days_per_request
        if limit and len(days) > limit:
            raise BadRequest(f"One push may touch at most {limit} distinct days (this one touches {len(days)}); "
                             "split it by timestamp.", code="too_many_days", field="units")

    # --- reads --------------------------------------------------------------------------------
    def get(self, tenant: str, cid: str) -> dict | None:
        raise NotImplementedError

    def children(self, tenant: str, cid: str, limit: int) -> list[str]:
        """CIDs of the live direct children of a unit, oldest seq first."""
        raise NotImplementedError

    def require(self, tenant: str, cid: str) -> dict:
        unit = self.get(tenant, cid)
        if unit is None:
            raise NotFound(f"No live unit with CID {cid!r}.", field="cid")
        return unit

    def lineage(self, tenant: str, cid: str, max_bytes: int | None = None) -> dict:
        """Ancestors (nearest first, root last) and direct children of a live unit. With ``max_bytes``,
        units whose content would pass that total are left out and named in ``omitted`` (issue 12)."""
        unit = self.require(tenant, cid)
        used = [len(unit["content"])]
        omitted: list[str] = []

        def fits(u: dict) -> bool:
            if max_bytes is not None and used[0] + len(u["content"]) > max_bytes:
                omitted.append(u["cid"])
                return False
            used[0] += len(u["content"])
            return True
        ancestors, seen = [], {cid}
        parent = unit["parent_cid"]
        while parent and parent not in seen and len(ancestors) + len(omitted) < MAX_LINEAGE_DEPTH:
            seen.add(parent)
            p = self.get(tenant, parent)
            if p is None:
                break
            if fits(p):
                ancestors.append(p)
            parent = p["parent_cid"]
        children = [u for u in (self.get(tenant, c) for c in self.children(tenant, cid, 1000))
                    if u is not None and fits(u)]
        return {"unit": unit, "ancestors": ancestors, "children": children,
                "truncated": bool(omitted), "omitted": omitted}

    # --- seeing and managing the memory (issue 15) ---------------------------------------------
    # ``manage``: the backend's module of these (service/manage.py, service/pg/manage.py), set by the class.
    manage = None

    def list_units(self, tenant: str, p, limit: int, before: int | None = None) -> tuple[list[dict], int | None]:
        return self.manage.list_units(self, tenant, p, limit, before)

    def export_units(self, tenant: str, p):
        return self.manage.export_units(self, tenant, p)

    def stats(self, tenant: str) -> dict:
        return self.manage.stats(self, tenant)

    def matches(self, tenant: str, p, *, cids: list[str] | None = None, max_seq: int | None = None) -> list[dict]:
        return self.manage.matches(self, tenant, p, cids=cids, max_seq=max_seq)

    def remove(self, tenant: str, by_day: dict[str, list[str]]) -> int:
        """Remove units (CIDs by day) everywhere; how many were stored."""
        return self.manage.remove(self, tenant, by_day)

    # --- search -------------------------------------------------------------------------------
    def search(self, tenant: str, params) -> dict:
        # A cap on concurrent searches per worker keeps threads free for everything else (issue 12, finding 9).
        slots = self._search_slots
        if slots is not None and not slots.acquire(timeout=self.config.search_wait_s):
            raise Busy()
        try:
            return self._search(tenant, params)
        finally:
            if slots is not None:
                slots.release()

    def _search(self, tenant: str, params) -> dict:
        raise NotImplementedError
