"""Shared test code: in-process apps (``make_app``, ``app``, ``client``, ``keyed``), ``drain``, shared assertions,
and real gunicorn servers on free loopback ports.

Test modules import helpers from here (or from a helper module without the ``test_`` prefix, such as
``mcp_support.py``), never from one another.
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


# In-process apps run no background threads: a test drains the indexer when it wants (``drain``).
TEST_CONFIG = {"background": False}


# --- storage backends (issue 18) -----------------------------------------------------------------
# A test module that sets BACKENDS = ("sqlite", "postgresql") runs its tests that use an app, a client
# or a live server on both; CONTEXT_TEST_BACKEND=postgresql runs every such test on PostgreSQL alone
# (to see what differs). One primary and standby serve the whole session; each test gets a schema.
FORCED_BACKEND = os.environ.get("CONTEXT_TEST_BACKEND")


def pytest_generate_tests(metafunc):
    if "backend" not in metafunc.fixturenames:
        return
    backends = [FORCED_BACKEND] if FORCED_BACKEND else list(getattr(metafunc.module, "BACKENDS", ()))
    for only in ("sqlite", "postgresql"):
        # sqlite_only: it reads SQLite's files (PostgreSQL's counterparts: tests/test_postgresql.py);
        # postgresql_only: it stops PostgreSQL's servers
        if metafunc.definition.get_closest_marker(f"{only}_only"):
            backends = [b for b in backends if b == only]
            if not backends and only == "postgresql":
                backends = [pytest.param(only, marks=pytest.mark.skip(reason="runs on PostgreSQL only"))]
    if backends:
        # module scope: a module's shared servers and apps (module fixtures) are made once per backend
        metafunc.parametrize("backend", backends, indirect=True, scope="module")


def pytest_addoption(parser):
    parser.addoption(
        "--beyond-make-test", action="store_true",
        help="with CONTEXT_TEST_BACKEND: only the tests that use a store and that `make test` does not "
             "already run on that backend (CI runs these on PostgreSQL after `make test`)")


def pytest_collection_modifyitems(config, items):
    if not (FORCED_BACKEND and config.getoption("--beyond-make-test")):
        return

    def already_run(item) -> bool:
        # storage-free tests run the same on either backend, sqlite_only ones on SQLite whatever is
        # forced, and BACKENDS modules ran on both in `make test`
        uses_store = "backend" in getattr(item, "fixturenames", ())
        return (not uses_store or item.get_closest_marker("sqlite_only") is not None
                or FORCED_BACKEND in getattr(item.module, "BACKENDS", ()))

    deselected = [item for item in items if already_run(item)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not already_run(item)]


@pytest.fixture(scope="session")
def backend(request) -> str:
    return getattr(request, "param", "sqlite")


def pg_cluster_module():
    """tools/pg_cluster.py: the script that starts a primary and a standby, for tests and by hand."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("pg_cluster", ROOT / "tools" / "pg_cluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def pg_cluster():
    """A PostgreSQL primary and streaming hot standby for the whole session (skips without PostgreSQL)."""
    tool = pg_cluster_module()
    if tool.pg_bin() is None:
        pytest.skip("PostgreSQL is not installed (.ci/setup.d/postgresql.sh installs it)")
    cluster = tool.Cluster(fsync=False).start()
    yield cluster
    cluster.stop()


_schemas = iter(range(1, 10**9))
_free_schemas: list[str] = []
# Emptied between tests (a reused schema skips the DDL, ~0.1 s a test): every table but ``tenants`` and
# ``index_marks``, whose versions must only grow (a standby that has not replayed the emptying yet would
# otherwise look caught up); their seqs start again at 0.
_EMPTIED = ("catalog", "units", "unit_terms", "pending", "tenant_days", "day_stats", "term_df", "live_events",
            "live_listeners", "tools")


@contextlib.contextmanager
def pg_schema(cluster):
    """(primary URL, standby URL) on a schema of their own: tests never see each other's data."""
    import psycopg
    if _free_schemas:
        name = _free_schemas.pop()
    else:
        name = f"t{os.getpid()}_{next(_schemas)}"
        with psycopg.connect(cluster.primary_url, autocommit=True) as c:
            c.execute(f"CREATE SCHEMA {name}")
    opts = f"-csearch_path%3D{name}%2Cpublic"
    yield cluster.url(cluster.primary_port, options=opts), cluster.url(cluster.standby_port, options=opts)
    try:
        with psycopg.connect(cluster.url(cluster.primary_port, options=opts), autocommit=True) as c:
            if c.execute("SELECT to_regclass('cms_meta') IS NOT NULL").fetchone()[0]:
                with c.transaction():
                    for table in _EMPTIED:
                        c.execute(f"DELETE FROM {table}")
                    # (version up too: a standby that has not replayed the emptying must not look caught up)
                    c.execute("UPDATE tenants SET last_seq = 0, version = version + 1")
        _free_schemas.append(name)
    except psycopg.Error:
        pass        # (a test stopped the primary and failed before starting it again: not reused)


@pytest.fixture
def pg_urls(pg_cluster):
    with pg_schema(pg_cluster) as urls:
        yield urls


def store_env(store_config: dict) -> dict:
    """A store configuration as a live server's CONTEXT_* environment."""
    return {"CONTEXT_" + k.upper(): v for k, v in store_config.items()}


@pytest.fixture(scope="module")
def module_store_config(request, backend) -> dict:
    """store_config for a module's shared apps and servers (module fixtures)."""
    if backend == "sqlite":
        yield {}
        return
    with pg_schema(request.getfixturevalue("pg_cluster")) as (primary, standby):
        yield {"store": primary, "store_replica": standby}


@pytest.fixture
def store_config(request, backend) -> dict:
    """Configuration of the storage backend under test (empty for SQLite)."""
    if backend == "sqlite":
        return {}
    primary, standby = request.getfixturevalue("pg_urls")
    return {"store": primary, "store_replica": standby}


def new_app(data_dir, **config):
    """``create_app`` with exactly these settings over the defaults: the developer's ``CONTEXT_*``
    environment never reaches it (``Config.from_mapping``). The caller shuts it down (``close_app``)."""
    from service import create_app
    return create_app({**TEST_CONFIG, "data_dir": str(data_dir), **config})


def close_app(app) -> None:
    """Stop the app's maintenance and close its store (idempotent)."""
    from service.state import app_state
    app_state(app).shutdown()


@pytest.fixture
def make_app(tmp_path, store_config):
    """``make_app(**config)``: a fresh app on ``tmp_path / "data"`` (or ``data_dir=...``), shut down after
    the test. Calls with the same ``data_dir`` share it, like a restart or a second worker (on
    PostgreSQL every app of a test shares the test's schema)."""
    apps = []

    def make(**config):
        app = new_app(config.pop("data_dir", tmp_path / "data"), **{**store_config, **config})
        apps.append(app)
        return app

    yield make
    for app in reversed(apps):
        close_app(app)


class Clock:
    """This process's clocks moved forward on demand, so expiry is tested without waiting: ``time.time``
    (what expiry is measured by) and ``time.monotonic`` (debounces, such as the read index's commits)
    read the real clock plus ``offset`` and keep ticking. A live gunicorn (another process) never sees
    it, nor code that took ``from time import monotonic`` (threading's waits)."""

    def __init__(self, monkeypatch):
        self.offset = 0.0
        for name in ("time", "monotonic"):
            real = getattr(time, name)
            monkeypatch.setattr(time, name, lambda real=real: real() + self.offset)

    def advance(self, seconds: float) -> None:
        """As if ``seconds`` had passed (``time.sleep(seconds)`` without the wait); never backwards."""
        self.offset += max(0.0, seconds)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    """The fake clock (``Clock``). Name it first among a test's arguments: its apps are then shut down
    before the real clock comes back."""
    return Clock(monkeypatch)


@pytest.fixture
def keyed(request, make_app, tmp_path):
    """A test client of an app that accepts only the test module's ``KEYS`` ({key: (tenant, scopes)}, as
    LiveServer takes them), given inline (CONTEXT_API_KEYS' ``key:tenant:scope+scope;...``). A module
    with ``KEYS_FILE = True`` has them read from a keys file instead, stored as `context-mode keys add`
    stores them (SHA-256 only), except those in its ``PLAIN_KEYS`` (in the clear, as for development)."""
    keys: dict = request.module.KEYS
    if not getattr(request.module, "KEYS_FILE", False):
        return make_app(api_keys=";".join(f"{k}:{t}:{'+'.join(s)}" for k, (t, s) in keys.items())).test_client()
    from service.auth import hash_key
    plain = getattr(request.module, "PLAIN_KEYS", ())
    path = tmp_path / "keyed.json"
    path.write_text(json.dumps({"keys": [
        {**({"key": k} if k in plain else {"key_sha256": hash_key(k)}), "tenant": t, "scopes": list(s)}
        for k, (t, s) in keys.items()]}))
    return make_app(api_keys_file=str(path)).test_client()


@pytest.fixture
def app(make_app):
    return make_app()


@pytest.fixture
def client(app):
    return app.test_client()


def make_unit(content="hello world", *, type="tool_output", source="test_v1_ci", timestamp=None, ttl=7 * 86_400, **extra):
    unit = {"type": type, "source": source, "timestamp": int(time.time()) if timestamp is None else timestamp,
            "ttl": ttl, "content": content}
    unit.update(extra)
    return unit


def lettered_timestamp(content: str, source: str = "test_v1_ci") -> int:
    """A timestamp at or just before now for which the unit's CID has a letter: a CID of digits alone (about
    1 in 280) is its own upper-case spelling, which a test of upper-case CIDs cannot use."""
    from service.units import compute_cid
    now = int(time.time())
    return next(t for t in range(now, now - 1000, -1) if not compute_cid(content, t, source).isdigit())


def tied_contents(n: int, filler: int = 0) -> list[str]:
    """n contents that score exactly alike for the query "heron" (one occurrence, 3 + ``filler`` tokens):
    each ends in its own letters-only word (one token, nothing for the tokenizer to split off)."""
    def word(i: int) -> str:
        out = ""
        for _ in range(3):
            i, r = divmod(i, 26)
            out += "abcdefghijklmnopqrstuvwxyz"[r]
        return "q" + out
    pad = "".join(f" {word(20_000 + j)}" for j in range(filler))
    return [f"heron note{pad} {word(i)}" for i in range(n)]


def drain(app) -> None:
    """Run the app's maintenance until nothing is left to index (and the read index has it)."""
    from service.state import app_state
    while app_state(app).maintenance.run_once():
        pass


def replayed(app, timeout: float = 30.0) -> bool:
    """On PostgreSQL with a standby: wait until the standby has replayed everything the primary wrote
    so far (default searches then read it); True. False on SQLite (nothing to wait for)."""
    from service.state import app_state
    store = app_state(app).store
    standby = getattr(getattr(store, "searcher", None), "standby", None)
    if getattr(store, "backend", "sqlite") == "sqlite" or standby is None:
        return False
    lsn = store.db.read(lambda c: c.execute("SELECT pg_current_wal_lsn() AS l").fetchone()["l"])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with standby.pool.connection() as c:
            if c.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn AS ok", (lsn,)).fetchone()["ok"]:
                return True
        time.sleep(0.01)
    raise AssertionError("the standby did not replay the primary's writes in time")


def assert_error(rv, status, code, field=None):
    """A Flask test response carrying docs/design.md §4's error body."""
    assert rv.status_code == status, rv.get_data(as_text=True)
    body = rv.get_json()
    assert set(body) <= {"error", "code", "field"}
    assert isinstance(body["error"], str) and body["error"]
    assert body["code"] == code
    if field is not None:
        assert body["field"] == field


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Stop a process started with ``start_new_session``: ``sig`` to its whole group, then SIGKILL if it
    has not ended within ``timeout``."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 60, log=lambda: "") -> None:
    """Until ``url``/healthz answers 200; RuntimeError (with ``log()``) if ``proc`` exits first or
    ``timeout`` passes. Workers may still be importing (jieba's dictionary) on a loaded machine: patient."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited early:\n{log()}")
        try:
            if requests.get(url + "/healthz", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not serve /healthz within {timeout:.0f} s:\n{log()}")
        time.sleep(0.2)


class LiveServer:
    """A real gunicorn (``service:create_app()``) on a free loopback port."""

    def __init__(self, data_dir: Path, *, workers: int = 2, keys: dict | None = None, env: dict | None = None,
                 conf: Path | None = None, nofile: int | None = None):
        self.data_dir = Path(data_dir)
        self.nofile = nofile            # RLIMIT_NOFILE of the server, soft and hard (`ulimit -n`)
        self.conf = conf or ROOT / "service" / "gunicorn_conf.py"     # a test's own settings may extend it
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        self.env = dict(os.environ)
        self.env.update({"CONTEXT_DATA_DIR": str(self.data_dir), "CONTEXT_BIND": f"127.0.0.1:{self.port}",
                         "CONTEXT_WORKERS": str(workers), "CONTEXT_JANITOR_INTERVAL_S": "2",
                         "CONTEXT_REPLICA_DEBOUNCE_MS": "200", "CONTEXT_PUBLIC_URL": "http://context-mode.test:5000"})
        self.env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self.keys = keys
        if keys:
            keys_file = self.data_dir.parent / f"keys-{self.port}.json"
            keys_file.write_text(json.dumps({"keys": [{"key": k, "tenant": t, "scopes": list(s)}
                                                     for k, (t, s) in keys.items()]}))
            self.env["CONTEXT_API_KEYS_FILE"] = str(keys_file)
        self.env.update(env or {})
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"gunicorn-{self.port}.log"

    def start(self, timeout: float = 60.0) -> "LiveServer":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        def limit():
            if self.nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "gunicorn"), "-c", str(self.conf), "service:create_app()"],
            cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=limit)
        wait_healthy(self.proc, self.url, timeout, self.log)
        return self

    def log(self, tail: int | None = 5000) -> str:
        """The server's log: its last ``tail`` characters (for a failure message), or all of it with ``None``, which
        is what counting lines needs (a tail window slides, so a count over it can stay put as lines are added)."""
        try:
            text = self.log_path.read_text(errors="replace")
            return text if tail is None else text[-tail:]
        except FileNotFoundError:
            return ""

    def headers(self, key: str | None = None) -> dict:
        return {"Authorization": f"Bearer {key}"} if key else {}

    def kill(self) -> None:
        """SIGKILL master and workers at once (a crash, not a shutdown)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)
        if getattr(self, "_log", None):
            self._log.close()


@pytest.fixture
def live_server_factory(tmp_path, store_config):
    servers: list[LiveServer] = []
    env = store_env(store_config)

    def make(**kw) -> LiveServer:
        data_dir = kw.pop("data_dir", tmp_path / f"data{len(servers)}")
        kw["env"] = {**env, **(kw.get("env") or {})}
        server = LiveServer(data_dir, **kw)
        servers.append(server)   # before start(): a server that fails to boot is still stopped
        return server.start()

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def live_server(live_server_factory):
    """gunicorn with 2 workers and no keys (single default tenant)."""
    return live_server_factory()
