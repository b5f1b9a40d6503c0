"""Prometheus instruments recorded where things happen (prometheus-client only, no Flask): the
maintenance thread and the request hooks both import them, and service/metrics.py exports them at
/metrics (issue 13: the indexer imported the Flask-side metrics module for one histogram)."""
from __future__ import annotations

from prometheus_client import Histogram

REQUEST_SECONDS = Histogram("context_request_seconds", "HTTP request latency by route.",
                            ["route", "method", "status"],
                            buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
INDEX_LAG_SECONDS = Histogram("context_index_lag_seconds", "Push ack to indexed, per unit.",
                              buckets=(.01, .05, .1, .25, .5, 1, 2, 5, 10, 30, 60))
