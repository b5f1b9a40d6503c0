"""Fixtures: a fresh in-process app per test, and real gunicorn servers on free loopback ports."""
from __future__ import annotations

import json
import os
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


@pytest.fixture
def app(tmp_path):
    from service import create_app
    app = create_app({"data_dir": str(tmp_path / "data"), "background": False})
    yield app
    app.extensions["context_shutdown"]()


@pytest.fixture
def client(app):
    return app.test_client()


def make_unit(content="hello world", *, type="tool_output", source="test_v1_ci", timestamp=None, ttl=7 * 86_400, **extra):
    unit = {"type": type, "source": source, "timestamp": int(time.time()) if timestamp is None else timestamp,
            "ttl": ttl, "content": content}
    unit.update(extra)
    return unit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """A real gunicorn (``service:create_app()``) on a free loopback port."""

    def __init__(self, data_dir: Path, *, workers: int = 2, keys: dict | None = None, env: dict | None = None):
        self.data_dir = Path(data_dir)
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
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "gunicorn"), "-c", str(ROOT / "service" / "gunicorn_conf.py"), "service:create_app()"],
            cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited early:\n{self.log()}")
            try:
                # Workers may still be importing (jieba's dictionary) on a loaded machine: be patient.
                if requests.get(self.url + "/healthz", timeout=5).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"gunicorn did not become healthy:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
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
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if getattr(self, "_log", None):
            self._log.close()


@pytest.fixture
def live_server_factory(tmp_path):
    servers: list[LiveServer] = []

    def make(**kw) -> LiveServer:
        data_dir = kw.pop("data_dir", tmp_path / f"data{len(servers)}")
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
