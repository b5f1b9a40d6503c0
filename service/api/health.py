"""/healthz and /readyz (DESIGN.md section 4)."""
from __future__ import annotations

import os
import tempfile

from flask import Blueprint, current_app, jsonify

from . import store

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    """Liveness: the process answers."""
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz():
    """Readiness: storage writable, indexer queue depth and lag, replica lag."""
    s = store()
    problems = []
    try:
        # Write real bytes: on a full disk creating an empty file still succeeds.
        fd, path = tempfile.mkstemp(dir=s.root, prefix=".ready-")
        try:
            os.write(fd, b"\0" * 65536)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(path)
        writable = True
    except OSError as e:
        writable = False
        problems.append(f"data directory not writable: {e.strerror}")
    pending = replica_lag_ms = 0
    for name in s.tenant_names():
        fresh = s.freshness(name)
        pending += fresh["index_pending"]
        replica_lag_ms = max(replica_lag_ms, fresh["replica_lag_ms"])
    maint = current_app.extensions.get("context_maintenance")
    body = {"status": "ok" if writable else "unavailable", "storage_writable": writable,
            "index_pending": pending, "replica_lag_ms": replica_lag_ms,
            "index_lag_ms": maint.lag_percentiles() if maint else None,
            "segmenter": s.tokenizer.segmenter, "problems": problems}
    rv = jsonify(body)
    if not writable:
        rv.status_code = 503
        rv.headers["Retry-After"] = "5"
    return rv
