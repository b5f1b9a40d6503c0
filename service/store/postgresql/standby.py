"""The read replica on PostgreSQL: a streaming hot standby of the primary.

Default searches read it while it answers, its observed replay lag is within ``replica_max_lag_ms``
and it has replayed every change of the tenant the primary had when the search began (``tenant_version``:
read-your-writes, deletes included); otherwise the primary answers. The lag is probed at most once
a second per process.
"""
from __future__ import annotations

import logging
import threading
import time

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from ...config import redact
from .queries import bounded, sql
from .rows import content_rows

log = logging.getLogger(__name__)


class Standby:
    """A pool on the standby and its observed replay lag. Down or lagging past ``replica_max_lag_ms``:
    searches read the primary until the next probe says otherwise."""

    PROBE_S = 1.0

    def __init__(self, url: str, config):
        self.url = url
        self.max_lag_ms = config.replica_max_lag_ms
        self.pool = ConnectionPool(url, min_size=1, max_size=max(2, config.pg_pool_size), open=False,
                                   kwargs={"autocommit": True, "row_factory": content_rows, "connect_timeout": 2},
                                   timeout=2.0, reconnect_timeout=3600, name="standby",
                                   check=ConnectionPool.check_connection,   # as the primary's (store.py)
                                   configure=bounded(config.pg_lock_timeout_ms, config.pg_statement_timeout_ms))
        self.pool.open(wait=False)
        self._lock = threading.Lock()
        self._probed = 0.0
        self._lag: int | None = None      # None: down

    def lag_ms(self) -> int | None:
        """Observed replay lag in ms, or None when the standby does not answer."""
        if time.monotonic() - self._probed < self.PROBE_S:
            return self._lag
        with self._lock:
            if time.monotonic() - self._probed >= self.PROBE_S:
                try:
                    with self.pool.connection(timeout=1.0) as c:
                        row = c.execute(sql("standby_lag")).fetchone()
                    self._lag = int(row["lag_ms"]) if row["recovery"] else 0
                except (psycopg.Error, PoolTimeout) as e:
                    if self._lag is not None:
                        log.warning("standby %s unavailable (%s): searches read the primary", redact(self.url), e)
                    self._lag = None
                self._probed = time.monotonic()
        return self._lag

    def usable(self) -> bool:
        lag = self.lag_ms()
        return lag is not None and lag <= self.max_lag_ms

    def mark_down(self) -> None:
        with self._lock:
            self._lag, self._probed = None, time.monotonic()

    def caught_up(self, tenant: str, version: int, wait_ms: int) -> bool:
        """Whether the standby has replayed the tenant's changes up to ``version`` (waiting up to
        ``wait_ms``); False also when it stops answering."""
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            try:
                with self.pool.connection(timeout=1.0) as c:
                    have = c.execute(sql("tenant_version"), {"tenant": tenant}).fetchone()["version"]
            except (psycopg.Error, PoolTimeout):
                self.mark_down()
                return False
            if have >= version:
                return True
            if time.monotonic() > deadline:
                self.mark_behind()
                return False
            time.sleep(0.005)

    def mark_behind(self) -> None:
        """It did not catch up in time (e.g. reconnecting to a restarted primary): searches read the
        primary until the next probe instead of waiting for it one by one."""
        with self._lock:
            self._lag, self._probed = max(self._lag or 0, self.max_lag_ms + 1), time.monotonic()

    def close(self) -> None:
        self.pool.close()
