"""/healthz and /readyz (docs/design.md §4)."""
from __future__ import annotations

from flask import Blueprint, jsonify

from . import store
from ..state import app_state

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    """Liveness: the process answers."""
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz():
    """Readiness: storage writable, indexer queue depth and lag, replica lag."""
    s = store()
    problem = s.check_writable()
    writable = problem is None
    problems = [problem] if problem else []
    pending = replica_lag_ms = 0
    behind_units = behind_ms = 0
    for name in s.tenant_names():
        fresh = s.freshness(name)
        pending += fresh["index_pending"]
        replica_lag_ms = max(replica_lag_ms, fresh["replica_lag_ms"])
        lag = s.read_index_lag(name)
        if lag is not None:
            behind_units, behind_ms = behind_units + lag["units"], max(behind_ms, lag["lag_ms"])
    # "units" is the old name of "behind_units", kept for monitors that read it (docs/design.md §4)
    behind = {"behind_units": behind_units, "lag_ms": behind_ms, "units": behind_units}
    maint = app_state().maintenance
    body = {"status": "ok" if writable else "unavailable", "storage_writable": writable,
            "index_pending": pending, "replica_lag_ms": replica_lag_ms,
            # this node's read index behind the store (default searches read the rest from the store)
            "read_index": behind if s.config.replicas else None,
            "index_lag_ms": maint.lag_report() if maint else None,
            "segmenter": s.tokenizer.segmenter, "problems": problems}
    rv = jsonify(body)
    if not writable:
        rv.status_code = 503
        rv.headers["Retry-After"] = "5"
    return rv
