"""/metrics in Prometheus text format (prometheus-client).

Request latency and index lag are histograms recorded where they happen; with several
gunicorn workers they are aggregated through PROMETHEUS_MULTIPROC_DIR (set by the gunicorn
config). Queue depth, replica lag and units stored are read from storage at scrape time,
so every worker reports the same numbers.
"""
from __future__ import annotations

import logging
import os
import time

from flask import Flask, Response, g, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily

from .auth import current_principal
from .errors import Forbidden
from .logs import direct_handler
from .state import app_state
from .instruments import (DAYS_COMPACTED, DAYS_UNLINKED, INDEX_LAG_SECONDS, REQUEST_SECONDS, UNITS_INDEXED,
                          UNITS_PURGED)

ACCESS_LOG = logging.getLogger("service.access")


class StoreCollector:
    def __init__(self, app: Flask, tenants: list[str] | None = None):
        self.app = app
        self.tenants = tenants          # None: every tenant (no-keys mode, loopback only)

    def collect(self):
        store = app_state(self.app).store
        depth = GaugeMetricFamily("context_index_queue_depth", "Pending (not yet indexed) units.", labels=["tenant"])
        lag = GaugeMetricFamily("context_replica_lag_seconds", "Age of the oldest change not yet in the read index.",
                                labels=["tenant"])
        stored = GaugeMetricFamily("context_units_stored", "Live units in the catalog.", labels=["tenant"])
        behind = GaugeMetricFamily("context_read_index_behind_units", "Live units this node's read index lacks.",
                                   labels=["tenant"])
        behind_s = GaugeMetricFamily("context_read_index_lag_seconds",
                                     "How long the oldest unit this node's read index lacks has waited.",
                                     labels=["tenant"])
        names = store.tenant_names()
        if self.tenants is not None:
            names = [n for n in names if n in self.tenants]
        for name in names:
            stats = store.live_counts(name)
            depth.add_metric([name], stats["index_pending"])
            lag.add_metric([name], stats["replica_lag_ms"] / 1000)
            stored.add_metric([name], stats["units_live"])
            index_lag = store.read_index_lag(name)
            if index_lag is not None:
                behind.add_metric([name], index_lag["units"])
                behind_s.add_metric([name], index_lag["lag_ms"] / 1000)
        yield depth
        yield lag
        yield stored
        yield behind
        yield behind_s


def access_line(route: str, method: str, status: int, seconds: float) -> None:
    """One line per request (docs/design.md §9): the route pattern, never the path, content or key. Written
    by service/logs.py in batches when logging sends it only there (as it is set up), else logged."""
    principal = g.get("principal")
    tenant = principal.tenant if principal else "-"
    handler = direct_handler(ACCESS_LOG)
    if handler is None:
        ACCESS_LOG.info("tenant=%s method=%s route=%s status=%d ms=%.1f", tenant, method, route, status,
                        seconds * 1000)
    else:
        handler.defer(ACCESS_LOG.name, f"tenant={tenant} method={method} route={route} status={status} "
                                       f"ms={seconds * 1000:.1f}")


# Methods counted by name; any other a client invents counts as "other" (each name would be a series for good).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
MAX_SERIES_CACHED = 4096


STARTED = "context.started"     # the WSGI environ's key of when the app took the request (perf_counter)


def timed(wsgi_app):
    """The app's WSGI callable, noting when each request began: what a before_request hook did at several
    times the cost (each hook is a Flask call and a context lookup), and earlier, so the time includes them."""
    def started(environ, start_response):
        environ[STARTED] = time.perf_counter()
        return wsgi_app(environ, start_response)
    return started


def init_app(app: Flask) -> None:
    app.wsgi_app = timed(app.wsgi_app)
    access = app.config["CONTEXT"].access_log
    # (route, method, status) -> the histogram's series: ``labels()`` checks its values and takes a lock
    # on every call, so each series is looked up there once per worker.
    series: dict = {}

    @app.after_request
    def _observe(response):
        req = request._get_current_object()     # (one context lookup, not one per attribute)
        t0 = req.environ.get(STARTED)
        if t0 is not None:
            rule = req.url_rule
            route = rule.rule if rule is not None else "unmatched"
            method = req.method if req.method in METHODS else "other"
            seconds = time.perf_counter() - t0
            key = (route, method, response.status_code)
            child = series.get(key)
            if child is None:
                child = REQUEST_SECONDS.labels(route, method, str(response.status_code))
                if len(series) < MAX_SERIES_CACHED:
                    series[key] = child
            child.observe(seconds)
            if access:
                access_line(route, method, response.status_code, seconds)
        return response

    @app.get("/metrics")
    def metrics():
        """Prometheus metrics. With keys configured: an admin key, and only its tenant's series."""
        tenants = None
        if not app_state(app).keys.open:
            principal = current_principal()
            if "admin" not in principal.scopes:
                raise Forbidden("/metrics needs a key with the 'admin' scope.", code="missing_scope")
            tenants = [principal.tenant]
        registry = CollectorRegistry()
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            multiprocess.MultiProcessCollector(registry)
        else:
            for instrument in (REQUEST_SECONDS, INDEX_LAG_SECONDS, UNITS_INDEXED, UNITS_PURGED, DAYS_UNLINKED,
                               DAYS_COMPACTED):
                registry.register(instrument)
        registry.register(StoreCollector(app, tenants))
        return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)
