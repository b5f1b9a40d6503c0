"""PostgreSQL's connections and failover (docs/design.md §5.2 "Where reads go"; docs/postgresql.md, "Failover"): as
service/store/sqlite/connections.py is for SQLite's files. Per process, three pools: the primary's (writes, strong
searches, the tables; a connection is checked as it leaves it), the search pool's (a default search's tail read:
one statement, generic plans, no check round trip; sent ahead and read later, ``send``) and the standby's (service/store/postgresql/standby.py). A
primary that fails is down for a second: requests then fail at once (503 + Retry-After), and one a second tries
it again.
"""
from __future__ import annotations

import logging
import re
import select
import threading
import time
import weakref

import psycopg
from psycopg import pq
from psycopg_pool import ConnectionPool, PoolTimeout

from ...config import redact
from ...errors import ApiError, StorageUnavailable
from .queries import bounded, sql
from .rows import content_rows
from .standby import Standby

log = logging.getLogger(__name__)

CATCH_UP_WAIT_MS = 50      # how long a read-index pass waits for the standby to replay the tenant's changes
# The search pool's connections: plans made once per statement and connection (prepared at first use and
# generic), where each search would otherwise plan its statement again over the units table's partitions.
# No JIT: a generic plan's estimate grows with the tables (at 1M units node_tail's passed jit_above_cost,
# and compiling it took 175 ms of every default search, whose execution takes 0.2 ms).
GENERIC_PLANS = {"prepare_threshold": 0}
# A default search's reads wait for a table lock (DDL on units) at most this, or less when
# CONTEXT_PG_LOCK_TIMEOUT_MS is lower, then 503 storage_unavailable (its one statement ran with no timeout:
# behind an ACCESS EXCLUSIVE lock on units it waited as long as the lock was held, holding the request's handler).
SEARCH_LOCK_WAIT_MS = 1000


def generic_plans(lock_ms: int, statement_ms: int):
    bound = bounded(min(lock_ms, SEARCH_LOCK_WAIT_MS) if lock_ms else SEARCH_LOCK_WAIT_MS, statement_ms)

    def configure(conn) -> None:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("SET jit = off")
        bound(conn)
    return configure


def _wait(pg, event: int) -> None:
    """Until the connection's socket is ready (``select.POLLIN``, ``POLLOUT``), the interpreter let go meanwhile."""
    poll = select.poll()
    poll.register(pg.socket, event)
    poll.poll()


class Sent:
    """A named statement sent on a search pool connection without waiting for its answer (libpq's asynchronous
    calls: ``Db.send``), so that the request's handler works meanwhile; ``rows()`` reads the answer and gives
    the connection back. The answer is usually there by then, read without waiting on the socket: a blocking
    read lets the worker's other request handlers take the interpreter, and under load taking it back cost
    more CPU than the statement (bench/README.md, "Ranking at engine cost"). None from ``rows()`` when anything
    went other than plainly (an error, a broken connection): the caller reads again the ordinary way
    (``read_fresh``), which reports what failed as every read does."""

    def __init__(self, db: "Db", conn):
        self.db, self.conn = db, conn

    def rows(self) -> list[list[bytes | None]] | None:
        pg, out, ok = self.conn.pgconn, None, True
        try:
            pg.consume_input()
            while pg.is_busy():
                _wait(pg, select.POLLIN)
                pg.consume_input()
            while (res := pg.get_result()) is not None:
                if res.status == pq.ExecStatus.TUPLES_OK and out is None:
                    out = [[res.get_value(r, c) for c in range(res.nfields)] for r in range(res.ntuples)]
                else:
                    ok = False
        except (psycopg.Error, OSError):
            ok = False
        finally:
            self.db.give_back(self.conn, ok)
        return out if ok else None


SQLSTATE = pq.DiagnosticField.SQLSTATE
PRIMARY_RETRY_S = 1.0      # after a failure, how long requests fail at once before one tries the primary again


_FORMS: dict[str, tuple[str, list[str], str]] = {}


def prepared_form(name: str) -> tuple[str, list[str], str]:
    """(the prepared statement's name, its parameters' names in order, its text with $n) of a named statement."""
    form = _FORMS.get(name)
    if form is None:
        names: list[str] = []

        def number(m):
            if m.group(1) not in names:
                names.append(m.group(1))
            return f"${names.index(m.group(1)) + 1}"
        text = re.sub(r"%\((\w+)\)s", number, sql(name))
        form = _FORMS[name] = (f"cms_{name}", names, text)
    return form


def connection_lost(e: psycopg.OperationalError) -> bool:
    """Whether an error means the primary is gone (no answer, the connection broken, the server shutting
    down), not that it answered "no": a statement or lock timeout, a deadlock or a serialization failure is a
    503 for that request alone. (A janitor's lock timeout on a busy partition once made its process fail
    every request fast, as if the primary were down.)"""
    state = e.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


class Db:
    """The database every node shares, as this process reaches it: ``fn(conn)`` in a primary transaction
    (``write``), on the primary (``read``, ``read_fresh``) or on the standby when it is fresh enough
    (``read_replica``); ``standby`` is None without ``CONTEXT_STORE_REPLICA``."""

    def __init__(self, config):
        self.config = config
        self._down_until = 0.0                   # the primary failed: fail fast until then (then one probe)
        self._probing = False
        self._down_lock = threading.Lock()
        kwargs = {"autocommit": True, "row_factory": content_rows, "connect_timeout": 5}
        try:
            psycopg.connect(config.store, **kwargs).close()     # a clear message at once, not a pool's retries
        except psycopg.Error as e:
            raise RuntimeError(f"PostgreSQL at {redact(config.store)} is not reachable: "
                               f"{redact(str(e)).strip()}") from None
        # A request waits at most 5 s for a connection (then 503 + Retry-After, never a hung worker). A
        # connection is checked as it leaves the pool (one empty round trip): after the primary restarts,
        # a broken one is replaced there instead of failing the request that drew it. (It used to fail
        # it: 503s until each idle connection had been drawn once, seen once the maintainer process
        # stopped drawing them in the workers.)
        self.primary = ConnectionPool(config.store, min_size=1, max_size=max(2, config.pg_pool_size),
                                      kwargs=kwargs, open=False, timeout=5.0, reconnect_timeout=3600,
                                      check=ConnectionPool.check_connection, name="primary",
                                      configure=bounded(config.pg_lock_timeout_ms, config.pg_statement_timeout_ms))
        self.primary.open(wait=True, timeout=15)
        self.search_pool = ConnectionPool(config.store, min_size=1, max_size=max(2, config.pg_pool_size),
                                          kwargs={**kwargs, **GENERIC_PLANS}, 
                                          configure=generic_plans(config.pg_lock_timeout_ms,
                                                                  config.pg_statement_timeout_ms),
                                          open=False, timeout=5.0, reconnect_timeout=3600, name="search")
        self.search_pool.open(wait=True, timeout=15)
        self.standby = Standby(config.store_replica, config) if config.store_replica else None
        # search pool connection -> the statements ``send`` prepared on it
        self._prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def write(self, fn, *args):
        """``fn(conn, *args)`` in one primary transaction; PostgreSQL down or failing is a 503."""
        return self._on_primary(True, fn, *args)

    def read(self, fn, *args):
        """``fn(conn, *args)`` on a primary connection, each statement on its own (no BEGIN/COMMIT round
        trips: reads that need one snapshot, such as search, open their own transaction)."""
        return self._on_primary(False, fn, *args)

    def _on_primary(self, transaction: bool, fn, *args):
        def attempt():
            with self.primary.connection() as conn:
                if not transaction:
                    return fn(conn, *args)
                with conn.transaction():
                    return fn(conn, *args)
        return self._guarded(attempt)

    def _guarded(self, attempt):
        """``attempt()`` against the primary: failing fast while it is known down, its failures as 503s,
        and whether it answered recorded (docs/postgresql.md, "Failover")."""
        self._not_known_down()
        failed = False
        try:
            return attempt()
        except ApiError:
            raise
        except psycopg.OperationalError as e:
            failed = connection_lost(e)
            raise StorageUnavailable(f"Storage is unavailable: {type(e).__name__}") from e
        except PoolTimeout as e:
            # every connection busy is load, not an outage: only a primary that refuses a new one is down
            failed = not self._primary_answers()
            raise StorageUnavailable("Storage is unavailable: no database connection") from e
        finally:
            self._failed() if failed else self._answered()

    # --- a primary that does not answer (docs/postgresql.md, "Failover") -------------------------------
    def primary_down(self) -> bool:
        """Whether the primary failed lately: requests then fail at once (503 + Retry-After) instead of
        waiting for a connection each, but for one at a time that tries again (once a second)."""
        return time.monotonic() < self._down_until or self._probing

    def _primary_answers(self) -> bool:
        try:
            psycopg.connect(self.config.store, connect_timeout=1).close()
            return True
        except psycopg.Error:
            return False

    def _not_known_down(self) -> None:
        with self._down_lock:
            if time.monotonic() < self._down_until or self._probing:
                raise StorageUnavailable("Storage is unavailable: the PostgreSQL primary does not answer")
            if self._down_until:
                self._probing = True        # the first request after the pause tries the primary again

    def _failed(self) -> None:
        with self._down_lock:
            if not self._down_until:
                log.warning("PostgreSQL primary %s does not answer: failing fast, retrying every %.0f s",
                            redact(self.config.store), PRIMARY_RETRY_S)
            self._down_until, self._probing = time.monotonic() + PRIMARY_RETRY_S, False

    def _answered(self) -> None:
        if self._down_until or self._probing:
            with self._down_lock:
                if self._down_until:
                    log.info("PostgreSQL primary %s answers again", redact(self.config.store))
                self._down_until, self._probing = 0.0, False

    def _snapshot(self, pool, fn, *args):
        """``fn(conn, *args)`` in one read-only REPEATABLE READ transaction on a pool's server."""
        with pool.connection(timeout=5.0) as conn, conn.transaction():
            conn.execute(sql("search_snapshot"))
            return fn(conn, *args)

    def read_fresh(self, fn, *args) -> tuple[object, str]:
        """``fn(conn, *args)`` on the primary, and "primary"; while the primary does not answer, on the
        standby, and "standby" (as fresh as the standby is). 503 when neither answers. No transaction is
        opened: ``fn`` reads what must agree in one statement (one snapshot, one round trip). On the
        primary it runs on the search pool (below)."""
        standby = self.standby
        if standby is None or not self.primary_down():
            try:
                return self._on_search_pool(fn, *args), "primary"
            except StorageUnavailable:
                if standby is None or not self.primary_down():
                    raise           # (busy, not down: the standby could answer with less than was acked)
        try:
            with standby.pool.connection(timeout=5.0) as conn:
                return fn(conn, *args), "standby"
        except (psycopg.OperationalError, PoolTimeout) as e:
            standby.mark_down()
            raise StorageUnavailable(f"Storage is unavailable: {type(e).__name__}") from e

    def send(self, name: str, args: dict) -> Sent | None:
        """The named statement sent on a search pool connection, its answer not waited for (``Sent``); None
        when it could not be sent at once (the primary known down, no free connection, a broken one): the
        caller then reads the ordinary way."""
        if self.primary_down():
            return None
        try:
            conn = self.search_pool.getconn(timeout=0.001)     # (a free one, or soon: else the ordinary read)
        except PoolTimeout:
            return None
        try:
            pg = conn.pgconn
            statement, names, text = prepared_form(name)
            prepared = self._prepared.setdefault(conn, set())
            if name not in prepared:
                res = pg.prepare(statement.encode(), text.encode())
                # (42P05: prepared already, before a failure made this process forget it)
                if res.status != pq.ExecStatus.COMMAND_OK and res.error_field(SQLSTATE) != b"42P05":
                    raise psycopg.OperationalError(res.get_error_message())
                prepared.add(name)
            pg.send_query_prepared(statement.encode(), [str(args[n]).encode() for n in names])
            while pg.flush():
                _wait(pg, select.POLLOUT)
            return Sent(self, conn)
        except (psycopg.Error, OSError):
            self.give_back(conn, False)
            return None

    def give_back(self, conn, ok: bool) -> None:
        """A connection ``send`` took back to the search pool; after a failure prepared again at its next
        ``send``, and closed unless idle (a statement still under way: the pool replaces it)."""
        if not ok:
            self._prepared.pop(conn, None)
            if conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
                conn.close()
        self.search_pool.putconn(conn)

    def _on_search_pool(self, fn, *args):
        """``fn(conn)`` on a connection of the search pool: no check round trip as a connection leaves it
        (a default search's whole read is one statement, so the check would double its round trips) and
        generic plans (the tail read is planned once per connection, not at every search). A connection
        broken since its last use (the primary restarted) is found by the statement itself: the read is
        tried again on the next, up to the pool's size, before the primary counts as down."""
        def attempt():
            for i in range(self.search_pool.max_size + 1):
                try:
                    with self.search_pool.connection() as conn:
                        return fn(conn, *args)
                except psycopg.OperationalError as e:
                    # (a timeout or any other answer is this read's, not a broken connection's: not tried again)
                    if not connection_lost(e) or i == self.search_pool.max_size or not self._primary_answers():
                        raise
        return self._guarded(attempt)

    @staticmethod
    def _snapshot_on(conn, fn, *args):
        with conn.transaction():
            conn.execute(sql("search_snapshot"))
            return fn(conn, *args)

    def read_replica(self, tenant: str, fn, *args):
        """``fn(conn, *args)`` in one snapshot of the standby once it has replayed every change of the tenant
        the primary has (what a node's read index is fed from: the heavy reads leave the primary), else of
        the primary; of the standby alone while the primary does not answer."""
        standby = self.standby
        if standby is not None:
            try:
                if self.primary_down() or (standby.usable() and standby.caught_up(
                        tenant, self.one("tenant_version", {"tenant": tenant})["version"], CATCH_UP_WAIT_MS)):
                    return self._snapshot(standby.pool, fn, *args)
            except (psycopg.OperationalError, PoolTimeout):
                standby.mark_down()
            except StorageUnavailable:
                if not self.primary_down():
                    raise
                return self._snapshot(standby.pool, fn, *args)
        return self._on_primary(False, lambda conn: self._snapshot_on(conn, fn, *args))

    def one(self, name: str, args: dict) -> dict | None:
        """The first row of a named statement, in its own transaction."""
        return self.read(lambda c: c.execute(sql(name), args).fetchone())

    def close(self) -> None:
        if self.standby is not None:
            self.standby.close()
        self.search_pool.close()
        self.primary.close()
