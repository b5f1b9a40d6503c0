"""The store contract (docs/design.md §5): everything a storage backend is, stated once, as django's
``db/backends/base/`` states a database backend. Two backends implement it: service/store/sqlite/ (the
embedded default: files per tenant and day) and service/store/postgresql/ (one database every node shares).
The views, adapters, the live hub and the maintainer use only what is declared here, and
tests/test_code_shape.py fails when a public member both stores implement is missing from it.

Built here once, on the few methods each backend implements: push answers (``push_one``, ``push_batch``),
validation and the per-request day cap, lineage, the concurrent-search cap, manage's entry points; and the
registry's search. ``SourcesApi`` is what live context reads (service/hub.py).
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Protocol

from ..config import Config
from ..errors import ApiError, BadRequest, NotFound
from ..shares.fair import caller_key
from ..shares.searches import SearchSlots
from ..live import FeedUnit
from ..ranking import tools as tool_ranking
from ..ranking.results import MAX_QUERY_TERMS
from ..toolcheck import Tool, dump_json, not_found
from ..units import Unit, validate_unit
from .filters import in_scope

MAX_LINEAGE_DEPTH = 1000
LIST_MAX = 200                 # GET /mcp/units: at most this many units per page
PAGE_ROWS = 1000               # rows read per round (export, filtered lists)
# Units in memory at once for a listing or an export, whatever their size (docs/configuration.md's bounds):
# a listing page ends once its contents pass PAGE_BYTES (at least one unit: a shorter page, with a
# cursor), and content is read FETCH_ROWS units at a time.
PAGE_BYTES = 8 << 20
FETCH_ROWS = 32
FORGET_CHUNK = 500             # units per removal transaction: a push to the tenant waits at most one chunk
SAMPLE = 10                    # units a forget dry run shows


# A search's context windows hold at most this much in all (docs/design.md §4: answers are bounded), each unit
# counted whole (content, source, metadata: issue 50, L2); the nearest neighbors first; what does not fit is left
# out and counted (``neighbors.omitted``).
WINDOW_BYTES = 4 << 20
UNIT_FIELDS_BYTES = 256        # a unit's fixed fields as answered (cid, type, timestamps, names)


def unit_bytes(unit: dict) -> int:
    """About what a unit adds to an answer: its content, source and metadata as encoded, and its other fields."""
    meta = unit.get("metadata")
    meta_bytes = len(json.dumps(meta, ensure_ascii=False)) if meta else 0
    return len(unit["content"]) + len(unit["source"]) + meta_bytes + UNIT_FIELDS_BYTES


def with_windows(results: list[dict], windows: dict[str, list[tuple[int, dict]]], params) -> None:
    """Each result's ``neighbors``: ``before`` and ``after`` it in its thread, those within the request's types,
    source and project (``filters.in_scope``), nearest first into the budget."""
    budget = WINDOW_BYTES
    for r in results:
        found = sorted(((offset, unit) for offset, unit in windows.get(r["cid"], ())
                        if in_scope(unit, params)), key=lambda x: (abs(x[0]), x[0]))
        kept, omitted = [], 0
        for offset, unit in found:
            size = unit_bytes(unit)
            if size > budget:
                omitted += 1
                continue
            budget -= size
            unit = dict(unit)
            unit.pop("seq", None)
            kept.append((offset, unit))
        kept.sort(key=lambda x: x[0])
        r["neighbors"] = {"before": [u for o, u in kept if o < 0], "after": [u for o, u in kept if o > 0]}
        if omitted:
            r["neighbors"]["omitted"] = omitted


class StoreApi:
    """Base of both stores; subclasses call ``super().__init__(config)`` first and set the attributes below."""

    config: Config
    root: Path                  # this node's data folder (SQLite: the whole store; PostgreSQL: local files)
    tokenizer: object           # the one tokenizer (service/tokenize.py): indexing and queries alike
    # callables(tenant, days) told after a push stored units (maintenance wakes up, live hubs look)
    listeners: list
    # callables(tenant, changes) told after units were re-pushed or removed, each change {"status", "cid"};
    # called once the change is durable, must not raise
    observers: list
    # the backend's searcher; only the store and its search module use it (tests/test_code_shape.py)
    searcher: object
    # this process's views of this node's read indexes (service/readindex/): what default searches read
    readers: object
    # what this process keeps open for its tenants (service/budget.py); the data folder's change numbers
    budget: object
    change_numbers: object

    def __init__(self, config: Config):
        self.config = config
        # this worker's search slots, shared fairly between tenants and keys (service/shares/)
        self.search_slots = SearchSlots.of(config)

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
        """One request may not touch hundreds of days (files on SQLite, partitions on PostgreSQL,
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
        units whose content would pass that total are left out and named in ``omitted``."""
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

    def recent(self, tenant: str, limit: int = 50, before_seq: int | None = None) -> list[dict]:
        """Live units, newest (highest seq) first, strictly below ``before_seq``."""
        raise NotImplementedError

    def delete(self, tenant: str, cid: str) -> dict:
        """Remove one live unit everywhere (404 when there is none); ``{"status": "deleted", "cid"}``."""
        raise NotImplementedError

    # --- seeing and managing the memory ----------------------------------------------------------
    # the backend's module of these (service/store/sqlite/manage.py, service/store/postgresql/manage.py)
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
        # A cap on concurrent searches per worker keeps its request pool free for everything else.
        with self.search_slot(tenant):
            found = self._search(tenant, params)
            if params.neighbors and found["results"]:
                with_windows(found["results"], self.thread_window(tenant, [r["cid"] for r in found["results"]],
                                                                  params.neighbors), params)
            return found

    def thread_window(self, tenant: str, cids: list[str], n: int) -> dict[str, list[tuple[int, dict]]]:
        """For each of these units, the live units of its thread up to ``n`` places before and after it, as
        (offset, unit) in place order (offset -n..-1, 1..n; docs/design.md §3 "Threads")."""
        raise NotImplementedError

    def search_slot(self, tenant: str):
        """A context holding one of this worker's search slots for ``tenant`` (and the caller's key): unit
        and tool searches alike; 503 ``search_busy`` when none is free within ``search_wait_s``."""
        slots = self.search_slots
        return slots.hold(tenant, caller_key()) if slots is not None else contextlib.nullcontext()

    def _search(self, tenant: str, params) -> dict:
        raise NotImplementedError

    # --- operations ---------------------------------------------------------------------------
    def tenant_names(self) -> list[str]:
        """Every tenant that has stored anything."""
        raise NotImplementedError

    def max_seq(self, tenant: str) -> int:
        """The tenant's newest acked seq (0 before its first push)."""
        raise NotImplementedError

    def freshness(self, tenant: str) -> dict:
        """What a default search of this tenant cannot see yet, counted now: ``index_pending``,
        ``replica_lag_ms`` (the oldest of them waiting) and ``read_index`` (whether default searches read one)."""
        raise NotImplementedError

    def live_counts(self, tenant: str) -> dict:
        """``units_live`` and ``freshness`` (/metrics, /readyz; /mcp/stats is ``stats``)."""
        raise NotImplementedError

    def read_index_lag(self, tenant: str) -> dict | None:
        """How far this node's read index of the tenant is behind the store: ``units`` it lacks and ``lag_ms``
        (how long the oldest has waited); None when default searches use no read index (CONTEXT_REPLICAS)."""
        raise NotImplementedError

    def read_index_state(self, tenant: str) -> dict | None:
        """The read index's last pass (``low``: every unit below this seq is in it; ``seq``, ``backlog``) when
        default searches of this tenant read one, else None (live context: service/hub.py)."""
        raise NotImplementedError

    def check_writable(self) -> str | None:
        """None when storage takes a write now (readiness); otherwise the problem."""
        raise NotImplementedError

    def sweep(self) -> None:
        """Close what this process keeps open for tenants unused for CONTEXT_TENANT_IDLE_S (files, read indexes,
        what it remembers of them), and past the budget the least recently used (the maintenance worker, once a
        second: service/store/loop.py)."""
        raise NotImplementedError

    def close(self) -> None:
        """Close every connection and thread of the store (idempotent)."""
        raise NotImplementedError


class ChangeLogApi(Protocol):
    """Changes that get no new seq (a unit re-pushed or removed, a tool changed), numbered per tenant."""

    store: StoreApi

    def record(self, tenant: str, changes: list[tuple[str, str]]) -> None:
        """Append (uri, kind) rows; kind is "changed" or "deleted"."""

    def max_n(self, tenant: str) -> int:
        """The tenant's newest change number."""

    def since(self, tenant: str, after: int, limit: int = 1000) -> list:
        """Rows {n, uri, kind} with n > after, in order."""

    def close(self) -> None: ...


class SlotsApi(Protocol):
    """Open streams of every worker (of every node), so the per-key and per-tenant limits hold across them."""

    config: Config
    owner: str              # this worker's name on its slots (``touch`` refreshes them)

    def take(self, tenant: str, key_id: str, kind: str) -> str:
        """A slot id, or ``LimitReached`` (service/live.py)."""

    def release(self, slot: str) -> None: ...

    def count(self, tenant: str) -> int:
        """The tenant's open streams now, over every worker (and node): what /mcp/stats reports."""

    def touch(self) -> None:
        """Refresh this worker's slots (a dead worker's stop counting after ``STALE_MS``)."""

    def close(self) -> None: ...


class SourcesApi(Protocol):
    """Where the live hub (service/hub.py) reads what changed (docs/design.md §12)."""

    store: StoreApi
    changes: ChangeLogApi
    slots: SlotsApi

    def feed(self, tenant: str, after: int, limit: int) -> tuple[list[FeedUnit], int]:
        """New live units with seq > after in seq order, and the seq the feed is resolved to (every unit up to
        it was delivered or is gone): it never skips a unit."""

    def expiry(self, tenant: str, cid: str) -> int | None:
        """When a unit expires, or None when there is no such unit."""

    def positions(self, tenant: str) -> tuple[int, int]:
        """(the tenant's last seq, the change log's last number)."""

    def wait(self, timeout: float, stop: threading.Event) -> set[str] | None:
        """Block until the next look: the tenants known to have changed, or None to look at every one."""

    def close(self) -> None: ...


class RegistryApi:
    """The tool registry (docs/design.md §13) on either store: each tenant's tools, described so agents can
    find them, never called. Backends implement storage (create, replace, delete, get, list and the two reads
    of a search); validation, the public shape and the ranking are here."""

    def __init__(self, store, changes: ChangeLogApi):
        self.store = store
        self.config = store.config
        self.changes = changes
        self.tokenizer = store.tokenizer

    def create(self, tenant: str, raw) -> dict:
        """Register a new tool: 409 ``tool_exists`` when the name is taken."""
        raise NotImplementedError

    def replace(self, tenant: str, name: str, raw) -> dict:
        """Replace a registered tool's description (404 when there is none); its version goes up."""
        raise NotImplementedError

    def delete(self, tenant: str, name: str) -> dict:
        """Unregister a tool (404 when there is none)."""
        raise NotImplementedError

    def get(self, tenant: str, name: str) -> dict | None:
        raise NotImplementedError

    def list(self, tenant: str, *, after: str = "", limit: int = 50, tags=(), auth_type=None) -> list[dict]:
        """Tools by name, after ``after``, filtered by tags (all of them) and auth type."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def require(self, tenant: str, name: str) -> dict:
        tool = self.get(tenant, name)
        if tool is None:
            raise not_found(name)
        return tool

    def _params(self, tool: Tool) -> dict:
        """A tool's stored columns: its fields as JSON text, and its search tokens."""
        return {"name": tool.name, "title": tool.title, "description": tool.description, "endpoint": tool.endpoint,
                "auth_type": tool.auth_type, "tags": dump_json(list(tool.tags)), "metadata": dump_json(tool.metadata),
                "input_schema": dump_json(tool.input_schema), "output_schema": dump_json(tool.output_schema),
                "now": int(time.time() * 1000), **tool_ranking.token_columns(tool, self.tokenizer)}

    def search(self, tenant: str, query: str, *, top_k: int = 5, tags=(), auth_type=None) -> list[dict]:
        """The best ``top_k`` tools for a plain-text query, BM25-ranked: each with ``bm25_score`` (raw) and
        ``score`` (0-1: divided by what the query could score at most, as unit search does)."""
        terms = self.tokenizer.query_terms(query)[:MAX_QUERY_TERMS]
        if not terms:
            return []
        # inside the worker's search slots, with bounded work: service/ranking/tools.py
        with self.store.search_slot(tenant):
            rows, stats, df = self._candidates(tenant, terms, tags, auth_type)
            if not rows:
                return []
            scores = tool_ranking.bm25(rows, terms, stats, df)
            names = {r["id"]: r["name"] for r in rows}
            best = sorted(scores, key=lambda k: (-scores[k], names[k]))[:top_k]
            return tool_ranking.answers(self._rows(tenant, best), best, scores, terms, stats, df)

    def _candidates(self, tenant: str, terms: list[str], tags, auth_type) -> tuple[list, tuple | None, dict]:
        """(rows holding any term with their token columns, keyed by ``id``; (tools, token totals per column);
        each term's document frequency), at most ``tool_ranking.MAX_CANDIDATES`` rows."""
        raise NotImplementedError

    def _rows(self, tenant: str, ids: list) -> dict:
        """The full rows of these candidate ids, by id."""
        raise NotImplementedError
