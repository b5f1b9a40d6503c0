"""Prometheus instruments recorded where things happen (prometheus-client only, no Flask): the
maintenance thread and the request hooks both import them, and service/metrics.py exports them at
/metrics (so the stores never import Flask)."""
from __future__ import annotations

from prometheus_client import Counter, Histogram

REQUEST_SECONDS = Histogram("context_request_seconds", "HTTP request latency by route.",
                            ["route", "method", "status"],
                            buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
INDEX_LAG_SECONDS = Histogram("context_index_lag_seconds", "Push ack to indexed, per unit.",
                              buckets=(.01, .05, .1, .25, .5, 1, 2, 5, 10, 30, 60))
# Totals of the maintenance this process did as a tenant's leader (all tenants: like the histograms
# above they carry no tenant label, so /metrics shows one tenant's admin no other tenant's name).
UNITS_INDEXED = Counter("context_units_indexed", "Units the indexer put into FTS5.")
UNITS_PURGED = Counter("context_units_purged", "Expired units the janitor deleted.")
DAYS_UNLINKED = Counter("context_days_unlinked", "Day files the janitor unlinked once every unit in them expired.")
DAYS_COMPACTED = Counter("context_days_compacted", "Day files compacted after a tenth of them was forgotten.")
