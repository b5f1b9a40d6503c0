"""The service with some of its per-request layers taken out, for bench/layers.py only: ``LAYERS_OFF`` names
them (comma-separated): ``metrics`` (the request histogram and the access line), ``doors`` (Host, Origin,
media type, body size, CORS), ``limiter`` (flask-limiter's hooks). The slow-client guard is taken out by
bench/layers_conf.py, the access line alone by CONTEXT_ACCESS_LOG=0. Nothing here is a setting of the service.
"""
from __future__ import annotations

import os

HOOKS = {"metrics": {"_start", "_observe"},
         "doors": {"doors", "check_request", "preflight", "allow_cross_origin"},
         "limiter": {"check_rate", "rate_headers", "_check_request_limit", "__inject_headers"}}


def _name(fn) -> str:
    return getattr(getattr(fn, "func", fn), "__name__", "")     # (flask-limiter's after hook is a partial)


def create_app():
    from service import create_app as service_app
    app = service_app()
    off = {x for x in os.environ.get("LAYERS_OFF", "").split(",") if x}
    unknown = off - set(HOOKS) - {"guard"}
    if unknown:
        raise SystemExit(f"LAYERS_OFF: unknown layers {sorted(unknown)}")
    names = set().union(*(HOOKS[x] for x in off if x in HOOKS))
    for table in (app.before_request_funcs, app.after_request_funcs):
        for funcs in table.values():
            funcs[:] = [f for f in funcs if _name(f) not in names]
    return app
